"""Run `tito` subcommands as real processes on loopback ports, as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tito_rl.recorder import processes
from tito_rl.recorder.processes import free_port  # noqa: F401 - the tests' one import for it

ROOT = Path(__file__).resolve().parent.parent
# Raw real-CLI requests (copied from the team's shared/captures into the repo, so a bare clone tests them too).
CAPTURES = ROOT / "tests" / "captures"


def capture_dir(scenario: str) -> Path:
    """A capture's folder; missing, a clear error instead of an empty list that breaks a test further on."""
    folder = CAPTURES / scenario
    if not folder.is_dir():
        raise FileNotFoundError(
            f"the real-CLI capture {scenario!r} is missing: tests read {folder} "
            "(tests/captures, committed with the repo)"
        )
    return folder


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    try:
        processes.wait_http(url, proc, timeout_s)
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}: {proc_output(proc)}") from None


def proc_output(proc: subprocess.Popen) -> str:
    try:
        out, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        return "(still running)"
    return (out or b"").decode(errors="replace")[-2000:] + (err or b"").decode(errors="replace")[-2000:]


@contextmanager
def tito(*args: str, ready: str | None = None, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """Start `tito ARGS...`; wait for `ready` (a URL) to answer; stop it (SIGTERM, then SIGKILL) on exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tito_rl", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    try:
        if ready:
            wait_http(ready, proc)
        yield proc
    finally:
        processes.stop(proc)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def stop(proc: subprocess.Popen, timeout_s: float = 30.0) -> tuple[int, str]:
    """SIGTERM `proc` (a clean stop) and wait for it; its exit code and everything it printed, stdout then
    stderr."""
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, (out or b"").decode(errors="replace") + (err or b"").decode(errors="replace")


def kill_9_after(proc: subprocess.Popen, completed: int) -> int:
    """`proc` prints a running count after each call it completed; SIGKILL it once `completed` are done.
    Returns the last count it printed: every call up to there had returned before the kill."""
    assert proc.stdout is not None
    done = 0
    while done < completed:
        line = proc.stdout.readline()
        assert line, "the writer subprocess died early"
        done = int(line)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return done
