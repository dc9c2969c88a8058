"""What an agent reads in a reply (`replayer/comparison/reply_meaning.py`), the basis of the conformance table's
reply column: real replies of tito's adapter and of slime's from the committed cassettes, on all four wires, JSON
and SSE, and the shapes other gateways send that tito's adapter does not."""

from __future__ import annotations

import json
from pathlib import Path

from tests.scripted_support import session_log
from tito_rl.cassette.reader import read_cassette
from tito_rl.replayer.comparison.reply_meaning import Meaning, meaning

CASSETTES = Path(__file__).resolve().parent.parent / "cassettes"


def reading(cassette: str, session: str | None, exchange: int) -> Meaning:
    loaded = read_cassette(CASSETTES / cassette)
    log = session_log(loaded, session) if session else next(iter(loaded.sessions.values()))
    record = log.agent[exchange]
    return meaning(record.path, record.status, record.reply_body, record.reply_events)


def sse(*payloads: dict) -> list[str]:
    return [f"data: {json.dumps(p)}\n\n" for p in payloads]


def test_tito_s_replies_on_the_four_wires() -> None:
    parallel = reading("tool_loop.tito", "corpus-tool-loop-0000", 3)  # Anthropic SSE, two calls at once
    grep = {"command": 'grep -n "def divide" src/calc.py', "description": "Find divide"}
    assert parallel == Meaning(
        200,
        "",
        "test_divide_by_zero fails. I read the source and find the divide function at the same time.",
        [("Read", {"file_path": "/work/src/calc.py"}), ("Bash", grep)],
        "tool_calls",
    )
    responses = reading("openai_wires.tito", "corpus-openai-responses-0000", 0)  # Responses SSE
    assert responses == Meaning(
        200, "", "Check the git status.", [("exec_command", {"cmd": "git status --short"})], "tool_calls"
    )
    chat = reading("openai_wires.tito", "corpus-openai-chat-0000", 2)  # Chat SSE, the last answer
    assert (chat.text, chat.reasoning, chat.tool_calls, chat.stop) == (
        "The largest file is src/big.py (120 KB), a generated lookup table.",
        "It is a generated table.",
        [],
        "stop",
    )
    gemini = reading("gemini_tool_loop.tito", None, 1)  # Gemini SSE: thought parts are reasoning, not text
    assert gemini.text == "Checking the file." and gemini.reasoning.startswith("The command printed nothing")
    assert [name for name, _ in gemini.tool_calls] == ["read_file", "run_shell_command"]
    assert reading("retry_529.tito", "corpus-retry-529-0000", 1) == Meaning(529)  # an error: its status only


def test_slime_s_replies_json_and_sse() -> None:
    sse_reply = reading("targets/slime_mixed.tito", "slime-anthropic-sse", 1)
    assert [name for name, _ in sse_reply.tool_calls] == ["Read", "Read"] and sse_reply.stop == "tool_calls"
    json_reply = reading("targets/slime_mixed.tito", "slime-anthropic-json", 2)
    assert json_reply.tool_calls == [("Read", {"file_path": "/work/config/settings.toml"})]
    assert json_reply.reasoning == "\nsettings.toml is there. Read it.\n"  # slime keeps the parser's newlines
    chat = reading("targets/slime_mixed.tito", "slime-chat-sse", 0)
    assert chat.tool_calls == [("read_file", {"absolute_path": "/work/a.txt"})] and chat.text == ""
    last = reading("targets/slime_mixed.tito", "slime-chat-sse", 2)
    assert last.text == "a.txt says alpha; b.txt has 2 lines.<|im_end|>" and last.stop == "stop"


def test_differences_an_agent_would_notice_and_those_it_would_not() -> None:
    tito = Meaning(200, "The notes say Friday.", "Read the notes.", [("Read", {"file_path": "/a"})], "stop")
    assert (
        tito.differences(
            Meaning(200, "\nThe notes say Friday.\n", "\nRead the notes.\n", [("Read", {"file_path": "/a"})], "stop")
        )
        == []
    )  # surrounding whitespace
    leaked = Meaning(200, "The notes say Friday." * 5 + "<|im_end|>", "Read the notes.", tito.tool_calls, "stop")
    (line,) = Meaning(200, "The notes say Friday." * 5, "Read the notes.", tito.tool_calls, "stop").differences(leaked)
    assert line.startswith("text: '…") and "<|im_end|>'" in line  # where the two differ, not their shared start
    dropped = Meaning(200, tito.text, "", [], None)
    assert [d.split(":")[0] for d in tito.differences(dropped)] == ["reasoning", "tool calls", "stop reason"]
    assert Meaning(200).differences(Meaning(500)) == ["status: 200 vs 500"]


def test_other_gateways_stream_shapes() -> None:
    # a chat stream whose first tool-call chunk carries the name and no arguments key at all
    chat = meaning(
        "/v1/chat/completions",
        200,
        None,
        sse(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning": "Look."}}]},
            {
                "choices": [
                    {"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "ls"}}]}}
                ]
            },
            {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"pa'}}]}}]},
            {
                "choices": [
                    {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'th": "/"}'}}]}}
                ]
            },
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ),
    )
    assert chat == Meaning(200, "", "Look.", [("ls", {"path": "/"})], "tool_calls")
    # an Anthropic stream that sends a tool call's whole input in its start and no input_json_delta
    anthropic = meaning(
        "/v1/messages",
        200,
        None,
        sse(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm."}},
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "t", "name": "ls", "input": {"path": "/"}},
            },
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}},
        ),
    )
    assert anthropic == Meaning(200, "", "Hm.", [("ls", {"path": "/"})], "tool_calls")
    # Responses JSON with reasoning as content rather than summary
    responses = meaning(
        "/v1/responses",
        200,
        json.dumps(
            {
                "object": "response",
                "status": "completed",
                "output": [
                    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Think."}]},
                    {"type": "message", "content": [{"type": "output_text", "text": "Done."}]},
                ],
            }
        ).encode(),
        None,
    )
    assert responses == Meaning(200, "Done.", "Think.", [], "stop")
