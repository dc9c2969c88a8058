"""Replay through the real adapter app and manager: clean replays reproduce the live samples, and each kind of
change (chat template, fork threshold, argument serialization, reply bytes) is reported at its first point."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fake_engine_helpers import until_in_flight
from tests.replay_support import WIRE, Live, record, tool_loop, tool_loop_scenario
from tito_rl.replayer.goldens import files as goldens
from tito_rl.replayer.pytest_plugin.fixtures import replay
from tito_rl.replayer.replay.cassette_replay import replay_cassette
from tito_rl.replayer.replay.loading import ReplayInputError
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.replayer.reporting import exports
from tito_rl.trajectory.adapters import canonical
from tito_rl.trajectory.adapters.session import session_digest
from tito_rl.trajectory.adapters.wires import anthropic
from tito_rl.trajectory.golden import TokenizerNames
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

MAIN, OTHER = "live-token-main-0001", "live-token-other-0002"


def _named(samples: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Live samples as the cassette stores them: the live session id replaced by the session's name."""
    return [{**s, "metadata": {**s["metadata"], "session": name}} for s in samples]


@pytest.fixture(scope="module")
def loop_cassette(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    path = tmp_path_factory.mktemp("loop") / "loop.tito"

    async def drive(live: Live) -> None:
        await tool_loop(live.conversation(MAIN, stream=True))
        await live.finish(MAIN, 1.0)

    return path, record(path, tool_loop_scenario(4), drive)[MAIN]


def test_a_recorded_tool_loop_replays_clean_and_reproduces_the_live_samples(loop_cassette) -> None:
    path, live = loop_cassette
    result = replay_cassette(path)
    (session,) = result.sessions
    assert session.session == session_digest(MAIN) and not session.differences, session.differences
    assert session.exchanges == 4 and session.counts()["turns"] == 4
    (finish,) = session.finishes
    assert finish.reward == 1.0 and finish.samples == finish.live == _named(live, session.session)
    assert session.ok and session.status() == "ok"


def test_replay_is_deterministic_whatever_the_concurrency(tmp_path: Path) -> None:
    path = tmp_path / "three.tito"

    async def drive(live: Live) -> None:
        sids = [f"live-token-{i}-abcdef" for i in range(3)]
        await asyncio.gather(*(tool_loop(live.conversation(sid)) for sid in sids))
        for sid in sids:
            await live.finish(sid, 0.5)

    record(path, tool_loop_scenario(3), drive)
    names = TokenizerNames(load_tokenizer())
    runs = []
    for jobs in (1, 3, 3):
        result = replay_cassette(path, options=ReplayOptions(jobs=jobs))
        assert result.ok, [s.differences for s in result.sessions]
        runs.append(
            (
                [goldens.section(s, names) for s in result.sessions],
                list(exports.replayed_rows([result])),
                [s.line() for s in result.sessions],
            )
        )
    assert runs[0] == runs[1] == runs[2]
    assert len(runs[0][1]) == 3 and all(json.loads(row)["reward"] == 0.5 for row in runs[0][1])


def test_a_changed_chat_template_fails_at_its_first_changed_token_and_update_goldens_shows_it(
    loop_cassette, tmp_path: Path
) -> None:
    path = tmp_path / "loop.tito"
    path.write_bytes(loop_cassette[0].read_bytes())
    assert replay(path, update_goldens=True).ok  # the golden of the recording
    template = load_tokenizer().chat_template.replace("'\\n</tool_response>'", "'\\n</tool_response>\\n'")
    assert template != load_tokenizer().chat_template
    changed: dict[str, Any] = {"adapter": {"chat_template": template}}

    result = replay(path, **changed)
    (session,) = result.sessions
    first = session.differences[0]
    assert not session.ok and len(session.differences) == 1  # a session stops at its first difference
    report = first.render(str(path), session.session)
    assert first.kind == "engine-request" and first.exchange == 1 and first.turn == 1
    assert f"session {session.session}" in report and "agent exchange 1, turn 1" in report
    assert "input_ids at token" in report and "</tool_response>" in report
    assert "rendered message" in report and "(user)" in report  # the tool result's message

    result = replay(path, update_goldens=True, **changed)
    (session,) = result.sessions
    assert session.ok and session.golden == "updated"
    diff = "\n".join(session.golden_diff)
    assert "-  sample 0" in diff and "+  sample 0" in diff  # the sample's sizes changed
    assert replay(path, **{**changed, "strict": False}).sessions[0].golden == "ok"


def test_a_changed_fork_threshold_fails_in_the_samples_and_update_goldens_shows_the_fork(tmp_path: Path) -> None:
    path = tmp_path / "drift.tito"

    async def drive(live: Live) -> None:
        await tool_loop(live.conversation(MAIN))
        await live.finish(MAIN, 1.0)

    record(path, tool_loop_scenario(3, t0={"drift": True}), drive, splice=False)  # the drift reaches the manager
    result = replay(path, update_goldens=True)
    assert result.ok and result.sessions[0].counts()["realigns"] == 1

    result = replay(path, manager={"fork_threshold_tokens": 0})
    (session,) = result.sessions
    first = session.differences[0]
    report = first.render(str(path), session.session)
    # Live, turn 1's prompt realigned turn 0's drifted reply; now that reply is kept as generated, and forks.
    assert first.kind == "samples" and first.turn == 0, report
    assert f"session {session.session}, turn 0: samples differ at finish 1: sample 0: tokens differ" in report
    assert "in turn 0's response" in report and "live: …" in report and "replayed: …" in report
    assert "the replay decided: fork(threshold) turn=1" in report

    result = replay(path, update_goldens=True, manager={"fork_threshold_tokens": 0})
    session = result.sessions[0]
    assert session.golden == "updated" and session.counts()["forks"] == {"threshold": 1}
    diff = "\n".join(session.golden_diff)
    assert "-  realign(divergence inside the response of turn 0) turn=1" in diff
    assert "+  fork(threshold) turn=1" in diff


def test_a_changed_argument_serialization_fails_at_the_echoed_call(loop_cassette, monkeypatch, tmp_path: Path) -> None:
    """An adapter change that sorts tool-call argument keys: the model wrote `description` before `command`,
    so the echoed call renders differently from what the model generated. Spliced, the prompt holds the
    model's own ids and the change cannot reach it; rendered (--no-splice), it fails at the echoed call."""
    path, _ = loop_cassette
    original = canonical.arguments_value

    def sorted_keys(arguments: Any) -> dict[str, Any]:
        return dict(sorted(original(arguments).items()))

    monkeypatch.setattr(canonical, "arguments_value", sorted_keys)
    assert replay_cassette(path).ok
    result = replay_cassette(path, options=ReplayOptions(adapter={"splice": False}))
    first = result.sessions[0].differences[0]
    report = first.render(str(path), result.sessions[0].session)
    assert first.kind == "engine-request" and first.exchange == 1 and first.turn == 1, report
    assert "rendered message" in report and "(assistant)" in report and '"command"' in report
    assert "input_ids at token" in report

    copy = tmp_path / "loop.tito"
    copy.write_bytes(path.read_bytes())
    monkeypatch.setattr(canonical, "arguments_value", original)
    assert replay(copy, update_goldens=True).ok  # the golden of the recording
    monkeypatch.setattr(canonical, "arguments_value", sorted_keys)
    session = replay(copy, update_goldens=True, adapter={"splice": False}).sessions[0]
    assert session.ok and session.golden == "updated" and session.accepted[0].kind == "engine-request"
    assert any(line.startswith("+  realign(divergence inside the response of turn 0)") for line in session.golden_diff)


def test_a_changed_reply_is_reported_as_a_json_path(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "json.tito"

    async def drive(live: Live) -> None:
        await tool_loop(live.conversation(MAIN))  # JSON replies, not SSE
        await live.finish(MAIN, 1.0)

    record(path, tool_loop_scenario(2), drive)
    original = anthropic.build_json

    def changed(request: Any, reply: Any) -> dict[str, Any]:
        body = original(request, reply)
        for block in body["content"]:
            if block["type"] == "tool_use":
                block["input"] = {**block["input"], "command": "rm -rf /"}
        return body

    monkeypatch.setattr(anthropic, "build_json", changed)
    first = replay_cassette(path).sessions[0].differences[0]
    assert first.kind == "reply" and first.exchange == 0
    assert first.detail[0].startswith("body: content[") and first.detail[0].endswith("].input.command")
    assert first.detail[1:] == ["recorded: 'ls dir0'", "replayed: 'rm -rf /'"]


def test_aborts_engine_failures_retries_probes_and_side_requests_replay_as_they_happened(tmp_path: Path) -> None:
    path = tmp_path / "faults.tito"

    async def drive(live: Live) -> None:
        c = live.conversation(MAIN)
        async with live.http.head(live.url + "/api/hello", headers={"Authorization": f"Bearer {MAIN}"}) as probe:
            assert probe.status == 200
        title = live.conversation(MAIN, tools=(), system="You are a title generator. Output only a title.")
        await title.turn("Summarise this conversation in five words.")
        c.messages.append(WIRE.user("look around"))
        status, _ = await c.post()  # the engine answers 529: the adapter fails the turn (overloaded_error)
        assert status == 529
        reply = await c.turn()  # the client's retry of the same body
        c.tool_results(reply)
        side = live.manager.stats(MAIN).side_turns
        with pytest.raises(TimeoutError):
            await c.post(timeout_s=0.3)  # slow generation: the client hangs up, the adapter aborts
        for _ in range(12_000):  # the abort done and kept as a side turn, before the retry: a hang's bound (120 s)
            if live.manager.stats(MAIN).side_turns > side:
                break
            await asyncio.sleep(0.01)
        await c.turn()
        await live.finish(MAIN, 1.0)

    scenario = tool_loop_scenario(3, t0={"status": 529}, t1={"token_delay_ms": 40})
    scenario["turns"][0]["fault_attempts"] = 1  # the client's retry is answered
    title = {"match": {"prompt_contains": "five words"}, "turns": [{"text": "Looking around the repo"}]}
    scenario["sessions"] = [title, {"turns": scenario.pop("turns")}]
    record(path, scenario, drive)
    (session,) = replay_cassette(path).sessions
    assert session.ok, session.differences
    assert session.exchanges == 6 and session.counts()["turns"] == 2 and session.counts()["side"] == 2
    assert session.wire_events == [  # what the golden lists above the tree
        "#2 answered 529, engine /generate 529, no turn",
        "#3 retry of #2 (identical body): generated again -> turn 0",
        "#4 client gone mid-generation, engine request aborted, no turn",
        "#5 retry of #4 (identical body): generated again -> turn 1",
    ]
    records = _agent_records(path)
    assert [(r.method, r.status, r.side) for r in records] == [
        ("HEAD", 200, True),
        ("POST", 200, True),
        ("POST", 529, False),
        ("POST", 200, False),
        ("POST", 499, True),
        ("POST", 200, False),
    ]


def _agent_records(path: Path) -> list[Any]:
    from tito_rl.cassette.reader import read_cassette

    return [r for log in read_cassette(path).sessions.values() for r in log.agent]


def test_drops_and_unfinished_sessions_replay_and_are_linearized_with_reward_0(tmp_path: Path) -> None:
    path = tmp_path / "two.tito"

    async def drive(live: Live) -> None:
        await tool_loop(live.conversation(MAIN))
        await tool_loop(live.conversation(OTHER))
        await live.drop(OTHER)

    record(path, tool_loop_scenario(2), drive)
    result = replay(path, update_goldens=True)
    main, other = result.sessions
    assert result.ok and other.drops == 1 and not other.finishes
    assert main.finishes[0].live is None and main.finishes[0].reward == 0.0 and main.finishes[0].samples
    assert main.status() == "ok, golden written, no live samples"
    text = goldens.golden_path(path).read_text()
    assert "live samples none (never finished live)" in text and f"== session {other.session} ==" in text


def test_overlapping_requests_of_one_session_replay_in_their_live_order(tmp_path: Path) -> None:
    """A sub-agent's request is sent while the main thread's second turn is in flight, and ends first."""
    path = tmp_path / "overlap.tito"
    # the main thread's second turn is answered 1.5 s after it reaches the engine: the window the sub-agent's turn
    # (tens of milliseconds, a few hundred on a loaded machine) is sent and answered in
    scenario = tool_loop_scenario(2, t1={"latency_ms": 1500})

    async def drive(live: Live) -> None:
        main = live.conversation(MAIN)
        sub = live.conversation(MAIN, system="You are a sub-agent. Search quickly.")
        main.tool_results(await main.turn("Do the whole task."))
        main_turn = asyncio.ensure_future(main.turn())
        await until_in_flight(live.engine)  # the main thread's turn is at the engine
        await sub.turn("Search the code.")  # its first turn: answered at once
        await main_turn
        await live.finish(MAIN, 1.0)

    live = record(path, scenario, drive)
    records = _agent_records(path)
    assert [r.turn_index for r in records] == [0, 1, 2] and records[2].started_s < records[1].started_s
    (session,) = replay_cassette(path).sessions
    assert session.ok, session.differences
    assert session.finishes[0].samples == _named(live[MAIN], session.session)
    leaves = [n for n in session.finishes[0].tree["nodes"] if n["leaf"]]
    assert sorted(n["turn"] for n in leaves) == [1, 2]


def test_a_retry_sent_while_its_original_is_in_flight_replays_with_both_generations(tmp_path: Path) -> None:
    """Live, the retry found no completed original to answer from, so it was generated again and recorded as a
    side turn. Replayed in answer order alone it would hit the retry cache: the plan starts it before the
    original ends, as it was."""
    path = tmp_path / "inflight.tito"

    async def drive(live: Live) -> None:
        c = live.conversation(MAIN)
        c.messages.append(WIRE.user("look around"))
        body = c.body()
        original = asyncio.ensure_future(c.post(body))
        await until_in_flight(live.engine)  # the original is at the engine, answered 1.5 s later
        assert (await c.post(body))[0] == 200
        assert (await original)[0] == 200
        await live.finish(MAIN, 1.0)

    record(path, tool_loop_scenario(2, t0={"latency_ms": 1500}), drive)
    first, retry = _agent_records(path)
    assert retry.retry_of == 0  # the first exchange the session answered
    assert (first.side, retry.side) == (False, True) and retry.started_s < first.started_s + first.duration_s
    (session,) = replay_cassette(path).sessions
    assert session.ok, session.differences
    assert session.counts()["turns"] == 1 and session.counts()["side"] == 1


def test_one_session_is_replayed_when_named_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "two.tito"

    async def drive(live: Live) -> None:
        for sid in (MAIN, OTHER):
            await tool_loop(live.conversation(sid))
            await live.finish(sid, 1.0)

    record(path, tool_loop_scenario(2), drive)
    result = replay_cassette(path, [session_digest(OTHER)])
    assert [s.session for s in result.sessions] == [session_digest(OTHER)] and result.ok
    assert result.all_sessions == [session_digest(MAIN), session_digest(OTHER)]
    with pytest.raises(ReplayInputError, match="no session 'sid-nope'"):
        replay_cassette(path, ["sid-nope"])
