"""The committed cassettes recorded around rllm's model gateway (`cassettes/targets/rllm_*.tito`: the scripted client
and the real OpenAI-chat CLIs, Qwen Code and opencode, against the fake engine in `vllm-openai`), replayed through
rllm's real gateway with no engine: verified against their goldens, byte-identical twice, and failing, with the field
named, when the gateway's engine request changes (`add_logprobs: false` in its config). Also the pieces that put a
session in the URL: the scripted client's `path_prefix`, the driver's `session_path`, the CLIs' base URLs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tito_rl.cassette.format.records import AgentRecord, EngineRecord, SessionStart
from tito_rl.cassette.reader import CassetteReader
from tito_rl.fake_engine.scenario_model import ScenarioError
from tito_rl.recorder.agents.launchers import AgentTask, OpencodeLauncher, QwenCodeLauncher
from tito_rl.recorder.scripted.script import load_client_script, parse_client_script
from tito_rl.recorder.targets.base import TargetError, TargetInfo, TargetOptions
from tito_rl.replayer.replay.agent_leg import request_target

pytest.importorskip("rllm_model_gateway", reason="rllm-model-gateway (a dev dependency) is not installed")

from tito_rl.recorder.targets import rllm  # noqa: E402 - after the skip: it imports nothing of rllm at load

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "cassettes" / "targets"
CASSETTES = sorted(TARGETS.glob("rllm_*.tito"))
MIXED = TARGETS / "rllm_mixed.tito"
MIXED_SESSIONS = ("rllm-sse-loop", "rllm-json-retry", "rllm-sse-retry", "rllm-json-drop")


def run_tito(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != rllm.CONFIG_ENV} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=full
    )


def test_the_corpus_has_the_scripted_and_both_cli_recordings() -> None:
    assert [p.stem for p in CASSETTES] == ["rllm_mixed", "rllm_opencode_tool_loop", "rllm_qwen_tool_loop"]
    for path in CASSETTES:
        assert path.with_suffix(".golden").is_file(), path
        assert (TARGETS / "scenarios" / f"{path.stem}.yaml").is_file(), path


@pytest.mark.parametrize("path", CASSETTES, ids=lambda p: p.stem)
def test_recorded_around_rllm_on_vllm_openai_with_sessions_from_the_url(path: Path) -> None:
    with CassetteReader(path) as reader:
        header, records = reader.header, list(reader.records())
    assert header.target["name"] == "rllm" and header.target["routing_header"] is None
    assert header.target["session_path"] == "/sessions/{id}"
    engine = [r for r in records if isinstance(r, EngineRecord)]
    agent = [r for r in records if isinstance(r, AgentRecord)]
    sessions = [r for r in records if isinstance(r, SessionStart)]
    assert engine and {r.dialect for r in engine} == {"vllm-openai"}
    assert {r.path for r in engine} == {"/v1/chat/completions"}
    assert all(r.request.get("logprobs") is True and r.request.get("return_token_ids") is True for r in engine)
    assert {s.source for s in sessions} == {"path"}
    # the session id was the agent's token too: redacted in the URL, restored from the session's name on replay
    assert all(r.path.startswith("/sessions/<redacted>/v1/") for r in agent)
    assert all(e.session in {s.session for s in sessions} for e in engine)


@pytest.mark.slow
def test_each_rllm_cassette_replays_through_rllm_with_no_engine_twice_byte_identical(tmp_path: Path) -> None:
    outs = []
    for n in (1, 2):
        out = tmp_path / f"samples{n}.jsonl"
        run = run_tito("replay", *map(str, CASSETTES), "--export-samples", str(out))
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        assert "0 failed" in run.stdout
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    rows = [json.loads(line) for line in outs[0].decode().splitlines()]
    by_session: dict[str, int] = {}
    for row in rows:
        by_session[row["session"]] = by_session.get(row["session"], 0) + 1
        assert len(row["loss_mask"]) == row["response_length"] == len(row["rollout_log_probs"])
    assert by_session == {
        "rllm-sse-loop": 6,
        "rllm-json-retry": 3,
        "rllm-sse-retry": 2,
        "rllm-qwen-tool-loop-qwen-code-0000": 8,
        "rllm-opencode-tool-loop-opencode-0000": 8,
    }
    assert {row["reward"] for row in rows if row["session"] == "rllm-json-retry"} == {0.5}


def test_a_gateway_that_no_longer_adds_logprobs_fails_the_replay_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("add_logprobs: false\n")
    run = run_tito("replay", str(MIXED), "--session", "rllm-json-retry", env={rllm.CONFIG_ENV: str(config)})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "engine request differs at logprobs: recorded true, replayed '<absent>'" in run.stdout
    assert "POST /v1/chat/completions (vllm-openai)" in run.stdout


def test_session_and_engine_match_order_on_an_rllm_cassette(tmp_path: Path) -> None:
    out = tmp_path / "one.jsonl"
    run = run_tito(
        "replay", str(MIXED), "--session", "rllm-json-retry", "--engine-match", "order", "--export-samples", str(out)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "rllm-json-retry" in run.stdout
    assert not any(name in run.stdout for name in MIXED_SESSIONS if name != "rllm-json-retry")
    assert "1 session(s): 1 ok" in run.stdout
    assert {json.loads(line)["session"] for line in out.read_text().splitlines()} == {"rllm-json-retry"}


@pytest.mark.slow
def test_inspect_shows_rllm_stats_and_the_retry(tmp_path: Path) -> None:
    run = run_tito("inspect", str(MIXED), "--session", "rllm-json-retry")
    assert run.returncode == 0, run.stderr
    assert "replay differs" not in run.stdout
    assert "engine 529" in run.stdout and "retry of #1" in run.stdout
    assert "samples 3, forks prompt 2" in run.stdout and "trained tokens 131" in run.stdout
    page = tmp_path / "page.html"
    run = run_tito("inspect", str(MIXED), "--html", str(page))
    assert run.returncode == 0, run.stderr
    assert "rllm-sse-loop" in page.read_text(encoding="utf-8")


def test_diff_of_an_rllm_cassette_with_itself_is_the_same() -> None:
    run = run_tito("diff", str(MIXED), str(MIXED))
    assert run.returncode == 0, run.stderr
    assert "rllm-sse-loop  samples 6 -> 6  forks prompt:5 -> prompt:5  trained 289 -> 289" in run.stdout
    assert "4 session(s): 0 differ" in run.stdout


# ---- the session in the URL ----


def test_the_scripted_client_takes_a_validated_path_prefix() -> None:
    script = load_client_script(TARGETS / "scenarios" / "rllm_mixed.yaml")
    assert {s.prefix for s in script.sessions} == {f"/sessions/{s.id}" for s in script.sessions}

    def session(prefix: str) -> dict[str, object]:
        return {"sessions": [{"id": "a", "wire": "chat", "path_prefix": prefix, "steps": [{"prompt": "x"}]}]}

    assert parse_client_script(session("/gw/{id}/x")).sessions[0].prefix == "/gw/a/x"
    for bad, why in (
        ("sessions/{id}", "must start with '/'"),
        ("/sessions/{id}/", "trailing"),
        ("/s/{sid}", "only placeholder is {id}"),
        ("/s?x=1", "path only"),
        ("/s/{id", "only placeholder"),
    ):
        with pytest.raises(ScenarioError, match="path_prefix") as caught:
            parse_client_script(session(bad))
        assert why in str(caught.value)


def test_the_rllm_driver_declares_its_session_path_and_the_clis_get_it() -> None:
    target = rllm.create(TargetOptions())
    assert target.info.session_path == "/sessions/{id}"
    assert target.info.to_dict()["session_path"] == "/sessions/{id}"
    assert "session_path" not in TargetInfo(name="slime").to_dict()  # other headers unchanged
    task = AgentTask("http://127.0.0.1:8400", "sess-1", "do it", "m", session_path=target.info.session_path)
    qwen = QwenCodeLauncher().plan(task, "/home", "/bin/qwen", "/usr/bin")
    assert qwen.env["OPENAI_BASE_URL"] == "http://127.0.0.1:8400/sessions/sess-1/v1"
    opencode = OpencodeLauncher().plan(task, "/home", "/bin/opencode", "/usr/bin")
    config = json.loads(opencode.files[".config/opencode/opencode.json"])
    assert config["provider"]["tito"]["options"]["baseURL"] == "http://127.0.0.1:8400/sessions/sess-1/v1"
    plain = AgentTask("http://127.0.0.1:8400", "sess-1", "do it", "m")
    assert QwenCodeLauncher().plan(plain, "/h", "/b", "/u").env["OPENAI_BASE_URL"] == "http://127.0.0.1:8400/v1"
    with pytest.raises(ValueError, match="session_path"):
        AgentTask("http://x", "s", "t", "m", session_path="sessions/{id}")


def test_replay_puts_the_sessions_name_back_into_a_redacted_url() -> None:
    record = AgentRecord(
        session="rllm-sse-loop",
        seq=1,
        method="POST",
        path="/sessions/<redacted>/v1/chat/completions",
        query="",
        headers={},
        body=b"{}",
        status=200,
        reply_headers={},
    )
    assert request_target(record, "path", "rllm-sse-loop") == "/sessions/rllm-sse-loop/v1/chat/completions"
    assert request_target(record, "bearer", "x") == record.path  # only a session taken from the URL


def test_the_gateway_config_file_sets_only_the_knobs_the_driver_leaves_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text("add_logprobs: false\nstrip_vllm_fields: false\n")
    monkeypatch.setenv(rllm.CONFIG_ENV, str(config))
    target = rllm.create(TargetOptions())
    assert target.flags == {"add_logprobs": False, "strip_vllm_fields": False}
    assert target.info.settings["add_logprobs"] is False
    for text, why in (
        ("port: 1\n", "set by tito's driver"),
        ("add_logprobs: 0\n", "must be true or false"),
        ("colour: red\n", "unknown or unsupported"),
        ("- a\n", "a mapping"),
    ):
        config.write_text(text)
        with pytest.raises(TargetError, match=why):
            rllm.create(TargetOptions())
    monkeypatch.setenv(rllm.CONFIG_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(TargetError, match="cannot read it"):
        rllm.create(TargetOptions())
