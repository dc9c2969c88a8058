"""Start and stop the real vLLM with the start flags a dialect needs, and wait until it answers /health.

vLLM serves `/inference/v1/generate` only with `--enable-scale-out`, and `tool_choice` (auto, required, named)
only with `--enable-auto-tool-choice --tool-call-parser hermes`; `StartFlags` names these, so a test or the
contract check asks for an engine by what it must serve. Start-up takes one to three minutes on two cores,
so callers keep one server up across many requests. The server's output goes to a log file beside the build
(its last lines are in the error when it dies). SIGTERM to the API server stops its engine and worker processes;
the whole process group is killed if it has not stopped in time.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from tito_rl.recorder.real_engine.paths import (
    BASE_FLAGS,
    SERVED_MODEL_NAME,
    SERVER_ENV,
    ReadyEngine,
    read_ready,
    real_vllm_home,
)

SCALE_OUT_FLAGS = ("--enable-scale-out",)  # /inference/v1/generate, /render
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")  # tool_choice auto/required/named
REASONING_FLAGS = ("--reasoning-parser", "qwen3")
START_TIMEOUT_S = 420.0


class RealEngineError(RuntimeError):
    """The real engine is not built, or did not start: the message is one line a person can act on."""


@dataclass(frozen=True)
class StartFlags:
    """Which optional routes and parsers the server is started with."""

    scale_out: bool = True
    tools: bool = True
    reasoning: bool = False

    def arguments(self) -> list[str]:
        flags: list[str] = []
        if self.scale_out:
            flags += SCALE_OUT_FLAGS
        if self.tools:
            flags += TOOL_FLAGS
        if self.reasoning:
            flags += REASONING_FLAGS
        return flags

    def label(self) -> str:
        names = [
            name
            for name, on in (("scale-out", self.scale_out), ("tools", self.tools), ("reasoning", self.reasoning))
            if on
        ]
        return "+".join(names) or "bare"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def server_command(ready: ReadyEngine, port: int, flags: StartFlags = StartFlags()) -> list[str]:
    """The argv that serves the tiny model on 127.0.0.1:`port` (`vllm serve` needs the `vllm` distribution)."""
    return [
        ready.python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        ready.model,
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *BASE_FLAGS,
        *flags.arguments(),
    ]


def shell_start_command(python: str, model: str, port: int = 8000, flags: StartFlags = StartFlags()) -> str:
    """The same start as one shell line with its environment (READY's `start_command`)."""
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *BASE_FLAGS,
        *flags.arguments(),
    ]
    env = " ".join(f"{key}={value}" for key, value in sorted(SERVER_ENV.items()))
    return f"env {env} {shlex.join(argv)}"


def require_ready(home: Path | None = None) -> ReadyEngine:
    ready = read_ready(home)
    if ready is None:
        where = home or real_vllm_home()
        raise RealEngineError(f"the real vLLM is not built in {where}: run `make real-engine`")
    return ready


class EngineProcess:
    """One engine server process on a loopback port: started in its own session, ready when `/health` answers 200,
    stopped with SIGTERM and then its whole process group killed. Subclasses say what to run (`command`, `env`)."""

    engine_name = "engine"

    def __init__(self, port: int | None, log_path: Path, start_timeout_s: float) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def start(self) -> Self:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RealEngineError(
                    f"the real {self.engine_name} exited with {self.process.returncode} while starting: "
                    f"{self.last_log_line()} (log: {self.log_path})"
                )
            if health_ok(self.url):
                return
            time.sleep(1.0)
        raise RealEngineError(
            f"the real {self.engine_name} did not answer /health within {self.start_timeout_s:.0f} s "
            f"(log: {self.log_path})"
        )

    def last_log_line(self) -> str:
        try:
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log"
        return lines[-1].strip() if lines else "empty log"

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_s)
        # The engine's other processes are children in the same session: none may outlive the server.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


class RealVllmServer(EngineProcess):
    """One running real vLLM: `with RealVllmServer(StartFlags(...)) as server: server.url`."""

    engine_name = "vLLM"

    def __init__(
        self,
        flags: StartFlags = StartFlags(),
        port: int | None = None,
        home: Path | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.flags = flags
        self.home = home or real_vllm_home()
        self.ready = require_ready(self.home)
        port = port or free_port()
        super().__init__(port, self.home / "logs" / f"server-{self.flags.label()}-{port}.log", start_timeout_s)

    def command(self) -> list[str]:
        return server_command(self.ready, self.port, self.flags)

    def env(self) -> dict[str, str]:
        return {**os.environ, **SERVER_ENV, **self.ready.env}


def health_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as reply:
            return int(reply.status) == 200
    except (urllib.error.URLError, OSError):
        return False
