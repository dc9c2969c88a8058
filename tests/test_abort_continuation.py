"""tito's adapter through a weight update that aborts its generation, recorded by plain `tito record` (issue 46).

A trainer updates the weights with `abort_all_requests` while an agent's turn is generating. tito's adapter does
what slime's partial rollout does: it sends the prompt and the partial output again and answers the agent once
with the whole reply; the tokens before the update keep the old version, those after carry the new one, and the
sample's logprobs, routes and kept sets stay aligned with its tokens. The trainer reaches the engine through the
engine URL plain `tito record` serves beside the adapter (`recorder/taps/trainer_tap.py`), so its update is in
the cassette as an engine-wide event placed among the adapter's calls, as around a target.

Real HTTP on loopback: the fake engine (routes on, SGLang's `/generate` or vLLM's `/inference/v1/generate`), the
recording app and its trainer tap, one agent session and a trainer client. Nothing waits on time: the engine pauses
itself two tokens into the turn (`pause_after`), and the trainer acts once the engine says it is paused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.cassette_helpers import serve
from tito_rl.cassette.format.records import ENGINE_WIDE
from tito_rl.cassette.reader import read_cassette
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.fake_engine.app import ENGINE_KEY, EngineOptions
from tito_rl.fake_engine.app import create_app as engine_app
from tito_rl.fake_engine.channels.moe import MoeShape
from tito_rl.fake_engine.channels.moe import routes as fake_routes
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.main import main
from tito_rl.recorder.taps.proxy import build_header, create_recording_app
from tito_rl.recorder.taps.trainer_tap import TRAINER_TAP_KEY
from tito_rl.replayer.audit.runner import AuditOptions, audit_cassette
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.serve import learn_served_model
from tito_rl.trajectory.adapters.session import session_digest
from tito_rl.trajectory.dialects.registry import record_view
from tito_rl.trajectory.dialects.view import SGLANG, VLLM_GENERATE, VLLM_OPENAI
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

SID = "agent-update-session-token-0001"
REPLY = "Let me look at the files first."
SHAPE = MoeShape(2, 2, 8)
SCENARIO = {
    "name": "update_mid_turn",
    "sessions": [
        {
            "turns": [
                {"text": REPLY, "faults": {"pause_after": 2}, "fault_attempts": 1},
                {"text": "There are three files."},
            ]
        }
    ],
}
# How a trainer updates each engine: SGLang's update aborts what is in flight; vLLM's pause in abort mode does.
TRAINER_CALLS = {
    SGLANG: [("/update_weight_version", {"new_version": "2"}), ("/continue_generation", {})],
    VLLM_GENERATE: [("/pause?mode=abort", {}), ("/update_weight_version", {"new_version": "2"}), ("/resume", {})],
}
TRAINER_CALLS[VLLM_OPENAI] = TRAINER_CALLS[VLLM_GENERATE]


async def _until(condition: Any, what: str) -> None:
    """Wait for the engine's state to say so: an event, never a fixed delay."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine never got there: {what}")


