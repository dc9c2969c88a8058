"""The real engines for tests marked `real_engine`: one server at a time, kept up across tests that ask for the same.

Start-up takes about a minute (SGLang) to three (vLLM) on two cores and each server holds 3 to 4 GB, so the session
keeps the last server it started and restarts only when a test asks for another engine, model or start flags
(`make test-real-engine` runs the marked tests with `-n 0`, grouped by module). Where an engine is not built, the
test skips saying so in one line.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tito_rl.recorder.real_engine import sglang_paths
from tito_rl.recorder.real_engine.paths import read_ready, real_vllm_home
from tito_rl.recorder.real_engine.server import EngineProcess, RealEngineError, RealVllmServer, StartFlags
from tito_rl.recorder.real_engine.sglang_paths import DENSE_START, SglangStart
from tito_rl.recorder.real_engine.sglang_server import RealSglangServer

REAL_ENGINE_ENV = "TITO_REAL_ENGINE"  # "1": run the tests marked real_engine (make test-real-engine sets it)


class RealEngines:
    """The session's one running server, swapped when a test asks for another."""

    def __init__(self) -> None:
        self.current: EngineProcess | None = None
        self.current_key: StartFlags | SglangStart | None = None
        self.failed: dict[StartFlags | SglangStart, str] = {}

    def get(self, flags: StartFlags) -> RealVllmServer:
        """The real vLLM started with `flags`."""
        server = self._running(flags)
        if isinstance(server, RealVllmServer):
            return server
        if read_ready() is None:
            pytest.skip(f"the real vLLM is not built in {real_vllm_home()}: run `make real-engine`")
        started = self._start(flags, lambda: RealVllmServer(flags))
        assert isinstance(started, RealVllmServer)
        return started

    def sglang(self, start: SglangStart = DENSE_START) -> RealSglangServer:
        """The real SGLang serving the model (and seed) `start` names."""
        server = self._running(start)
        if isinstance(server, RealSglangServer):
            return server
        if sglang_paths.read_ready() is None:
            pytest.skip(f"the real SGLang is not built in {sglang_paths.real_sglang_home()}: run `make real-sglang`")
        started = self._start(start, lambda: RealSglangServer(start))
        assert isinstance(started, RealSglangServer)
        return started

    def _running(self, key: StartFlags | SglangStart) -> EngineProcess | None:
        if self.current is not None and self.current_key == key and self.current.running():
            return self.current
        self.close()
        if key in self.failed:
            pytest.skip(self.failed[key])
        return None

    def _start(self, key: StartFlags | SglangStart, make: Callable[[], EngineProcess]) -> EngineProcess:
        try:
            self.current = make().start()
        except RealEngineError as error:
            self.failed[key] = str(error)
            pytest.fail(str(error))
        self.current_key = key
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
            self.current_key = None
