"""The committed cassettes recorded around Agent Lightning's LLM proxy through its profile (`--target agentlightning`:
agentlightning 1.0.2 in a Python of its own, `recorder/targets/profiles/agentlightning.yaml`): the scripted client's
(`agentlightning_mixed`) and a real agent CLI's, mini-swe-agent's (`agentlightning_mini_tool_loop`: unstreamed OpenAI
chat, which the proxy requires). Both replayed through a fresh Agent Lightning with no engine: exit 0, byte-identical
twice, their samples those of the live runs; and failing, with the field named, through a copy of the profile that
turns the proxy's logprobs off.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.replay_support import live_samples, replayed_twice
from tito_rl.cassette.format.records import AgentRecord, EngineRecord, SessionStart
from tito_rl.cassette.reader import CassetteReader
from tito_rl.recorder.targets.base import TargetUnavailable
from tito_rl.recorder.targets.own_python.envs import gateway_python
from tito_rl.recorder.targets.profiles.driver import BUILTIN_DIR

try:
    gateway_python("agentlightning")
except TargetUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "cassettes" / "targets"
CASSETTES = sorted(TARGETS.glob("agentlightning_*.tito"))
MIXED = TARGETS / "agentlightning_mixed.tito"
MINI = TARGETS / "agentlightning_mini_tool_loop.tito"


def run_tito(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_the_corpus_has_the_scripted_and_the_real_cli_recordings_with_their_goldens_and_scenarios() -> None:
    assert [p.stem for p in CASSETTES] == ["agentlightning_mini_tool_loop", "agentlightning_mixed"]
    for cassette in CASSETTES:
        assert cassette.with_suffix(".golden").is_file()
        assert (TARGETS / "scenarios" / f"{cassette.stem}.yaml").is_file()


def test_recorded_through_the_profile_with_the_proxys_own_engine_request() -> None:
    with CassetteReader(MIXED) as reader:
        header, records = reader.header, list(reader.records())
    assert header.target["name"] == "agentlightning" and header.target["version"] == "1.0.2"
    assert header.target["settings"]["profile"]["name"] == "agentlightning"  # the cassette keeps the profile
    assert header.target["routing_header"] is None
    engine = [r for r in records if isinstance(r, EngineRecord)]
    agent = [r for r in records if isinstance(r, AgentRecord)]
    assert engine and {r.dialect for r in engine} == {"vllm-openai"}
    # the proxy asks for token ids and logprobs, and sets the temperature itself (1.0 in train mode)
    assert all(
        r.request["return_token_ids"] is True and r.request["logprobs"] is True and r.request["temperature"] == 1.0
        for r in engine
    )
    assert {r.status for r in engine} == {200, 529} and {r.status for r in agent} == {200}  # it retried the 529s
    # the rollout id in the URL is the session, kept verbatim (not a secret): replay and finish address it
    starts = [r for r in records if isinstance(r, SessionStart)]
    assert {r.session for r in starts} == {"agl-loop", "agl-retry", "agl-first-retry", "agl-drop"}
    assert {r.source for r in starts} == {"path:/proxy/rollout/{sid}"}
    assert header.target["session_from"] == "path:/proxy/rollout/{sid}"
    assert all(r.path.startswith(f"/proxy/rollout/{r.session}/attempt/0/mode/train/openai/v1/") for r in agent)


def test_a_real_cli_recorded_through_the_proxy_unstreamed() -> None:
    """mini-swe-agent's four turns: OpenAI chat with no `stream` and no sampling parameter of its own (litellm drops
    what the model does not take), its one `bash` tool, its assistant turns echoed with the engine's reasoning
    (litellm's `reasoning_content`); the proxy adds token ids and logprobs and sets the temperature itself."""
    with CassetteReader(MINI) as reader:
        header, records = reader.header, list(reader.records())
    assert header.agent == {
        "client": "mini-swe-agent",
        "package": "mini-swe-agent",
        "version": "2.4.6",
        "scenario": "agentlightning_mini_tool_loop",
    }
    assert header.target["name"] == "agentlightning" and header.target["version"] == "1.0.2"
    agent = [r for r in records if isinstance(r, AgentRecord)]
    engine = [r for r in records if isinstance(r, EngineRecord)]
    assert len(agent) == len(engine) == 4 and {r.status for r in agent} == {200} and not any(r.side for r in agent)
    (sid,) = {r.session for r in agent}
    assert all(r.path == f"/proxy/rollout/{sid}/attempt/0/mode/train/openai/v1/chat/completions" for r in agent)
    assert all(r.headers["Authorization"] == "<redacted>" for r in agent)
    bodies = [json.loads(r.body) for r in agent]
    assert all(set(b) == {"model", "messages", "tools"} for b in bodies)  # unstreamed: no `stream` at all
    assert {t["function"]["name"] for b in bodies for t in b["tools"]} == {"bash"}
    echoed = [m for m in bodies[-1]["messages"] if m["role"] == "assistant"]
    assert len(echoed) == 3 and all(m["reasoning_content"] and m["tool_calls"] for m in echoed)
    assert all(
        r.request["logprobs"] is True and r.request["return_token_ids"] is True and r.request["temperature"] == 1.0
        for r in engine
    )
    assert json.loads(agent[-1].reply_body or b"{}")["choices"][0]["message"]["tool_calls"][0]["function"][
        "arguments"
    ] == json.dumps({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})


@pytest.mark.slow
def test_replays_through_agent_lightning_with_no_engine_twice_identical_with_the_live_samples(tmp_path: Path) -> None:
    replayed = replayed_twice(run_tito, CASSETTES, tmp_path)
    live = live_samples(MIXED) | live_samples(MINI)
    assert replayed == live and sum(len(v) for v in live.values()) == 11 + 4


@pytest.mark.slow
def test_a_profile_that_turns_the_proxys_logprobs_off_fails_the_replay_naming_the_field(tmp_path: Path) -> None:
    text = (BUILTIN_DIR / "agentlightning.yaml").read_text()
    changed = tmp_path / "agl-no-logprobs.yaml"
    changed.write_text(
        text.replace(
            '"default_proxy.model_name={model}",',
            '"default_proxy.model_name={model}", "default_proxy.include_log_probs=false",',
        )
    )
    assert changed.read_text() != text
    run = run_tito("replay", *map(str, CASSETTES), "--target", str(changed))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "engine request differs at logprobs: recorded true, replayed '<absent>'" in run.stdout
    # every session fails at its first engine call, the real CLI's too, naming the same field
    assert "5 session(s): 0 ok, 5 failed" in run.stdout
    lines = run.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("agentlightning-mini-tool-loop"))
    assert "FAIL: engine-request at agent exchange 0" in lines[at]
    assert "engine request differs at logprobs: recorded true, replayed '<absent>'" in lines[at + 1]
