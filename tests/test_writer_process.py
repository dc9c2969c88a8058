"""The recording proxy's writer process: the same cassette bytes as an in-process writer, no secret on disk,
nothing completed lost when the proxy is killed, and one clear error when the writer cannot go on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cassette_helpers import API_KEY, BEARER, final_sample, header, play, session_traffic
from tests.process_helpers import kill_9_after
from tito_rl.cassette.reader import read_cassette
from tito_rl.cassette.writer import CassetteWriter, PerSessionTap
from tito_rl.cassette.writer_process import RecorderError, WriterProcessTap

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def traffic(qwen_tokenizer: Any) -> list[tuple[str, Any]]:
    return session_traffic(qwen_tokenizer, turns=4)


def _record(tap: Any, traffic: list[tuple[str, Any]]) -> None:
    tap.agent_request(BEARER, "bearer", {"Authorization": f"Bearer {BEARER}", "x-api-key": API_KEY})
    play(tap, traffic)
    tap.session_finished(BEARER, "bearer", 1.0, [final_sample(traffic)])
    tap.close()


def _wait_gone(pid: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":  # exited, waiting for a parent that was killed to be reaped by init
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} still running after {timeout_s} s")


def test_the_writer_process_writes_the_in_process_writers_bytes(traffic: list[tuple[str, Any]], tmp_path: Path) -> None:
    _record(CassetteWriter(tmp_path / "in_process.tito", header()), traffic)
    _record(WriterProcessTap(tmp_path / "child.tito", header()), traffic)
    child = (tmp_path / "child.tito").read_bytes()
    assert child == (tmp_path / "in_process.tito").read_bytes()
    for secret in (BEARER, API_KEY):
        assert secret.encode() not in child
    (log,) = read_cassette(tmp_path / "child.tito").sessions.values()
    assert len(log.agent) == 4 and len(log.engine) == 4 and len(log.samples) == 1


def test_a_relative_cassette_path_is_the_callers_not_the_checkouts(
    traffic: list[tuple[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the writer process runs in the checkout's parent folder: `tito record --out x.tito` once wrote there
    monkeypatch.chdir(tmp_path)
    _record(WriterProcessTap(Path("relative.tito"), header()), traffic)
    assert len(read_cassette(tmp_path / "relative.tito").sessions) == 1


def test_per_session_mode_writes_one_cassette_per_session(traffic: list[tuple[str, Any]], tmp_path: Path) -> None:
    tap = WriterProcessTap(tmp_path / "runs", header(), per_session=True)
    play(tap, traffic[:2], session="alpha", source="path")
    play(tap, traffic[2:4], session="beta", source="path")
    tap.close()
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["alpha.tito", "beta.tito"]
    reference = PerSessionTap(tmp_path / "reference", header())
    play(reference, traffic[:2], session="alpha", source="path")
    reference.close()
    assert (tmp_path / "runs" / "alpha.tito").read_bytes() == (tmp_path / "reference" / "alpha.tito").read_bytes()


def test_kill_9_of_the_proxy_loses_no_call_that_returned(tmp_path: Path) -> None:
    """Calls that returned are in the pipe: the writer drains them after the proxy's death."""
    path = tmp_path / "killed.tito"
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from tito_rl.cassette.writer_process import WriterProcessTap
        from tests.cassette_helpers import header, generate_body
        from tito_rl.trajectory.adapters.tap import EngineExchange
        tap = WriterProcessTap(__import__("pathlib").Path({str(path)!r}), header())
        print(tap.pid, flush=True)
        prompt = list(range(1, 2000))
        n = 0
        while True:
            out = [n % 1000 + 10] * 400 + [151645]
            tap.engine_exchange("run", "path", EngineExchange(
                "POST", "/generate", {{"rid": str(n), "input_ids": prompt}}, 200,
                generate_body(out, str(n), len(prompt))))
            prompt = prompt + out + [n + 3] * 300
            n += 1
            print(n, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    writer_pid = int(proc.stdout.readline())
    completed = kill_9_after(proc, 40)
    _wait_gone(writer_pid)
    engine = read_cassette(path).sessions["run"].engine
    assert len(engine) >= completed
    for i, record in enumerate(engine):  # every record intact and in order, deltas resolved
        assert record.request["rid"] == str(i)
        assert record.response["output_ids"] == [i % 1000 + 10] * 400 + [151645]


def test_the_writer_outlives_a_stop_signal_until_the_pipe_is_closed(
    traffic: list[tuple[str, Any]], tmp_path: Path
) -> None:
    """Ctrl-C and SIGTERM go to the proxy, which closes the pipe in order; the writer must not die first."""
    tap = WriterProcessTap(tmp_path / "stopped.tito", header())
    assert os.getsid(tap.pid) != os.getsid(0)  # a terminal's Ctrl-C does not reach it
    os.kill(tap.pid, signal.SIGINT)
    os.kill(tap.pid, signal.SIGTERM)
    _record(tap, traffic)
    (log,) = read_cassette(tmp_path / "stopped.tito").sessions.values()
    assert len(log.agent) == 4 and len(log.samples) == 1


def test_an_unwritable_cassette_fails_at_start_with_the_reason(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RecorderError, match="could not start"):
        WriterProcessTap(tmp_path / "missing" / "run.tito", header())
    assert "cannot write the cassette" in capfd.readouterr().err
    existing = tmp_path / "existing.tito"
    existing.write_bytes(b"someone else's")
    with pytest.raises(RecorderError, match="could not start"):
        WriterProcessTap(existing, header())
    assert existing.read_bytes() == b"someone else's"


def test_a_dead_writer_is_an_error_on_the_next_call_not_a_hang(traffic: list[tuple[str, Any]], tmp_path: Path) -> None:
    tap = WriterProcessTap(tmp_path / "dead.tito", header())
    os.kill(tap.pid, signal.SIGKILL)
    _wait_gone(tap.pid)
    with pytest.raises(RecorderError, match="stopped"):
        for _ in range(1000):  # the first writes may still fit in the pipe's buffer
            play(tap, traffic)
    with pytest.raises(RecorderError, match="closed"):
        play(tap, traffic)
