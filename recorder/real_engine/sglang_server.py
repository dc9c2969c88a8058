"""Start and stop the real SGLang on a tiny model, and wait until it answers /health.

`SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=<stand-in> python -m sglang.launch_server --device cpu ...` (sglang_paths.py has
the flags). Start-up takes 40 to 70 s on two cores, most of it the tokenizer's set-up, in three processes (HTTP
server, scheduler, detokenizer; about 3 GB): callers keep one server up across many requests. Its output goes to a
log file beside the build, whose last line is in the error when it dies.
"""

from __future__ import annotations

import os
from pathlib import Path

from tito_rl.recorder.real_engine.server import START_TIMEOUT_S, EngineProcess, RealEngineError, free_port
from tito_rl.recorder.real_engine.sglang_paths import (
    DENSE_START,
    ReadySglang,
    SglangStart,
    read_ready,
    real_sglang_home,
    server_command,
    server_env,
)


def require_ready(home: Path | None = None) -> ReadySglang:
    ready = read_ready(home)
    if ready is None:
        raise RealEngineError(f"the real SGLang is not built in {home or real_sglang_home()}: run `make real-sglang`")
    return ready


class RealSglangServer(EngineProcess):
    """One running real SGLang: `with RealSglangServer(SglangStart(moe=True)) as server: server.url`."""

    engine_name = "SGLang"

    def __init__(
        self,
        start: SglangStart = DENSE_START,
        port: int | None = None,
        home: Path | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.start_args = start
        self.home = home or real_sglang_home()
        self.ready = require_ready(self.home)
        port = port or free_port()
        super().__init__(port, self.home / "logs" / f"server-{start.label()}-{port}.log", start_timeout_s)

    def command(self) -> list[str]:
        return server_command(self.ready, self.port, self.start_args)

    def env(self) -> dict[str, str]:
        return {**os.environ, **server_env(self.ready)}
