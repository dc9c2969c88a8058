"""Build the real SGLang once: a venv with PyPI's SGLang, the two tiny models, then READY.

`python -m tito_rl.recorder.real_engine.sglang_build` (`make real-sglang`). From PyPI only (about 6.4 GB, most of it
torch's CUDA libraries, which import on a CPU): torch and torchvision at SGLang's pins with their dependencies, then
`sglang` and its runtime dependencies `--no-deps` at the pins of `sglang-requirements.txt`, leaving out every GPU
package SGLang declares (flashinfer, sglang-kernel, flash-attn, cutlass, deep-gemm, ...). The compiled `sgl_kernel`
CPU ops are tito's stand-in, put on the server's PYTHONPATH at start. The models are built by the venv's Python
(`tiny_qwen3.py`, dense and MoE) from a fixed seed and the embedded tokenizer. Every step is skipped when its result
is there (the venv's stamp names the pins it was made with, so a changed pin reinstalls), and a lock keeps two builds
from writing into one venv.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from tito_rl.recorder.real_engine.build import BuildError, build_lock, run_step, weights_digest
from tito_rl.recorder.real_engine.paths import MODEL_SEED
from tito_rl.recorder.real_engine.sglang_paths import (
    MODEL_KINDS,
    PYTHON_VERSION,
    REQUIREMENTS,
    SERVER_ENV,
    SGLANG_VERSION,
    STANDIN,
    TORCH_PINS,
    ReadySglang,
    SglangStart,
    model_dir,
    read_ready,
    ready_file,
    real_sglang_home,
    requirement_pins,
    shell_start_command,
    venv_dir,
    venv_python,
)
from tito_rl.trajectory.tokens.tokenizer import default_tokenizer_dir

INSTALLED_STAMP = ".tito-sglang-installed"
MODEL_STAMP = ".tito-model-complete"
# What the venv must import for the server to start: SGLang's CPU path with the stand-in in place.
IMPORT_CHECK = "import sgl_kernel, sglang.srt.entrypoints.http_server, sglang.srt.mem_cache.allocation"


def base_python() -> str:
    """A CPython 3.11 to make the venv with: this one, else `python3.11` on PATH."""
    if sys.version_info[:2] == PYTHON_VERSION:
        return sys.executable
    found = shutil.which("python3.11")
    if found is None:
        raise BuildError("sglang 0.5.23 needs CPython 3.11 (its only wheel): no python3.11 on PATH")
    return found


def install_lines() -> list[str]:
    """What the venv is made of, in order: its stamp, so that a changed pin reinstalls."""
    return [*TORCH_PINS, f"sglang=={SGLANG_VERSION}", *requirement_pins(REQUIREMENTS)]


def pip(python: Path, *args: str) -> list[str]:
    return [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]


def ensure_venv(home: Path, quiet: bool) -> Path:
    venv = venv_dir(home)
    python = venv_python(home)
    stamp = venv / INSTALLED_STAMP
    wanted = "\n".join(install_lines()) + "\n"
    if python.is_file() and stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted:
        return python
    if not python.is_file():
        run_step(f"creating the venv {venv}", [base_python(), "-m", "venv", str(venv)], quiet)
    # pip skips what is already installed at its pin, so an interrupted build resumes where it stopped.
    run_step(f"installing {' '.join(TORCH_PINS)} (about 6 GB with CUDA's libraries)", pip(python, *TORCH_PINS), quiet)
    run_step(
        f"installing sglang=={SGLANG_VERSION} without its dependencies",
        pip(python, "--no-deps", f"sglang=={SGLANG_VERSION}"),
        quiet,
    )
    run_step(
        f"installing SGLang's runtime dependencies without GPU packages ({REQUIREMENTS.name})",
        pip(python, "--no-deps", "-r", str(REQUIREMENTS)),
        quiet,
    )
    check_imports(python, quiet)
    stamp.write_text(wanted, encoding="utf-8")
    return python


def check_imports(python: Path, quiet: bool) -> None:
    print("real SGLang: checking that SGLang's server imports on the CPU with the stand-in", flush=True)
    env = {**os.environ, **SERVER_ENV, "PYTHONPATH": str(STANDIN)}
    result = subprocess.run([str(python), "-c", IMPORT_CHECK], env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        raise BuildError(f"SGLang does not import: {lines[-1] if lines else f'exit {result.returncode}'}")


def ensure_model(home: Path, python: Path, kind: str, seed: int, quiet: bool) -> Path:
    folder = model_dir(home, kind, seed)
    if (folder / MODEL_STAMP).is_file():
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    script = Path(__file__).with_name("tiny_qwen3.py")
    run_step(
        f"building the tiny Qwen3 ({kind}, seed {seed}) in {folder}",
        [str(python), str(script), str(folder), str(default_tokenizer_dir()), str(seed), kind],
        quiet,
    )
    (folder / MODEL_STAMP).write_text(f"seed {seed} {kind}\n", encoding="utf-8")
    return folder


def build(home: Path | None = None, seed: int = MODEL_SEED, quiet: bool = False) -> ReadySglang:
    """Build what is missing and write READY; return what READY says."""
    home = home or real_sglang_home()
    with build_lock(home):
        existing = read_ready(home)
        wanted = {kind: str(model_dir(home, kind, seed)) for kind in MODEL_KINDS}
        stamp = venv_dir(home) / INSTALLED_STAMP
        installed = stamp.is_file() and stamp.read_text(encoding="utf-8") == "\n".join(install_lines()) + "\n"
        if existing is not None and existing.models == wanted and installed:
            return existing
        python = ensure_venv(home, quiet)
        models = {kind: ensure_model(home, python, kind, seed, quiet) for kind in MODEL_KINDS}
        ready = ReadySglang(
            python=str(python),
            standin=str(STANDIN),
            models={kind: str(folder) for kind, folder in models.items()},
            model_sha256={kind: weights_digest(folder) for kind, folder in models.items()},
            sglang_version=SGLANG_VERSION,
            env=dict(SERVER_ENV),
        )
        ready = replace(ready, start_command=shell_start_command(ready, 30000, SglangStart()))
        ready_file(home).write_text(ready.to_json(), encoding="utf-8")
        return ready


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.recorder.real_engine.sglang_build",
        description="Build the real SGLang (PyPI's, with tito's sgl_kernel stand-in) and two tiny Qwen3 models once.",
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="where to build (default: $TITO_REAL_SGLANG_HOME, else ~/.cache/tito/real-sglang)",
    )
    parser.add_argument("--seed", type=int, default=MODEL_SEED, help=f"the models' seed (default {MODEL_SEED})")
    parser.add_argument("--quiet", action="store_true", help="hide pip's and the model builds' output")
    args = parser.parse_args(argv)
    try:
        ready = build(args.home, args.seed, args.quiet)
    except BuildError as error:
        print(f"real SGLang: {error}", file=sys.stderr)
        return 1
    home = args.home or real_sglang_home()
    print(f"real SGLang: ready ({ready_file(home)})")
    print(f"  python: {ready.python}")
    for kind, folder in sorted(ready.models.items()):
        print(f"  {kind + ':':7} {folder}")
    print(f"  start:  {ready.start_command}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