async def _record(path: Path, dialect: str) -> list[dict[str, Any]]:
    """One session of two turns, the first aborted by the trainer's update; the agent's replies."""
    tokenizer = load_tokenizer()
    options = EngineOptions(
        tokenizer=tokenizer,
        weight_version="1",
        return_routed_experts=True,
        moe=SHAPE,
        openai_dialect=VLLM_OPENAI if dialect != SGLANG else None,
    )
    engine = engine_app(ScriptedPolicy(parse_scenario(SCENARIO), tokenizer), options)
    state = engine[ENGINE_KEY]
    replies: list[dict[str, Any]] = []
    async with serve(engine) as engine_url:
        settings = AdapterSettings(engine_url=engine_url, engine_dialect=dialect)
        assert await learn_served_model(settings) is None  # as `tito record` does: vLLM calls name the model
        writer = CassetteWriter(path, build_header(settings, None, {"client": "test"}))
        app = create_recording_app(settings, writer)
        async with (
            serve(app[TRAINER_TAP_KEY].app()) as trainer_url,
            serve(app) as url,
            aiohttp.ClientSession() as http,
        ):
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You list files."},
                {"role": "user", "content": "List files."},
            ]

            async def turn() -> None:
                body = {"model": "tito", "messages": messages, "top_p": 0.9}
                headers = {"Authorization": f"Bearer {SID}"}
                async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                    assert r.status == 200, await r.text()
                    choice = (await r.json())["choices"][0]
                replies.append(choice)
                messages.extend(
                    [
                        {"role": "assistant", "content": choice["message"]["content"]},
                        {"role": "user", "content": "Count."},
                    ]
                )

            first = asyncio.ensure_future(turn())
            await _until(lambda: state.paused.is_set() and len(state.tracked) == 1, "the turn in flight, paused")
            for route, body in TRAINER_CALLS[dialect]:
                async with http.post(trainer_url + route, json=body) as r:
                    assert r.status == 200, await r.text()
            await first
            await turn()
            async with http.post(url + f"/tito/sessions/{SID}/finish", json={"reward": 1.0}) as r:
                assert r.status == 200, await r.text()
    return replies


@pytest.fixture(scope="module", params=[SGLANG, VLLM_GENERATE, VLLM_OPENAI])
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, list[Any]]:
    dialect = request.param
    path = tmp_path_factory.mktemp(dialect) / "update.tito"
    replies = asyncio.run(_record(path, dialect))
    return dialect, path, replies


def test_the_agent_gets_the_whole_reply_once_and_the_sample_spans_both_versions(
    recorded: tuple[str, Path, list[Any]],
) -> None:
    dialect, path, replies = recorded
    assert [r["message"]["content"] for r in replies] == [REPLY, "There are three files."]
    assert [r["finish_reason"] for r in replies] == ["stop", "stop"]
    cassette = read_cassette(path)
    log = cassette.sessions[session_digest(SID)]
    generations = [e for e in log.engine if record_view(e).generates]
    aborted, continued, second = generations

    def output(record: Any) -> list[int]:
        return list(record_view(record).output_ids or [])

    def prompt(record: Any) -> list[int]:
        return list(record_view(record).prompt_ids or [])

    partial = output(aborted)
    assert len(partial) == 2  # paused two tokens in, then aborted by the update
    assert prompt(continued) == prompt(aborted) + partial  # the prompt and the partial output sent again
    assert [r.retry_of for r in log.agent] == [None, None] and len(log.agent) == 2  # one reply per turn
    [sample] = log.samples
    tokens = sample["tokens"]
    response = tokens[len(tokens) - sample["response_length"] :]
    whole = partial + output(continued)
    at = len(prompt(aborted)) - (len(tokens) - sample["response_length"])
    assert response[at : at + len(whole)] == whole and sum(sample["loss_mask"][at : at + len(whole)]) == len(whole)
    logprobs = [float(x) for x in sample["rollout_log_probs"][at : at + len(whole)]]
    assert logprobs == _logprobs(aborted) + _logprobs(continued)
    # the versions: the first turn's two tokens of version 1, the rest of version 2, one version per turn (vLLM's
    # completions send none)
    if dialect == VLLM_OPENAI:
        assert not sample.get("weight_versions") and "weight_version_changes" not in sample["metadata"]
    else:
        assert sample["weight_versions"] == ["2", "2"]
        assert sample["metadata"]["weight_version_changes"] == [
            {"turn": 0, "spans": [["1", 0, 2], ["2", 2, len(whole)]]}
        ]
    # the routes: one row per token but the last, each the engine's for that prefix, across the abort
    rows = np.asarray(sample["rollout_routed_experts"]).reshape(len(tokens) - 1, -1)
    assert np.array_equal(rows, fake_routes(tokens, SHAPE)[:-1].reshape(len(tokens) - 1, -1))
    if dialect == SGLANG:  # top_p 0.9: the kept sets, one per response token, the sampled token among its own
        ids, offsets = sample["rollout_top_p_token_ids"], sample["rollout_top_p_token_offsets"]
        assert len(offsets) == sample["response_length"] + 1
        for i in range(at, at + len(whole)):
            assert response[i] in ids[offsets[i] : offsets[i + 1]]


