"""Session-id resolution, canonical echo comparison, system folding, and the session API over loopback."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.adapter_support import running_stack
from trajectory.adapters import anthropic, openai_chat
from trajectory.adapters.canonical import EchoMemory, fold_system_messages, message, tool_call
from trajectory.adapters.session import resolve_session


def test_session_id_precedence() -> None:
    body = {"metadata": {"session_id": "b1"}, "user": "u1"}
    assert resolve_session({"Authorization": "Bearer t1", "x-api-key": "k1"}, body, "p1").source == "bearer"
    assert resolve_session({"x-api-key": "k1"}, body, "p1").sid == "k1"
    assert resolve_session({}, body, "p1").sid == "b1"
    assert resolve_session({}, {"user": "u1"}, "p1").sid == "u1"
    assert (resolve_session({}, {}, "p1").sid, resolve_session({}, {}, "p1").source) == ("p1", "path")
    assert resolve_session({"Authorization": "Bearer "}, None, None).source == "anonymous"


def test_echo_rewrites_compare_equal() -> None:
    sent = {"role": "assistant", "content": [{"type": "text", "text": "hi"}, {
        "type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"a": 1, "b": "x"}}]}
    echoed = {"content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}},
                          {"id": "other", "input": {"b": "x", "a": 1}, "name": "Bash", "type": "tool_use"}],
              "role": "assistant"}
    req = {"messages": [{"role": "user", "content": "q"}, sent]}
    again = {"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}, echoed]}
    assert anthropic.parse_request(req).messages == anthropic.parse_request(again).messages
    chat = openai_chat.parse_request({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "Bash", "arguments": '{"a": 1, "b": "x"}'}}]}]})
    compact = openai_chat.parse_request({"messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "d", "type": "function", "function": {"name": "Bash", "arguments": '{"b":"x","a":1}'}}]}]})
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
    msgs = [message("system", "A"), message("system", "B"), message("user", "u1"), message("system", "env"),
            message("assistant", "x"), message("user", "u2")]
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
