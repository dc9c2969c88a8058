"""The real vLLM for tests marked `real_engine`: one server at a time, kept up across tests with the same flags.

Start-up takes one to three minutes on two cores and each server holds about 3.6 GB, so the session keeps the
last server it started and restarts only when a test asks for other start flags (`make test-real-engine` runs
the marked tests with `-n 0`, grouped by module). Where the engine is not built, the test skips saying so.
"""

from __future__ import annotations

import pytest

from tito_rl.recorder.real_engine.paths import read_ready, real_vllm_home
from tito_rl.recorder.real_engine.server import RealEngineError, RealVllmServer, StartFlags

REAL_ENGINE_ENV = "TITO_REAL_ENGINE"  # "1": run the tests marked real_engine (make test-real-engine sets it)


class RealEngines:
    """The session's one running server, swapped when the flags change."""

    def __init__(self) -> None:
        self.current: RealVllmServer | None = None
        self.failed: dict[StartFlags, str] = {}

    def get(self, flags: StartFlags) -> RealVllmServer:
        if (
            self.current is not None
            and self.current.flags == flags
            and self.current.process is not None
            and self.current.process.poll() is None
        ):
            return self.current
        self.close()
        if flags in self.failed:
            pytest.skip(self.failed[flags])
        if read_ready() is None:
            pytest.skip(f"the real vLLM is not built in {real_vllm_home()}: run `make real-engine`")
        try:
            self.current = RealVllmServer(flags).start()
        except RealEngineError as error:
            self.failed[flags] = str(error)
            pytest.fail(str(error))
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
