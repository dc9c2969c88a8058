"""The committed cassette corpus (`cassettes/*.tito`, re-recorded by `make cassettes` from
`cassettes/scenarios/*.yaml`): each cassette exists, matches its scenario and holds what its scenario is for.
These read the committed files only; a re-recording that loses a scenario's point fails here."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.scripted_support import (
    SCENARIOS,
    generations,
    output_tokens,
    session_log,
    side_flags,
    statuses,
    trained_tokens,
)
from tito_rl.cassette.format.records import DropRecord
from tito_rl.cassette.reader import Cassette, SessionLog, read_cassette
from tito_rl.recorder.agents.cli_script import client_agent, load_cli_script
from tito_rl.recorder.agents.pins import PINS
from tito_rl.recorder.corpus import TARGET_SCENARIOS, CorpusError, scenario_paths, target_missing
from tito_rl.recorder.scripted.script import load_client_script
from tito_rl.recorder.targets import slime_env
from tito_rl.trajectory.adapters.session import session_digest
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

CASSETTES = SCENARIOS.parent
ALL = sorted(p.stem for p in SCENARIOS.glob("*.yaml"))
NAMES = [n for n in ALL if client_agent(SCENARIOS / f"{n}.yaml") == "scripted"]  # the scripted-client ones
CLI_NAMES = [n for n in ALL if n not in NAMES]  # recorded with real CLIs by tito simulate


def load(name: str) -> Cassette:
    return read_cassette(CASSETTES / f"{name}.tito")


def only(name: str) -> SessionLog:
    (sid,) = [s.id for s in load_client_script(SCENARIOS / f"{name}.yaml").sessions]
    return session_log(load(name), sid)


def finishes(records: list) -> list[str]:
    return [e.response["meta_info"]["finish_reason"]["type"] for e in records if e.status == 200]


def test_every_scenario_has_its_cassette_and_every_scripted_cassette_its_scenario() -> None:
    assert len(NAMES) >= 8
    committed = {p.stem: p for p in CASSETTES.glob("*.tito")}
    assert set(ALL) <= set(committed)
    scripted = [n for n, p in committed.items() if (read_cassette(p).header.agent or {}).get("client") == "scripted"]
    assert sorted(scripted) == NAMES
    with pytest.raises(CorpusError, match="no such scenario"):
        scenario_paths(["no_such_scenario"])


@pytest.mark.parametrize("name", CLI_NAMES)
def test_real_cli_cassette_is_complete_and_pins_its_clis(name: str) -> None:
    cassette = load(name)
    assert not cassette.truncated
    script = load_cli_script(SCENARIOS / f"{name}.yaml")
    agent = cassette.header.agent or {}
    assert agent.get("scenario") == name
    if len(script.agents) == 1:
        assert agent["client"] == script.agent and agent["version"] == PINS[script.agent].version
    else:
        assert agent["client"] == "mixed" and agent["agents"] == {a: PINS[a].version for a in script.agents}
    assert {session_digest(s.id) for s in script.sessions} <= set(cassette.sessions)
    assert cassette.header.adapter["splice"] is True  # recorded with the default


@pytest.mark.parametrize("name", NAMES)
def test_cassette_is_complete_small_and_recorded_from_its_scenario(name: str) -> None:
    path = CASSETTES / f"{name}.tito"
    assert path.stat().st_size < 200_000
    cassette = load(name)
    assert not cassette.truncated
    assert cassette.header.agent is not None and cassette.header.agent["client"] == "scripted"
    assert cassette.header.agent["scenario"] == name
    script = load_client_script(SCENARIOS / f"{name}.yaml")
    assert cassette.header.adapter["preserve_reasoning"] is ("--no-preserve-reasoning" not in script.record_args)
    assert cassette.header.adapter["splice"] is ("--no-splice" not in script.record_args)
    for session in script.sessions:
        log = session_log(cassette, session.id)
        assert log.source == "bearer" and log.agent
        ended = [r for r in log.records if isinstance(r, DropRecord)] + log.finishes
        assert len(ended) == 1  # finished or dropped by the script, exactly once


def test_tool_loop_is_one_clean_chain() -> None:
    log = only("tool_loop")
    assert statuses(log) == [200] * 7 and not any(side_flags(log))
    assert [a.path for a in log.agent] == ["/v1/messages"] * 7 and all(a.reply_events for a in log.agent)
    (sample,) = log.samples
    assert sample["reward"] == 1.0 and trained_tokens(log) == output_tokens(generations(log))


@pytest.mark.parametrize("name", ["subagent", "compaction"])
def test_subagent_and_compaction_each_leave_two_chains(name: str) -> None:
    log = only(name)
    assert set(statuses(log)) == {200} and len(log.samples) == 2
    assert trained_tokens(log) == output_tokens(generations(log))
    systems = {json.loads(a.body)["system"][0]["text"] for a in log.agent}
    assert len(systems) == (2 if name == "subagent" else 1)


def test_reasoning_drop_forks() -> None:
    log = only("reasoning_drop_fork")
    assert statuses(log) == [200] * 4
    assert len(log.samples) > 1


def test_drift_realigns_the_short_reply() -> None:
    log = only("drift_realign")
    first, second = generations(log)
    held = first.request["input_ids"] + first.response["output_ids"]
    assert second.request["input_ids"][: len(held)] != held  # the reply came back re-tokenised
    (sample,) = log.samples
    assert sum(sample["loss_mask"]) == len(second.response["output_ids"])  # the drifted reply is context


def test_drift_spliced_trains_every_emitted_token_once() -> None:
    """Every reply drifted, yet each prompt holds the earlier prompt and output as sent and emitted."""
    log = only("drift_spliced")
    engine = generations(log)
    assert statuses(log) == [200] * 4 and len(engine) == 4
    for before, after in zip(engine, engine[1:], strict=False):
        held = before.request["input_ids"] + before.response["output_ids"]
        assert after.request["input_ids"][: len(held)] == held
    tokenizer = load_tokenizer()
    for e in engine:  # the emitted ids are not what re-encoding their text gives
        ids = e.response["output_ids"][:-1]
        assert tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False) != ids
    (sample,) = log.samples
    assert trained_tokens(log) == output_tokens(engine)  # coverage 1.0


def test_retry_529_resends_the_identical_body() -> None:
    log = only("retry_529")
    assert statuses(log) == [200, 529, 200, 200] and [a.retry_of for a in log.agent] == [None, None, 1, None]
    assert log.agent[1].body == log.agent[2].body
    assert [e.status for e in generations(log)] == [200, 529, 200, 200] and len(log.samples) == 1


def test_client_abort_is_a_499_side_exchange_then_a_resend() -> None:
    log = only("client_abort")
    assert statuses(log) == [200, 499, 200, 200] and side_flags(log) == [False, True, False, False]
    assert log.agent[2].retry_of == 1 and log.agent[1].body == log.agent[2].body
    assert [e.path for e in log.engine].count("/abort_request") == 1
    assert finishes(generations(log)) == ["stop", "abort", "stop", "stop"] and len(log.samples) == 1


def test_length_truncated_turn_then_the_client_goes_on() -> None:
    log = only("length_truncated")
    assert statuses(log) == [200] * 3 and all(a.reply_events is None for a in log.agent)  # JSON replies
    assert finishes(generations(log)) == ["stop", "length", "stop"]
    reply = log.agent[1].reply_body
    assert reply is not None and json.loads(reply)["stop_reason"] == "max_tokens"
    assert json.loads(log.agent[2].body)["messages"][-1]["content"][0]["text"].startswith("Your answer was cut off")


def test_openai_wires_one_finished_one_dropped() -> None:
    cassette = load("openai_wires")
    chat = session_log(cassette, "corpus-openai-chat-0000")
    responses = session_log(cassette, "corpus-openai-responses-0000")
    assert {a.path for a in chat.agent} == {"/v1/chat/completions"} and len(chat.samples) == 1
    assert {a.path for a in responses.agent} == {"/v1/responses"} and not responses.samples
    assert isinstance(responses.records[-1], DropRecord)
    assert json.loads(responses.agent[0].body)["input"][0]["role"] == "developer"
    assert set(statuses(chat) + statuses(responses)) == {200}


def test_scenario_paths_default_to_every_scenario() -> None:
    around = sorted(p.stem for p in TARGET_SCENARIOS.glob("*.yaml"))
    assert "slime_mixed" in around
    assert [p.stem for p in scenario_paths([])] == ALL + around
    assert scenario_paths(["tool_loop.yaml"]) == [Path(SCENARIOS / "tool_loop.yaml")]
    assert scenario_paths(["slime_mixed"]) == [TARGET_SCENARIOS / "slime_mixed.yaml"]


def test_a_scenario_around_a_target_not_installed_is_skipped_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    assert target_missing(SCENARIOS / "tool_loop.yaml") is None  # tito's adapter: always here
    monkeypatch.delenv("TITO_SLIME_PATH", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)  # no slime on the path
    # slime imported earlier in this process (a TITO_SLIME_PATH run) is remembered: look again, as a new process would
    from tito_rl.recorder.targets import slime

    monkeypatch.setattr(slime, "import_slime", slime_env.import_slime.__wrapped__)
    why = target_missing(TARGET_SCENARIOS / "slime_mixed.yaml")
    assert why is not None and "TITO_SLIME_PATH" in why
