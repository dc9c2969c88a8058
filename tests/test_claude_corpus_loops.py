"""The committed real-Claude-Code cassettes of the corpus for tool loops, parallel calls, thinking and cut
replies: each still holds the event its scenario is for. These read the committed files only (no CLI, no
replay), so a re-recording (`tito simulate`, `make corpus`) that loses a scenario's point fails here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.scripted_support import SCENARIOS, generations, session_log, statuses
from tito_rl.cassette.reader import SessionLog, read_cassette
from tito_rl.recorder.agents.cli_script import load_cli_script

CASSETTES = SCENARIOS.parent
NAMES = ("claude_tool_loop", "claude_parallel_calls", "claude_thinking", "claude_length_truncated")
RESUME = "Output token limit hit. Resume directly"


def only(name: str) -> SessionLog:
    (session,) = load_cli_script(SCENARIOS / f"{name}.yaml").sessions
    cassette = read_cassette(CASSETTES / f"{name}.tito")
    assert not cassette.truncated
    return session_log(cassette, session.id)


def bodies(log: SessionLog) -> list[dict[str, Any]]:
    return [json.loads(a.body) for a in log.agent]


def replied_blocks(log: SessionLog) -> list[list[dict[str, Any]]]:
    """Each streamed reply's content blocks, rebuilt from its events."""
    replies = []
    for record in log.agent:
        blocks: list[dict[str, Any]] = []
        for event in record.reply_events or []:
            data = json.loads(event.split("data: ", 1)[1])
            if data["type"] == "content_block_start":
                blocks.append(dict(data["content_block"]))
            elif data["type"] == "content_block_delta":
                delta, block = data["delta"], blocks[data["index"]]
                for key in ("thinking", "signature", "text", "partial_json"):
                    if key in delta:
                        block[key] = block.get(key, "") + delta[key]
        replies.append(blocks)
    return replies


def stop_reasons(log: SessionLog) -> list[str]:
    out = []
    for record in log.agent:
        for event in record.reply_events or []:
            data = json.loads(event.split("data: ", 1)[1])
            if data["type"] == "message_delta":
                out.append(data["delta"]["stop_reason"])
    return out


def tool_results(message: dict[str, Any]) -> list[str]:
    return [b["content"] for b in message["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]


def last_user_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content)


@pytest.mark.parametrize("name", NAMES)
def test_recorded_by_the_pinned_claude_code_and_finished(name: str) -> None:
    cassette = read_cassette(CASSETTES / f"{name}.tito")
    assert cassette.header.agent == {
        "client": "claude-code",
        "package": "@anthropic-ai/claude-code",
        "version": "2.1.330",
        "scenario": name,
    }
    log = only(name)
    assert set(statuses(log)) == {200} and log.finishes and log.finishes[0].reward == 1.0
    assert (CASSETTES / f"{name}.golden").is_file()


def test_tool_loop_runs_six_real_commands_and_their_output_comes_back() -> None:
    sent = bodies(only("claude_tool_loop"))
    assert len(sent) == 7
    results = [tool_results(b["messages"][-1])[0] for b in sent[1:]]
    assert results == [
        "(Bash completed with no output)",
        "words.txt",
        "alpha\nbeta\ngamma",
        "3 demo/words.txt",
        "14",
        "gamma\nbeta",
    ]


def test_parallel_calls_come_back_in_one_user_message_in_call_order() -> None:
    log = only("claude_parallel_calls")
    sent, replies = bodies(log), replied_blocks(log)
    for turn, count in ((1, 3), (2, 2)):
        calls = [b["id"] for b in replies[turn] if b["type"] == "tool_use"]
        answer = sent[turn + 1]["messages"][-1]["content"]
        assert len(calls) == count and [b["tool_use_id"] for b in answer] == calls
    assert tool_results(sent[2]["messages"][-1]) == [
        "1\tone\n2\ttwo\n3\t",
        "1\tthree\n2\t",
        " 2 a.txt\n 1 b.txt\n 3 total",
    ]
    assert tool_results(sent[3]["messages"][-1]) == ["one\nthree\ntwo", "8"]


def test_thinking_blocks_come_back_byte_identical_and_a_thinking_only_reply_is_replaced_by_a_nudge() -> None:
    log = only("claude_thinking")
    sent, replies = bodies(log), replied_blocks(log)
    assert sent[0]["thinking"]["type"] == "adaptive"
    for turn in (0, 1):
        thinking = replies[turn][0]
        assert thinking["type"] == "thinking" and thinking["signature"]
        echoed = sent[turn + 1]["messages"][2 + 2 * turn]["content"][0]
        assert echoed == {"type": "thinking", "thinking": thinking["thinking"], "signature": thinking["signature"]}
    assert [b["type"] for b in replies[2]] == ["thinking"]  # turn 2 only thinks
    assert len(sent[3]["messages"]) == len(sent[2]["messages"])  # dropped, and the nudge joins the tool result
    assert last_user_text(sent[3]).startswith("[Your previous response had no visible output.")


def test_cut_replies_in_text_thinking_and_tool_call_and_what_claude_code_does_after() -> None:
    log = only("claude_length_truncated")
    sent, replies = bodies(log), replied_blocks(log)
    finishes = [g.response["meta_info"]["finish_reason"]["type"] for g in generations(log)]
    assert finishes == ["stop", "length", "stop", "length", "stop", "length", "stop", "stop"]
    assert stop_reasons(log) == [
        "tool_use",
        "max_tokens",
        "tool_use",
        "max_tokens",
        "tool_use",
        "max_tokens",
        "tool_use",
        "end_turn",
    ]
    # cut in its text: kept in the history, then the nudge
    assert sent[2]["messages"][-2]["content"][-1]["text"].endswith("the second is")
    assert last_user_text(sent[2]).startswith(RESUME)
    # cut in its thinking: the reply is dropped, the nudge follows the last tool result
    assert [b["type"] for b in replies[3]] == ["thinking"]
    assert len(sent[4]["messages"]) == len(sent[3]["messages"])
    assert replies[3][0]["thinking"] not in json.dumps(sent[4])
    assert tool_results(sent[4]["messages"][-1]) == ["alpha\nbeta\ngamma"]
    assert last_user_text(sent[4]).startswith(RESUME)
    # cut in its tool call: the adapter hands the partial call back as text, which Claude Code keeps
    cut = replies[5][-1]
    assert cut["type"] == "text" and cut["text"].startswith("<tool_call>") and cut["text"].endswith("&&")
    assert sent[6]["messages"][-2]["content"][-1] == {"type": "text", "text": cut["text"]}
    assert last_user_text(sent[6]).startswith(RESUME)