def _logprobs(record: Any) -> list[float]:
    return [float(x) for x in record_view(record).logprobs or [] if x is not None]


def test_the_trainers_update_is_an_engine_wide_event_among_the_adapters_calls(
    recorded: tuple[str, Path, list[Any]],
) -> None:
    dialect, path, _ = recorded
    cassette = read_cassette(path)
    events = cassette.events
    assert [e.path for e in events] == [route for route, _ in TRAINER_CALLS[dialect]]
    assert all(e.session == ENGINE_WIDE and e.status == 200 for e in events)
    aborted, continued, second = (e for e in cassette.sessions[session_digest(SID)].engine if record_view(e).generates)
    aborting = events[0].order  # SGLang's update, vLLM's pause in abort mode
    assert aborted.order is not None and continued.order is not None and second.order is not None
    assert aborted.order[0] < aborting[0] < aborted.order[1]  # in flight when the trainer's call came
    assert events[-1].order[1] < continued.order[1]  # continued after the update, answered once resumed
    every = [n for e in events for n in e.order] + [n for r in (aborted, continued, second) for n in r.order or ()]
    assert len(set(every)) == len(every)  # one counter for the adapter's calls and the trainer's


def test_the_audit_is_clean_and_max_staleness_counts_the_versions_the_turn_spans(
    recorded: tuple[str, Path, list[Any]],
) -> None:
    dialect, path, _ = recorded
    name = session_digest(SID)
    clean = audit_cassette(path, options=AuditOptions(max_staleness=1)).findings.rules
    assert [rule for rule, found in clean.items() if found.fired] == []
    strict = audit_cassette(path, options=AuditOptions(max_staleness=0)).findings.rules
    if dialect == VLLM_OPENAI:  # its answers name no version: nothing to count
        assert not strict["stale-tokens"].fired
        return
    assert strict["stale-tokens"].sessions == {name: 1}
    assert (
        "versions 1 to 2, 1 apart (--max-staleness 0; 2 token(s) beyond it)"
        in strict["stale-tokens"].examples[0].detail
    )


def test_replay_answers_the_continuation_from_the_cassette(recorded: tuple[str, Path, list[Any]]) -> None:
    """The replayed adapter sends the same continuation (prompt and partial output), which the cassette answers,
    and builds the same sample: a golden written by one replay passes the next."""
    _, path, _ = recorded
    assert main(["replay", str(path), "--update-goldens"]) == 0
    assert main(["replay", str(path)]) == 0


async def _record_aborting_engine(path: Path) -> tuple[int, dict[str, Any]]:
    """An engine that aborts every attempt one token in: the agent's status and body; the finish's samples."""
    tokenizer = load_tokenizer()
    scenario = {"name": "always_aborts", "sessions": [{"turns": [{"text": REPLY, "faults": {"abort_after": 1}}]}]}
    engine = engine_app(ScriptedPolicy(parse_scenario(scenario), tokenizer), EngineOptions(tokenizer=tokenizer))
    async with serve(engine) as engine_url:
        settings = AdapterSettings(engine_url=engine_url)
        writer = CassetteWriter(path, build_header(settings, None, {"client": "test"}))
        async with serve(create_recording_app(settings, writer)) as url, aiohttp.ClientSession() as http:
            body = {"model": "tito", "messages": [{"role": "user", "content": "List files."}]}
            headers = {"Authorization": f"Bearer {SID}"}
            async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
                status = r.status
            async with http.post(url + f"/tito/sessions/{SID}/finish", json={"reward": 1.0}) as r:
                finished: dict[str, Any] = await r.json()
    return status, finished


