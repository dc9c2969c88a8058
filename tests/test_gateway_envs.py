"""The gateways' cached Pythons (`recorder/targets/own_python/envs.py`): two processes ensuring the same environment
at once (two `make test`s) must not delete each other's half-made environment. Real processes, a real file lock;
the pip steps replaced by one that marks the folder and waits to be let go."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A process ensuring a made-up gateway whose one build step marks the folder as its own, logs that it ran, and
# waits for the test's `go` file (so the other process arrives while this one is still building).
CHILD = r"""
import sys
from tito_rl.recorder.targets.own_python import envs

who, go, log = sys.argv[1], sys.argv[2], sys.argv[3]
STEP = '''
import os, sys, time
folder, who, go, log = sys.argv[1:]
os.makedirs(os.path.join(folder, "bin"), exist_ok=True)
os.symlink(sys.executable, os.path.join(folder, "bin", "python"))
open(os.path.join(folder, "made-by-" + who), "w").close()
with open(log, "a") as f:
    f.write(who + " ran" + chr(10))
while not os.path.exists(go):
    time.sleep(0.02)
'''
envs.ENVS["fake"] = envs.GatewayEnv("fake", "fake==1", "TITO_FAKE_GATEWAY_PYTHON", (3, 0), "json")
envs._steps = lambda env, base: [[sys.executable, "-c", STEP, str(env.folder), who, go, log]]
print(envs.ensure("fake", quiet=True))
"""


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Wait for an event (polled); fail saying which one never came."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def _waits_on_a_lock(pid: int) -> bool:
    """/proc/locks lists a process blocked in flock as `N: -> FLOCK ... <pid> ...`."""
    return any("->" in line and f" {pid} " in line for line in Path("/proc/locks").read_text().splitlines())


@pytest.mark.skipif(not Path("/proc/locks").is_file(), reason="needs Linux's /proc/locks to see a process wait")
def test_two_concurrent_ensures_of_one_env_do_not_delete_each_others_work(tmp_path: Path) -> None:
    cache, go, log = tmp_path / "cache", tmp_path / "go", tmp_path / "log"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "PYTHONPATH": str(ROOT)}
    env.pop("TITO_FAKE_GATEWAY_PYTHON", None)
    folder = cache / "tito" / "fake-venv"

    def start(who: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", CHILD, who, str(go), str(log)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = start("first")
    try:
        _wait(lambda: (folder / "made-by-first").exists() or first.poll() is not None, "the first build to start")
        assert first.poll() is None, first.communicate()
        second = start("second")
        try:
            # the second either waits on the lock (right) or deletes the folder and builds its own (the bug)
            _wait(
                lambda: _waits_on_a_lock(second.pid) or "second" in log.read_text() or second.poll() is not None,
                "the second ensure to block or build",
            )
            go.touch()
            out_second, err_second = second.communicate(timeout=60)
        finally:
            second.kill()
        out_first, err_first = first.communicate(timeout=60)
    finally:
        first.kill()
    assert first.returncode == 0 and second.returncode == 0, (err_first, err_second)
    assert log.read_text() == "first ran\n"  # the second built nothing
    assert (folder / "made-by-first").exists()  # and deleted nothing
    assert (folder / ".tito-installed").read_text() == "fake==1\n"
    assert out_first.strip() == out_second.strip() == str(folder / "bin" / "python")
