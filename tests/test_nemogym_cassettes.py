"""The committed cassettes recorded around NeMo Gym's vLLM model server (`--target nemogym`: nemo-gym 0.7.0 in a
Python of its own, its training-token capture on, `recorder/targets/profiles/nemogym.yaml` and
`recorder/targets/own_python/nemogym.py`): the scripted client's (`nemogym_mixed`) and a real CLI's, opencode's
(`nemogym_opencode_tool_loop`). Checked: the sessions live in
the rollout path, NeMo Gym's engine calls (`/v1/chat/completions` with `logprobs`, `top_logprobs: 0`,
`return_tokens_as_token_ids`, then `POST /tokenize` with the same messages) are recorded and replayed, its replies
carry the token bundle in the message, its samples are its consumer's (`trajectories_for_rollout`) with the masked
second prompt of a two-prompt session; replayed through a fresh NeMo Gym with no engine, exit 0, byte-identical
twice, the samples those of the live run. The driver's mapping of a build is checked without NeMo Gym.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tito_rl.recorder.targets.own_python.nemogym import samples_from_build

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "cassettes" / "targets"
CASSETTES = sorted(TARGETS.glob("nemogym_*.tito"))
MIXED = TARGETS / "nemogym_mixed.tito"
OPENCODE = TARGETS / "nemogym_opencode_tool_loop.tito"
COOKIE = TARGETS / "nemogym_cookie.tito"


def _build(items: list[dict[str, Any]], mask: bool, **metrics: Any) -> dict[str, Any]:
    return {
        "rollout_id": "r",
        "rebuilt_response": {"output": items},
        "mask_sample": mask,
        "metrics": {"delivered_fraction": 1.0, **metrics},
    }


def test_a_delivered_build_is_one_sample_its_new_prompt_tokens_masked_its_generations_trained() -> None:
    items: list[dict[str, Any]] = [
        {"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.1, -0.2]},
        {"type": "function_call_output"},  # no token fields: not a call
        {"prompt_token_ids": [1, 2, 3, 4, 5], "generation_token_ids": [6], "generation_log_probs": [-0.3]},
    ]
    got = samples_from_build(_build(items, mask=False, n_calls=2), 0.5)
    (sample,) = got.samples
    assert sample["tokens"] == [1, 2, 3, 4, 5, 6] and sample["response_length"] == 4
    assert sample["loss_mask"] == [1, 1, 0, 1] and sample["rollout_log_probs"] == [-0.1, -0.2, 0.0, -0.3]
    assert sample["reward"] == 0.5 and sample["metadata"]["mask_sample"] is False
    assert sample["metadata"]["nemogym"]["delivered_fraction"] == 1.0
    assert got.stats["turns"] == 2 and got.stats["untrained_turns"] == 0 and got.stats["trained_tokens"] == 3
    assert got.stats["nemogym"] == {"n_calls": 2, "delivered_fraction": 1.0, "mask_sample": False}


def test_a_masked_build_keeps_its_tokens_and_trains_none_of_them() -> None:
    """`mask_sample`: NeMo Gym's consumers exclude the rollout from the loss (nemo_gym/token_id_capture/delivery.py)."""
    items = [{"prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.1, -0.2]}]
    built = _build(items, mask=True, n_calls=2, delivered_fraction=0.5, parent_link_failures={"x": 1})
    got = samples_from_build(built, 1.0)
    (sample,) = got.samples
    assert sample["tokens"] == [1, 2, 3, 4] and sample["loss_mask"] == [0, 0]
    assert sample["metadata"]["mask_sample"] is True
    assert got.stats["turns"] == 2 and got.stats["untrained_turns"] == 2 and got.stats["trained_tokens"] == 0
    assert got.stats["nemogym"]["parent_link_failures"] == {"x": 1}


def test_a_build_with_no_response_gives_no_sample_and_says_why() -> None:
    built = {"rebuilt_response": None, "mask_sample": True, "error": "capture contains no token records"}
    got = samples_from_build(built, 1.0)
    assert got.samples == [] and got.stats["nemogym"]["error"] == "capture contains no token records"
    assert samples_from_build(None, 1.0).samples == []


def test_its_engine_calls_are_tied_to_their_sessions_with_no_routing_key() -> None:
    """NeMo Gym sends no session header, moves each echoed `<think>` block into `reasoning_content`/`reasoning`
    (so its messages are not the agent's), and asks `/tokenize` for the prompt's ids after each chat call."""
    from tito_rl.recorder.taps.attribution import Attribution
    from tito_rl.trajectory.adapters.tap import EngineExchange

    def agent(system: str) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": system},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "<think>\nr\n</think>\n\nok"},
            {"role": "tool", "tool_call_id": "c", "content": "done"},
        ]

    def gym(system: str) -> list[dict[str, Any]]:
        echoed = {"role": "assistant", "content": "\n\nok", "reasoning_content": "\nr\n", "reasoning": "\nr\n"}
        return [*agent(system)[:2], echoed, agent(system)[3]]

    attribution = Attribution(None)
    older = attribution.begin("a", "path:/ng-rollout/{sid}", body=json.dumps({"messages": agent("A")}).encode())
    newer = attribution.begin("b", "path:/ng-rollout/{sid}", body=json.dumps({"messages": agent("B")}).encode())
    chat = attribution.owner("/v1/chat/completions", {"Authorization": "Bearer tito"}, {"messages": gym("B")})
    assert chat is not None and chat.flight is newer  # not the oldest in flight: the one whose turns it carries
    assert attribution.owner("/tokenize", {}, {"messages": gym("B")}) is None  # no chat call of it answered yet
    newer.engine.append(EngineExchange("POST", "/v1/chat/completions", {"messages": gym("B")}, 200))
    tokenize = attribution.owner("/tokenize", {}, {"model": "m", "messages": gym("B")})
    assert tokenize is not None and tokenize.flight is newer and tokenize.session == "b"
    assert attribution.owner("/tokenize", {}, {"prompt": "text"}) is None and older.engine == []


def test_its_python_is_made_with_what_pip_is_told_and_a_stamp_saying_so_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """nemo-gym 0.7.0 asks Python >= 3.13.14: installed on an older 3.13 with `--ignore-requires-python`, `uv` beside
    it (as the environment made by hand); a stamp written for another spec is not taken."""
    from tito_rl.recorder.targets.own_python import envs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TITO_NEMOGYM_PYTHON", raising=False)
    env = envs.ENVS["nemogym"]
    assert env.min_python == (3, 13) and env.stamp_text == "nemo-gym==0.7.0 --ignore-requires-python uv\n"
    assert envs.ENVS["verifiers"].stamp_text == "verifiers==0.4.0\n"  # the stamps written before read the same
    env.python.parent.mkdir(parents=True)
    env.python.write_text("#!/bin/sh\n")
    env.python.chmod(0o755)
    env.stamp.write_text("nemo-gym==0.6.0\n")
    monkeypatch.setattr(envs, "base_python", lambda minimum: None)  # nothing to make it with: said, not made
    assert envs.ensure("nemogym", quiet=True) is None and env.python.is_file()
    env.stamp.write_text(env.stamp_text)
    assert envs.ensure("nemogym", quiet=True) == str(env.python)


def _nemogym() -> None:
    from tito_rl.recorder.targets.base import TargetUnavailable
    from tito_rl.recorder.targets.own_python.envs import gateway_python

    try:
        gateway_python("nemogym")
    except TargetUnavailable as exc:
        pytest.skip(str(exc))


def run_tito(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_the_corpus_has_the_recordings_with_their_goldens_and_scenarios() -> None:
    assert CASSETTES == [COOKIE, MIXED, OPENCODE]
    for cassette in CASSETTES:
        assert cassette.with_suffix(".golden").is_file()
        assert (TARGETS / "scenarios" / f"{cassette.stem}.yaml").is_file()


def test_recorded_in_the_rollout_path_with_nemo_gyms_own_engine_calls() -> None:
    from tito_rl.cassette.format.records import AgentRecord, EngineRecord, SamplesRecord, SessionStart
    from tito_rl.cassette.reader import CassetteReader

    with CassetteReader(MIXED) as reader:
        header, records = reader.header, list(reader.records())
    assert header.target["name"] == "nemogym" and header.target["version"] == "0.7.0"
    assert header.target["routing_header"] is None
    assert header.target["session_from"] == "path:/ng-rollout/{sid}"
    starts = [r for r in records if isinstance(r, SessionStart)]
    assert {r.session for r in starts} == {"ng-loop", "ng-retry", "ng-hello", "ng-drop"}
    assert {r.source for r in starts} == {"path:/ng-rollout/{sid}"}
    agent = [r for r in records if isinstance(r, AgentRecord)]
    assert all(r.path == f"/ng-rollout/{r.session}/training-token-capture/v1/chat/completions" for r in agent)
    engine = [r for r in records if isinstance(r, EngineRecord)]
    chats = [r for r in engine if r.path == "/v1/chat/completions"]
    tokenizes = [r for r in engine if r.path == "/tokenize"]
    assert {r.path for r in engine} == {"/v1/chat/completions", "/tokenize"}
    # every chat call asks the sampled token's logprob with its id as `token_id:<int>`, and is never streamed
    assert all(
        r.request["logprobs"] is True
        and r.request["top_logprobs"] == 0
        and r.request["return_tokens_as_token_ids"] is True
        and not r.request.get("stream")
        for r in chats
    )
    # each answered chat call is followed by a /tokenize of the same messages (the prompt's ids), in its session
    answered = [r for r in chats if r.status == 200]
    assert len(tokenizes) == len(answered)
    assert {json.dumps(r.request["messages"]) for r in tokenizes} == {
        json.dumps(r.request["messages"]) for r in answered
    }
    assert {r.status for r in chats} == {200, 529} and {r.status for r in agent} == {200, 500}
    # the reply carries the token bundle in the message, the reasoning folded into content as <think>
    replies = [json.loads(r.reply_body) for r in agent if r.status == 200 and r.reply_body is not None]
    message = replies[0]["choices"][0]["message"]
    assert {"prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts"} <= set(message)
    assert message["content"].startswith("<think>")
    samples = {r.session: r.samples for r in records if isinstance(r, SamplesRecord)}
    assert set(samples) == {"ng-loop", "ng-retry", "ng-hello"}
    gym = {sid: s[0]["metadata"]["nemogym"] for sid, s in samples.items()}
    # one call: delivered whole and trained
    assert gym["ng-hello"]["delivered_fraction"] == 1.0 and not gym["ng-hello"]["mask_sample"]
    assert sum(samples["ng-hello"][0]["loss_mask"]) == 19
    # two prompts: every later call's prompt misses its parent's tokens (the tool-call separator re-rendered, the
    # earlier turns' <think> dropped at the second prompt): six roots, the rollout masked, nothing trained
    assert gym["ng-loop"]["parent_link_failures"] == {"parent_digest_mismatch": 4, "parent_call_id_missing": 1}
    assert gym["ng-loop"]["roots"] == 6 and gym["ng-loop"]["mask_sample"]
    assert sum(samples["ng-loop"][0]["loss_mask"]) == 0
    # the call the engine failed (529, answered 500, retried by the client) leaves the capture incomplete
    assert gym["ng-retry"]["capture_incomplete"] is True and gym["ng-retry"]["mask_sample"]


def test_a_real_cli_through_nemo_gym_its_title_request_in_the_same_rollout() -> None:
    """opencode 1.18.33 streams; NeMo Gym calls the engine unstreamed and synthesizes the SSE. Its title request
    shares the rollout's URL, so the capture holds 8 calls: 8 roots, the rollout masked, the title projected."""
    from tito_rl.cassette.format.records import AgentRecord, SamplesRecord
    from tito_rl.cassette.reader import CassetteReader

    with CassetteReader(OPENCODE) as reader:
        header, records = reader.header, list(reader.records())
    assert header.agent["client"] == "opencode" and header.target["name"] == "nemogym"
    agent = [r for r in records if isinstance(r, AgentRecord)]
    assert len(agent) == 8 and {r.status for r in agent} == {200}
    assert all(json.loads(r.body)["stream"] is True and r.reply_events and r.reply_body is None for r in agent)
    (sid,) = {r.session for r in agent}
    assert all(r.path == f"/ng-rollout/{sid}/training-token-capture/v1/chat/completions" for r in agent)
    ((sample,),) = [r.samples for r in records if isinstance(r, SamplesRecord)]
    gym = sample["metadata"]["nemogym"]
    assert gym["n_calls"] == 8 and gym["roots"] == 8 and gym["mask_sample"] and sample["response_length"] == 7


def test_two_cookie_sessions_at_once_each_keyed_by_the_id_inside_its_signed_cookie_never_mixed() -> None:
    """NeMo Gym's other session: its signed `VLLMModel___policy_model` cookie, kept across turns by each scripted
    session (`session_cookie:`). tito names the session by the `session_id` inside (`session-cookie:NAME`), the
    value itself (signed again at every response) never reaching the cassette; no rollout path, so no token capture
    and no sample, NeMo Gym's consumer saying why."""
    from tito_rl.cassette.format.records import AgentRecord, EngineRecord, SamplesRecord, SessionStart
    from tito_rl.cassette.reader import CassetteReader

    with CassetteReader(COOKIE) as reader:
        header, records = reader.header, list(reader.records())
    assert header.target["name"] == "nemogym"
    assert header.target["session_from"] == "session-cookie:VLLMModel___policy_model"
    starts = [r for r in records if isinstance(r, SessionStart)]
    assert {(r.session, r.source) for r in starts} == {
        ("ng-cookie-a", "session-cookie:VLLMModel___policy_model"),
        ("ng-cookie-b", "session-cookie:VLLMModel___policy_model"),
    }
    agent = [r for r in records if isinstance(r, AgentRecord)]
    engine = [r for r in records if isinstance(r, EngineRecord)]
    for sid, folder in (("ng-cookie-a", "/work/cookie-a"), ("ng-cookie-b", "/work/cookie-b")):
        own = [r for r in agent if r.session == sid]
        assert len(own) == 4 and {r.status for r in own} == {200}  # two prompts, a tool call in each
        assert all(r.path == "/v1/chat/completions" for r in own)  # no rollout in the URL
        assert all(folder in json.loads(r.body)["messages"][0]["content"] for r in own)  # its own turns only
        calls = [r for r in engine if r.session == sid]
        assert len(calls) == 8 and all(folder in r.request["messages"][0]["content"] for r in calls)
        # the cookie went and came back on every turn, and is in the cassette as neither value nor payload
        assert all(r.headers["Cookie"] == "<redacted>" and r.reply_headers["Set-Cookie"] == "<redacted>" for r in own)
    assert json.loads(next(r.body for r in agent if r.session == "ng-cookie-b"))["stream"] is True
    signed = "eyJzZXNzaW9uX2lkIjog"  # base64 of '{"session_id": ', how every value of the cookie starts
    assert not any(signed in json.dumps([r.headers, r.reply_headers]) for r in agent)
    assert not any(signed in json.dumps(r.headers) for r in engine)
    assert all(not r.samples for r in records if isinstance(r, SamplesRecord))


@pytest.mark.slow
def test_replays_through_nemo_gym_with_no_engine_twice_identical_with_the_live_samples(tmp_path: Path) -> None:
    _nemogym()
    from tests.replay_support import live_samples, replayed_twice

    replayed = replayed_twice(run_tito, CASSETTES, tmp_path)
    assert replayed == live_samples(MIXED) | live_samples(OPENCODE)