def test_an_engine_that_aborts_every_continuation_gets_the_agent_an_error_and_trains_nothing(tmp_path: Path) -> None:
    """Past `MAX_CONTINUATIONS` the adapter gives up: the agent is told to send it again (the wire's overloaded
    status), and the output it never received is a side turn, never trained."""
    from tito_rl.trajectory.adapters.app import NOT_CONTINUED
    from tito_rl.trajectory.adapters.engine.continuation import MAX_CONTINUATIONS

    path = tmp_path / "aborts.tito"
    status, finished = asyncio.run(_record_aborting_engine(path))
    assert status == 503 and finished == {"samples": []}
    log = read_cassette(path).sessions[session_digest(SID)]
    calls = [e for e in log.engine if record_view(e).generates]
    assert len(calls) == MAX_CONTINUATIONS + 1 and all(record_view(e).finish_reason == "abort" for e in calls)
    assert [len(record_view(e).prompt_ids or []) for e in calls] == [
        len(record_view(calls[0]).prompt_ids or []) + n for n in range(len(calls))
    ]  # each continues the one before by its one token
    assert [(a.status, a.side) for a in log.agent] == [(503, False)]
    assert str(MAX_CONTINUATIONS) in NOT_CONTINUED


def test_joined_keeps_each_channel_aligned_with_the_whole_output() -> None:
    """The join itself: a first call aborted after two tokens (SGLang-style routes from `routed_experts_start_len`
    3), a continuation whose routes hold every row (vLLM sends them all), and an abort before any forward pass."""
    from tito_rl.trajectory.adapters.engine.continuation import joined, routes_end
    from tito_rl.trajectory.adapters.engine.generation import Generation
    from tito_rl.trajectory.channels import KeptSets, Routes, VersionSpan

    def rows(start: int, end: int) -> np.ndarray:
        return np.array([[p, p + 100] for p in range(start, end)], dtype=np.int16)

    first = Generation("r1", [5, 6], [-0.1, -0.2], "abort", 10)  # prompt 10: rows 3..11 (the last token has none)
    first.routes, first.weight_versions = Routes(3, rows(3, 11)), (VersionSpan("1", 0, 2),)
    first.kept = KeptSets(np.array([5, 7, 6], dtype=np.int32), np.array([0, 2, 3], dtype=np.int32))
    nothing = Generation("r2", [], [], "abort", 12)  # aborted while queued: no rows, no tokens, its version only
    nothing.weight_versions = (VersionSpan("2", 0, 0),)
    rest = Generation("r3", [8, 9, 10], [-0.3, -0.4, -0.5], "stop", 12)
    rest.routes, rest.weight_versions = Routes(0, rows(0, 14)), (VersionSpan("2", 0, 3),)
    rest.kept = KeptSets(np.array([8, 9, 10], dtype=np.int32), np.array([0, 1, 2, 3], dtype=np.int32))
    assert routes_end([first], 3) == 11 and routes_end([first, nothing], 3) == 11
    whole = joined([first, nothing, rest], routes_from=3)
    assert (whole.output_ids, whole.output_log_probs, whole.finish_reason) == (
        [5, 6, 8, 9, 10],
        [-0.1, -0.2, -0.3, -0.4, -0.5],
        "stop",
    )
    assert whole.routes is not None and whole.routes.start == 3 and np.array_equal(whole.routes.rows, rows(3, 14))
    assert whole.kept is not None and [whole.kept.of(i) for i in range(5)] == [[5, 7], [6], [8], [9], [10]]
    assert whole.weight_versions == (VersionSpan("1", 0, 2), VersionSpan("2", 2, 5))
    # a call with output and no routes (or a gap) leaves the turn without routes: none is made up
    blind = Generation("r4", [8, 9, 10], [-0.3, -0.4, -0.5], "stop", 12)
    blind.weight_versions = (VersionSpan("1", 0, 3),)
    merged = joined([first, blind], routes_from=3)
    assert merged.routes is None and merged.kept is None
    assert merged.weight_versions == (VersionSpan("1", 0, 5),)  # one version: one span
