"""`tito record` as a real process between a client and `tito fake-engine`, and the replay loop back.

Real processes on loopback: the scripted fake engine, the recording proxy, then the cassette served by
`tito fake-engine --cassette` to `tito serve`.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.process_helpers import capture_dir, free_port, tito
from tito_rl.cassette.format.records import AgentRecord
from tito_rl.cassette.reader import read_cassette

# One worker runs this module (tests/xdist_groups.py): its module-scoped fixture is made once.
pytestmark = pytest.mark.xdist_group("record_cli")

SCRIPT = "fake_engine/examples/claude_tool_loop.yaml"
BEARER = "tito-live-session-token-3c9e81f0a2b74d55"
API_KEY = "sk-ant-api03-recordproxy-Xy7Qw2Er4Ty6Ui8Op0AsDf"


def capture(name: str) -> bytes:
    return (capture_dir("claude_baseline") / "bodies" / name).read_bytes()


def post(url: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def agent_headers() -> dict[str, str]:
    return {
        "authorization": f"Bearer {BEARER}",
        "x-api-key": API_KEY,
        "anthropic-version": "2023-06-01",
        "cookie": f"session={BEARER}",
    }


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """Two Claude Code turns recorded through `tito record`, stopped with SIGTERM."""
    out = tmp_path_factory.mktemp("rec") / "run.tito"
    engine_port, proxy_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    with (
        tito("fake-engine", "--script", SCRIPT, "--port", str(engine_port), ready=engine + "/health"),
        tito(
            "record",
            "--engine",
            engine,
            "--listen",
            f"127.0.0.1:{proxy_port}",
            "--out",
            str(out),
            ready=f"http://127.0.0.1:{proxy_port}/health",
        ) as rec,
    ):
        url = f"http://127.0.0.1:{proxy_port}/v1/messages?beta=true"
        for name in ("baseline_001.json", "baseline_002.json"):
            status, body = post(url, capture(name), agent_headers())
            assert status == 200, body[:500]
            assert b"message_stop" in body
        rec.send_signal(signal.SIGTERM)
        assert rec.wait(timeout=30) == 0
    return out


def test_recording_holds_both_legs_and_the_finalized_samples(recorded: Path) -> None:
    cassette = read_cassette(recorded)
    assert not cassette.truncated
    (log,) = cassette.sessions.values()
    assert log.name.startswith("sid-") and BEARER not in log.name  # named by a digest of the bearer token
    assert [a.turn_index for a in log.agent] == [0, 1]
    generate = [e for e in log.engine if e.path.endswith("/generate")]
    assert len(generate) == 2 and all(e.status == 200 for e in generate)
    assert cassette.header.engine and cassette.header.engine.get("model_path")  # /model_info in the header
    (sample, *rest) = log.samples  # SIGTERM finalized the open session
    assert sample["loss_mask"] and sum(sample["loss_mask"]) > 0
    out_ids = [i for e in generate for i in e.response["output_ids"]]
    trained = [t for t, m in zip(sample["tokens"][-sample["response_length"] :], sample["loss_mask"], strict=True) if m]
    assert set(trained) <= set(out_ids)


def test_no_secret_reaches_the_cassette(recorded: Path) -> None:
    data = recorded.read_bytes()
    for secret in (BEARER, API_KEY, "recordproxy"):
        assert secret.encode() not in data


def test_kill_9_keeps_every_completed_exchange(tmp_path: Path) -> None:
    out = tmp_path / "killed.tito"
    engine_port, proxy_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    with (
        tito("fake-engine", "--script", SCRIPT, "--port", str(engine_port), ready=engine + "/health"),
        tito(
            "record",
            "--engine",
            engine,
            "--listen",
            f"127.0.0.1:{proxy_port}",
            "--out",
            str(out),
            ready=f"http://127.0.0.1:{proxy_port}/health",
        ) as rec,
    ):
        status, _ = post(f"http://127.0.0.1:{proxy_port}/v1/messages", capture("baseline_001.json"), agent_headers())
        assert status == 200
        # The proxy appends the exchange right after the reply's last byte; wait for that append, then
        # kill -9 while the session is still open (nothing finalized).
        deadline = time.monotonic() + 120  # a hang's bound: the append takes milliseconds
        while time.monotonic() < deadline and not any(
            isinstance(r, AgentRecord) for log in read_cassette(out).sessions.values() for r in log.records
        ):
            time.sleep(0.05)
        rec.send_signal(signal.SIGKILL)
        rec.wait(timeout=60)
    cassette = read_cassette(out)
    (log,) = cassette.sessions.values()
    assert len(log.agent) == 1 and log.agent[0].status == 200
    assert len([e for e in log.engine if e.path.endswith("/generate")]) == 1
    assert log.samples == []  # killed: nothing was finalized, and nothing completed was lost


def test_cassette_info_reports_the_recording(recorded: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "tito_rl", "cassette", "info", str(recorded), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    info = json.loads(proc.stdout)
    assert info["truncated"] is False
    (session,) = info["sessions"]
    assert session["agent_exchanges"] == 2 and session["engine_exchanges"] >= 2 and session["samples"] >= 1


def test_fake_engine_serves_the_cassette_back_to_tito_serve(recorded: Path) -> None:
    cassette = read_cassette(recorded)
    (log,) = cassette.sessions.values()
    engine_port, adapter_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    adapter = f"http://127.0.0.1:{adapter_port}"
    with (
        tito("fake-engine", "--cassette", str(recorded), "--port", str(engine_port), ready=engine + "/health"),
        tito("serve", "--engine", engine, "--listen", f"127.0.0.1:{adapter_port}", ready=adapter + "/health"),
    ):
        headers = {"authorization": f"Bearer {log.name}"}  # replay names the session as the cassette does
        agent: list[AgentRecord] = log.agent
        for record in agent:
            status, body = post(
                adapter + record.path + ("?" + record.query if record.query else ""), record.body, headers
            )
            assert status == 200, body[:500]
        status, body = post(f"{adapter}/tito/sessions/{log.name}/finish", json.dumps({"reward": 0.0}).encode())
        assert status == 200
        replayed = json.loads(body)["samples"]
        recorded_samples = log.samples
        assert [s["tokens"] for s in replayed] == [s["tokens"] for s in recorded_samples]
        assert [s["loss_mask"] for s in replayed] == [s["loss_mask"] for s in recorded_samples]
        assert [s["rollout_log_probs"] for s in replayed] == [s["rollout_log_probs"] for s in recorded_samples]

        changed = json.loads(agent[0].body)
        changed["messages"][0]["content"][-1]["text"] += " And also count them."
        status, body = post(
            adapter + "/v1/messages", json.dumps(changed).encode(), {"authorization": "Bearer another-session"}
        )
        assert status >= 400
        error = json.loads(body)
        assert error["type"] == "error"
        message = error["error"]["message"]
        assert "closest recorded request" in message and "first differ at token 9478" in message
        assert "And also count them" in message  # the decoded text around the divergence


def _writer_pid(proxy_pid: int) -> int:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == proxy_pid and b"tito_rl.cassette.writer_process" in cmdline:
            return int(stat.parent.name)
    raise AssertionError(f"no cassette writer process under tito record ({proxy_pid})")


def test_a_dead_cassette_writer_stops_the_proxy_answering_with_the_reason(tmp_path: Path) -> None:
    """Traffic that is not recorded must not look recorded: agents and /health get a 503 naming why."""
    import os

    out = tmp_path / "lost.tito"
    engine_port, proxy_port = free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    proxy = f"http://127.0.0.1:{proxy_port}"
    with (
        tito("fake-engine", "--script", SCRIPT, "--port", str(engine_port), ready=engine + "/health"),
        tito(
            "record",
            "--engine",
            engine,
            "--listen",
            f"127.0.0.1:{proxy_port}",
            "--out",
            str(out),
            ready=proxy + "/health",
        ) as rec,
    ):
        os.kill(_writer_pid(rec.pid), signal.SIGKILL)
        statuses = []
        for _ in range(5):  # the turn during which the writer is found dead is answered, then refused
            status, body = post(f"{proxy}/v1/messages", capture("baseline_001.json"), agent_headers())
            statuses.append(status)
            if status == 503:
                break
        assert statuses[-1] == 503, statuses
        error = json.loads(body)["error"]
        assert error["type"] == "recording_failed" and str(out) in error["message"]
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(proxy + "/health", timeout=10)
        assert health.value.code == 503


def test_fake_engine_refuses_a_cassette_whose_engine_leg_it_cannot_serve_in_one_line() -> None:
    """`--cassette` answers SGLang /generate recordings; a recording around rllm (vLLM's OpenAI API) used to start
    and refuse every request. Now it says why at once, and where such a cassette replays."""
    cassette = Path(__file__).resolve().parent.parent / "cassettes" / "targets" / "rllm_mixed.tito"
    done = subprocess.run(
        [sys.executable, "-m", "tito_rl", "fake-engine", "--cassette", str(cassette), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "its engine leg is not SGLang's /generate (15 vllm-openai call(s))" in lines[0]
    assert "tito replay" in lines[0]


def test_plain_record_serves_a_trainers_engine_url_and_keeps_its_updates_as_events(tmp_path: Path) -> None:
    """Plain `tito record` (tito's adapter, no --target) serves the trainer an engine URL (--engine-listen, printed
    at start): what a trainer does there reaches the engine, and its weight updates are engine-wide events in the
    cassette, placed on one counter with the adapter's own calls, as around a target."""
    from tito_rl.cassette.format.records import ENGINE_WIDE
    from tito_rl.replayer.audit.runner import audit_cassette

    out = tmp_path / "trainer.tito"
    engine_port, proxy_port, trainer_port = free_port(), free_port(), free_port()
    engine, trainer = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{trainer_port}"
    with (
        tito("fake-engine", "--script", SCRIPT, "--port", str(engine_port), ready=engine + "/health"),
        tito(
            "record",
            "--engine",
            engine,
            "--listen",
            f"127.0.0.1:{proxy_port}",
            "--engine-listen",
            f"127.0.0.1:{trainer_port}",
            "--out",
            str(out),
            ready=trainer + "/health",  # relayed to the engine: the trainer's URL is up
        ) as rec,
    ):
        update = json.dumps({"new_version": "7", "abort_all_requests": False}).encode()
        status, body = post(trainer + "/update_weight_version", update)
        assert status == 200 and json.loads(body)["new_version"] == "7"
        status, body = post(f"http://127.0.0.1:{proxy_port}/v1/messages?beta=true", capture("baseline_001.json"),
                            agent_headers())  # fmt: skip
        assert status == 200, body[:500]
        rec.send_signal(signal.SIGTERM)
        assert rec.wait(timeout=30) == 0
        assert rec.stderr is not None
        printed = rec.stderr.read().decode()
    assert f"a trainer's engine URL: {trainer}" in printed
    cassette = read_cassette(out)
    (event,) = cassette.events
    assert (event.session, event.path, event.request, event.status) == (
        ENGINE_WIDE,
        "/update_weight_version",
        {"new_version": "7", "abort_all_requests": False},
        200,
    )
    (log,) = cassette.sessions.values()
    (call,) = [e for e in log.engine if e.path.endswith("/generate")]
    assert call.order is not None and event.order[1] < call.order[0]  # the adapter's call placed after the update
    assert call.response["meta_info"]["weight_version"] == "7"
    rules = audit_cassette(out).findings.rules
    assert not rules["version-not-current"].fired and not rules["aborted-by-update"].fired
