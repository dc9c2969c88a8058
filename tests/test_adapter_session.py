"""Session-id resolution, canonical echo comparison, system folding, and the session API over loopback."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.adapter_support import running_stack
from tito_rl.trajectory.adapters.canonical import EchoMemory, fold_system_messages, message, tool_call
from tito_rl.trajectory.adapters.session import resolve_session
from tito_rl.trajectory.adapters.wires import anthropic, openai_chat


def test_session_id_precedence() -> None:
    body = {"metadata": {"session_id": "b1"}, "user": "u1"}
    assert resolve_session({"Authorization": "Bearer t1", "x-api-key": "k1"}, body, "p1").source == "bearer"
    assert resolve_session({"x-api-key": "k1"}, body, "p1").sid == "k1"
    assert resolve_session({}, body, "p1").sid == "b1"
    assert resolve_session({}, {"user": "u1"}, "p1").sid == "u1"
    assert (resolve_session({}, {}, "p1").sid, resolve_session({}, {}, "p1").source) == ("p1", "path")
    assert resolve_session({"Authorization": "Bearer "}, None, None).source == "anonymous"


def test_echo_rewrites_compare_equal() -> None:
    sent = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"a": 1, "b": "x"}},
        ],
    }
    echoed = {
        "content": [
            {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
            {"id": "other", "input": {"b": "x", "a": 1}, "name": "Bash", "type": "tool_use"},
        ],
        "role": "assistant",
    }
    req = {"messages": [{"role": "user", "content": "q"}, sent]}
    again = {"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}, echoed]}
    assert anthropic.parse_request(req).messages == anthropic.parse_request(again).messages
    chat = openai_chat.parse_request(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "Bash", "arguments": '{"a": 1, "b": "x"}'}}
                    ],
                }
            ]
        }
    )
    compact = openai_chat.parse_request(
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"id": "d", "type": "function", "function": {"name": "Bash", "arguments": '{"b":"x","a":1}'}}
                    ],
                }
            ]
        }
    )
    assert chat.messages == compact.messages


def test_echo_memory_restores_dropped_reasoning() -> None:
    memory = EchoMemory()
    reply = message("assistant", "ok", "because", [tool_call("Bash", '{"a": 1}')])
    memory.remember(reply)
    echoed = message("assistant", "ok", None, [tool_call("Bash", '{"a":1}')])
    assert memory.restore([message("user", "q"), echoed])[1] is reply
    other = message("assistant", "ok", "different reasoning", [tool_call("Bash", '{"a":1}')])
    assert memory.restore([other])[0] is other


def test_mid_list_system_messages_are_folded() -> None:
    msgs = [
        message("system", "A"),
        message("system", "B"),
        message("user", "u1"),
        message("system", "env"),
        message("assistant", "x"),
        message("user", "u2"),
    ]
    folded = fold_system_messages(msgs)
    assert [m["role"] for m in folded] == ["system", "user", "assistant", "user"]
    assert folded[0]["content"] == "A\n\nB"
    assert folded[1]["content"] == "u1\n\n<system-reminder>\nenv\n</system-reminder>"


async def test_path_prefix_session_models_health_count_and_drop(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack:
        tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
        payload = {"model": "m", "max_tokens": 8, "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as http:
            async with http.post(stack.url + "/s/pfx-1/v1/messages?beta=true", json=payload) as r:
                assert r.status == 200
            assert stack.manager.sessions() == ["pfx-1"]
            assert stack.tap.agent[0][1] == "path" and stack.tap.agent[0][2].path == "/s/pfx-1/v1/messages"
            async with http.post(stack.url + "/v1/messages/count_tokens", json=payload) as r:
                assert (await r.json())["input_tokens"] == len(stack.double.requests[0]["input_ids"])
            async with http.get(stack.url + "/v1/models") as r:
                assert (await r.json())["data"][0]["object"] == "model"
            async with http.get(stack.url + "/health") as r:
                assert r.status == 200
            async with http.post(stack.url + "/tito/sessions/nope/finish", json={"reward": 1}) as r:
                assert r.status == 404
            async with http.post(stack.url + "/tito/sessions/pfx-1/finish", json={"reward": "x"}) as r:
                assert r.status == 400
            async with http.delete(stack.url + "/tito/sessions/pfx-1") as r:
                assert (await r.json()) == {"dropped": "pfx-1", "known": True}
            assert stack.manager.sessions() == []


def _session(turns: int) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Replies sent, and each turn's history as a client re-sends it: fresh dicts, reasoning dropped,
    arguments re-serialised."""
    replies, histories, history = [], [], [message("user", "fix the bug")]
    for t in range(turns):
        replies.append(message("assistant", f"step {t}", f"think {t}", [tool_call("Read", f'{{"n": {t}}}')]))
        echoed = message("assistant", f"step {t} ", None, [tool_call("Read", f'{{"n":{t}}}')])
        history = [*history, echoed, message("user", f"result {t}")]
        histories.append([json.loads(json.dumps(m)) for m in history])
    return replies, histories


def test_echo_memory_keys_each_echo_once_and_answers_as_keying_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from tito_rl.trajectory.adapters import canonical

    replies, histories = _session(30)
    memo, keyed = EchoMemory(), EchoMemory(histories=0)
    for reply in replies:
        memo.remember(reply)
        keyed.remember(reply)
    calls = []
    real_key = canonical.echo_key

    def counted_key(m):
        calls.append(1)
        return real_key(m)

    monkeypatch.setattr(canonical, "echo_key", counted_key)
    for history in histories:
        restored = memo.restore(history)
        assert all(a is b for a, b in zip(restored, keyed.restore(history), strict=True))
        assert [m for m in restored if m["role"] == "assistant"] == replies[: len(restored) // 2]
    calls.clear()
    memo.restore([json.loads(json.dumps(m)) for m in histories[-1]])
    assert calls == []  # every assistant message was answered before, at its position
    rewritten = [json.loads(json.dumps(m)) for m in histories[-1]]
    rewritten[1] = message("assistant", "step 0, edited by the client", None, [tool_call("Read", '{"n":0}')])
    out = memo.restore(rewritten)
    assert out[1] is rewritten[1] and out[3] is replies[1] and len(calls) == 1  # only the changed one re-keyed


def test_echo_memory_follows_alternating_chains_of_one_session() -> None:
    main_replies, main = _session(6)
    sub_replies = [message("assistant", f"sub {t}", None, [tool_call("Grep", f'{{"q": {t}}}')]) for t in range(6)]
    memory = EchoMemory()
    for a, b in zip(main_replies, sub_replies, strict=True):
        memory.remember(a)
        memory.remember(b)
    sub_history = [message("user", "search")]
    for t in range(6):
        sub_history = [
            *sub_history,
            message("assistant", f"sub {t}", None, [tool_call("Grep", f'{{"q":{t}}}')]),
            message("user", f"hits {t}"),
        ]
        assert memory.restore(main[t])[1::2] == main_replies[: t + 1]
        assert all(a is b for a, b in zip(memory.restore(sub_history)[1::2], sub_replies, strict=False))
