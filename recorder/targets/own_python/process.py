"""A gateway in a process (and often a Python) of its own: started with a command, ready when a URL answers,
its stderr kept for a one-line failure, stopped with SIGTERM then SIGKILL.

Used by the drivers whose gateway cannot share tito's interpreter (verifiers' interception server; a gateway
profile's `start.command`). Nothing of the process outlives `stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from typing import IO

import aiohttp

from tito_rl.recorder.targets.base import TargetError

STOP_TIMEOUT_S = 10.0
POLL_S = 0.1


def _die_with_parent() -> None:
    """In the child, before its program runs (Linux): SIGTERM when the thread that started it ends, so a gateway
    never outlives a tito that was killed outright (SIGKILL gives tito no chance to stop it)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on `host` now, for a gateway that takes its port on the command line."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class GatewayProcess:
    """One started gateway process; `name` says whose in errors (`target 'verifiers': ...`)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: asyncio.subprocess.Process | None = None
        self.log: IO[bytes] | None = None

    async def start(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        port_line: bool = False,
        timeout_s: float = 120.0,
    ) -> int | None:
        """Start `argv`; with `port_line`, the first stdout line is `{"port": N}` and N is returned."""
        if self.proc is not None:
            raise RuntimeError(f"target {self.name!r}: already started")
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the process's life, closed by stop
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env={**os.environ, **(env or {})},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if port_line else asyncio.subprocess.DEVNULL,
                stderr=self.log,
                preexec_fn=_die_with_parent,
            )
            # In tito's process group: whoever stops tito's group (tito simulate, a CI job) stops the gateway too.
        except OSError as exc:
            await self.stop()
            raise TargetError(f"target {self.name!r}: cannot run {argv[0]}: {exc.strerror or exc}") from None
        if not port_line:
            return None
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
            if not line:
                raise TargetError(f"target {self.name!r}: the gateway exited: {self.last_error()}")
            return int(json.loads(line)["port"])
        except (TimeoutError, ValueError, KeyError, TypeError) as exc:
            error = f"target {self.name!r}: the gateway did not say its port: {exc!r}: {self.last_error()}"
            await self.stop()
            raise TargetError(error) from None
        except TargetError:
            await self.stop()
            raise

    async def wait_ready(self, url: str, status: int = 200, timeout_s: float = 120.0) -> None:
        """Poll `GET url` until it answers `status`; a process that exits first fails with its last line."""
        try:
            await asyncio.wait_for(self._poll(url, status), timeout_s)
        except TimeoutError:
            error = (
                f"target {self.name!r}: GET {url} did not answer {status} within {timeout_s:g} s: {self.last_error()}"
            )
            await self.stop()
            raise TargetError(error) from None
        except TargetError:
            await self.stop()
            raise

    async def _poll(self, url: str, status: int) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            while True:
                if self.proc is None or self.proc.returncode is not None:
                    raise TargetError(f"target {self.name!r}: the gateway exited: {self.last_error()}")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with http.get(url) as response:
                        if response.status == status:
                            return
                await asyncio.sleep(POLL_S)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self.log is not None:
            self.log.close()
            self.log = None

    def last_error(self) -> str:
        """The process's last stderr line (an import error, say), for a one-line failure."""
        if self.log is None:
            return "no output"
        self.log.seek(0)
        lines = [x for x in self.log.read().decode(errors="replace").splitlines() if x.strip()]
        return lines[-1].strip()[:300] if lines else "no output"
