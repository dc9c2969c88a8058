"""The committed real-Claude-Code cassettes of the corpus (sub-agent, auto-compaction, the reasoning-drop pair):
each still holds the event its scenario is for. These read the committed files only (no CLI, no replay), so a
re-recording (`tito simulate`, `make corpus`) that loses a scenario's point fails here, not only its golden."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.scripted_support import SCENARIOS, generations, output_tokens, session_log, statuses, trained_tokens
from tito_rl.cassette.reader import SessionLog, read_cassette
from tito_rl.recorder.agents.cli_script import load_cli_script

CASSETTES = SCENARIOS.parent
PAIR = ("claude_continue_preserved", "claude_continue_dropped")


def only(name: str) -> tuple[SessionLog, dict[str, Any]]:
    """The cassette's one session and its header's agent block."""
    script = load_cli_script(SCENARIOS / f"{name}.yaml")
    (session,) = script.sessions
    cassette = read_cassette(CASSETTES / f"{name}.tito")
    assert not cassette.truncated and cassette.header.agent is not None
    return session_log(cassette, session.id), cassette.header.adapter


def bodies(log: SessionLog) -> list[dict[str, Any]]:
    return [json.loads(a.body) for a in log.agent]


def texts(message: dict[str, Any]) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "\n".join(b.get("text", "") for b in content)


def system_of(body: dict[str, Any]) -> str:
    return "\n".join(b["text"] for b in body["system"])


@pytest.mark.parametrize("name", ["claude_subagent", "claude_compaction", *PAIR])
def test_recorded_by_the_pinned_claude_code(name: str) -> None:
    cassette = read_cassette(CASSETTES / f"{name}.tito")
    assert cassette.header.agent == {
        "client": "claude-code",
        "package": "@anthropic-ai/claude-code",
        "version": "2.1.330",
        "scenario": name,
    }
    assert Path(CASSETTES / f"{name}.golden").is_file()


def test_subagent_runs_between_the_main_threads_turns_on_its_own_system_prompt() -> None:
    log, _ = only("claude_subagent")
    sent = bodies(log)
    assert set(statuses(log)) == {200}
    sub = ["file search specialist" in system_of(b) for b in sent]
    assert sub == [False, False, True, True, True, False, False]  # main, sub-agent, main: interleaved
    agent_tools = {t["name"] for t in sent[0]["tools"]} - {t["name"] for t in sent[2]["tools"]}
    assert "Agent" in agent_tools  # the sub-agent can not start another one
    hand_back = sent[5]["messages"][-1]["content"][0]
    assert hand_back["type"] == "tool_result" and "[Subagent hand-back]" in json.dumps(hand_back)
    assert len(log.samples) == 2 and trained_tokens(log) == output_tokens(generations(log))


def test_compaction_asks_for_a_summary_then_rewrites_the_history() -> None:
    log, _ = only("claude_compaction")
    sent = bodies(log)
    assert set(statuses(log)) == {200}
    asks = ["create a detailed summary of the conversation" in texts(b["messages"][-1]) for b in sent]
    assert asks == [False, False, False, True, False, False]
    rewritten = [texts(b["messages"][0]).startswith("This session is being continued") for b in sent]
    assert rewritten == [False] * 4 + [True] * 2
    prompts = [len(g.request["input_ids"]) for g in generations(log)]
    assert max(prompts[4:]) < prompts[2]  # the rewritten history is shorter than the one before compaction
    assert "00000000-0000-4000-8000-000000000017.jsonl" in texts(sent[4]["messages"][0])  # the pinned uuid
    assert len(log.samples) == 3


@pytest.mark.parametrize("name", PAIR)
def test_continue_reloads_the_first_runs_reasoning(name: str) -> None:
    log, adapter = only(name)
    sent = bodies(log)
    assert statuses(log) == [200] * 4
    assert adapter["preserve_reasoning"] is (name == "claude_continue_preserved")
    second_run = sent[2]["messages"]  # the --continue run's first request
    users = [m for m in second_run if m["role"] == "user" and texts(m) == "Now count its characters."]
    assert len(users) == 1
    thinking = [
        b
        for m in second_run
        if m["role"] == "assistant" and isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "thinking"
    ]
    assert len(thinking) == 2  # both of the first run's turns come back with their reasoning


def test_reasoning_preservation_spares_the_false_fork() -> None:
    preserved, _ = only("claude_continue_preserved")
    dropped, _ = only("claude_continue_dropped")
    assert len(preserved.samples) == 1 and len(dropped.samples) == 2
    for log in (preserved, dropped):
        assert trained_tokens(log) <= output_tokens(generations(log))
    first, _, third, _ = generations(dropped)
    held = first.request["input_ids"] + first.response["output_ids"]
    assert third.request["input_ids"][: len(held)] != held  # the <think> block of turn 0 is gone
    first, _, third, _ = generations(preserved)
    held = first.request["input_ids"] + first.response["output_ids"]
    assert third.request["input_ids"][: len(held)] == held
