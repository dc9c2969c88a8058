"""Where the real SGLang lives, what it is built from, how it starts, and the READY file other tools read.

Everything sits under one folder outside the repository (`TITO_REAL_SGLANG_HOME`, default ~/.cache/tito/real-sglang):
the venv, the two tiny models, server logs, a lock for concurrent builds, and READY, written last. SGLang's own code is
PyPI's, unchanged; its compiled CPU ops come from tito's stand-in (`sgl_kernel_standin/`, on the server's PYTHONPATH).
The facts behind each flag: docs/real-engine.md, "A real SGLang".
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tito_rl.recorder.real_engine.paths import MODEL_SEED

HOME_ENV = "TITO_REAL_SGLANG_HOME"
SGLANG_VERSION = "0.5.23"
PYTHON_VERSION = (3, 11)  # sglang 0.5.23 ships one wheel, for CPython 3.11
# SGLang's own pins; PyPI's torch is a CUDA build that also runs on a CPU. Installed with their dependencies (torch
# needs its CUDA runtime libraries to import); sglang and the rest go in --no-deps, at the pins of REQUIREMENTS.
TORCH_PINS = ("torch==2.14.1", "torchvision==0.29.1")
REQUIREMENTS = Path(__file__).with_name("sglang-requirements.txt")
STANDIN = Path(__file__).with_name("sgl_kernel_standin")  # holds sgl_kernel.py: the folder goes on PYTHONPATH
DENSE = "dense"
MOE = "moe"
MODEL_KINDS = (DENSE, MOE)
SERVED_NAMES = {DENSE: "tiny-qwen3", MOE: "tiny-qwen3-moe"}  # not the folders' paths: answers read alike anywhere

# SGLang picks its CPU platform only with SGLANG_USE_CPU_ENGINE; one OpenMP thread keeps it off the other cores.
SERVER_ENV = {
    "SGLANG_USE_CPU_ENGINE": "1",
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
BASE_FLAGS = (
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",  # needs no compiled kernel
    "--sampling-backend",
    "pytorch",
    "--dtype",
    "bfloat16",
    "--max-total-tokens",
    "8192",
    "--mem-fraction-static",
    "0.05",
)
ROUTED_EXPERTS_FLAG = "--enable-return-routed-experts"
PARSER_FLAGS = ("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25")


def real_sglang_home() -> Path:
    """The build's folder: `TITO_REAL_SGLANG_HOME`, else ~/.cache/tito/real-sglang."""
    configured = os.environ.get(HOME_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tito" / "real-sglang"


def venv_dir(home: Path) -> Path:
    return home / f"venv-sglang-{SGLANG_VERSION}"


def venv_python(home: Path) -> Path:
    return venv_dir(home) / "bin" / "python"


def model_dir(home: Path, kind: str, seed: int = MODEL_SEED) -> Path:
    return home / (f"tiny-qwen3-seed{seed}" if kind == DENSE else f"tiny-qwen3-moe-seed{seed}")


def ready_file(home: Path) -> Path:
    return home / "READY"


def requirement_pins(path: Path = REQUIREMENTS) -> list[str]:
    """The `name==version` lines of a requirements file, comments and blank lines left out."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


@dataclass(frozen=True)
class SglangStart:
    """Which model a server serves and how: the MoE one always returns its expert routes when asked."""

    moe: bool = False
    random_seed: int | None = None  # --random-seed: the same request sequence then repeats across starts
    parsers: bool = False  # Qwen3's reasoning and tool-call parsers, as the engine contract's SGLang mode has them

    @property
    def kind(self) -> str:
        return MOE if self.moe else DENSE

    def label(self) -> str:
        seed = f"-seed{self.random_seed}" if self.random_seed is not None else ""
        return self.kind + seed + ("-parsers" if self.parsers else "")


DENSE_START = SglangStart()


@dataclass(frozen=True)
class ReadySglang:
    """What READY says: enough to start either model from any tool, tito's or not."""

    python: str
    standin: str  # the folder holding sgl_kernel.py when it was built (start_command's PYTHONPATH)
    models: dict[str, str]  # kind -> folder
    model_sha256: dict[str, str]
    sglang_version: str
    env: dict[str, str] = field(default_factory=dict)
    start_command: str = ""  # a shell line: the dense model on port 30000

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def read_ready(home: Path | None = None) -> ReadySglang | None:
    """The built engine, or None where READY is missing, unreadable or names files that are gone."""
    path = ready_file(home or real_sglang_home())
    try:
        ready = ReadySglang(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    if not Path(ready.python).is_file() or sorted(ready.models) != sorted(MODEL_KINDS):
        return None
    if not all((Path(folder) / "config.json").is_file() for folder in ready.models.values()):
        return None
    return ready


def server_env(ready: ReadySglang) -> dict[str, str]:
    """The server's environment on top of the caller's: this checkout's stand-in alone on PYTHONPATH (not the one
    READY names: the build may have run from another checkout)."""
    return {**SERVER_ENV, **ready.env, "PYTHONPATH": str(STANDIN)}


def server_command(ready: ReadySglang, port: int, start: SglangStart = SglangStart()) -> list[str]:
    """The argv that serves one tiny model on 127.0.0.1:`port`."""
    argv = [
        ready.python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        ready.models[start.kind],
        "--served-model-name",
        SERVED_NAMES[start.kind],
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *BASE_FLAGS,
    ]
    if start.random_seed is not None:
        argv += ["--random-seed", str(start.random_seed)]
    if start.parsers:
        argv += PARSER_FLAGS
    if start.moe:
        argv.append(ROUTED_EXPERTS_FLAG)
    return argv


def shell_start_command(ready: ReadySglang, port: int = 30000, start: SglangStart = SglangStart()) -> str:
    """The same start as one shell line with its environment (READY's `start_command`)."""
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(server_env(ready).items()))
    return f"env {env} {shlex.join(server_command(ready, port, start))}"
