"""Every captured real CLI request (Claude Code, Codex, Qwen Code, opencode) through the adapter on loopback.

The engine double is scripted with the model output that yields the reply the capture's stub sent, so the
CLI's real next request (its echo of that reply) must route onto the same chain: no fork, one sample.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import aiohttp
import pytest
from pydantic import TypeAdapter

from tests.adapter_support import HTTP_SCENARIOS, load_capture, running_stack, script_for

SKIP_HEADERS = {"host", "content-length", "accept-encoding", "connection", "authorization", "x-api-key"}


def events_of(raw: str) -> list[tuple[str | None, str]]:
    out = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        event = None
        data = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        out.append((event, "\n".join(data)))
    return out


@cache
def _adapters() -> tuple[Any, Any, Any]:
    from anthropic.types import RawMessageStreamEvent
    from openai.types.chat import ChatCompletionChunk
    from openai.types.responses import ResponseStreamEvent

    return TypeAdapter(RawMessageStreamEvent), TypeAdapter(ResponseStreamEvent), ChatCompletionChunk


def validate_stream(path: str, raw: str) -> list[Any]:
    """Parse each event with the official SDK's own event model; returns the parsed events."""
    anthropic_events, response_events, chunk_model = _adapters()
    parsed = []
    for event, data in events_of(raw):
        if data == "[DONE]":
            continue
        payload = json.loads(data)
        if path.endswith("/v1/messages"):
            assert event == payload["type"]
            parsed.append(anthropic_events.validate_python(payload))
        elif path.endswith("/v1/responses"):
            assert event == payload["type"]
            parsed.append(response_events.validate_python(payload))
        else:
            parsed.append(chunk_model.model_validate(payload))
    return parsed


def logical_reply(path: str, events: list[Any]) -> dict[str, Any]:
    """The reply content in the capture's summary shape, rebuilt from the parsed stream."""
    if path.endswith("/v1/messages"):
        blocks: list[dict[str, Any]] = []
        for e in events:
            if e.type == "content_block_start":
                blocks.append(e.content_block.model_dump())
                blocks[-1]["_json"] = ""
            elif e.type == "content_block_delta":
                d = e.delta
                if d.type == "text_delta":
                    blocks[-1]["text"] += d.text
                elif d.type == "thinking_delta":
                    blocks[-1]["thinking"] += d.thinking
                elif d.type == "input_json_delta":
                    blocks[-1]["_json"] += d.partial_json
        out = []
        for b in blocks:
            if b["type"] == "tool_use":
                out.append({"type": "tool_use", "name": b["name"], "input": json.loads(b["_json"])})
            elif b["type"] == "text":
                out.append({"type": "text", "text": b["text"]})
            else:
                out.append({"type": "thinking", "thinking": b["thinking"]})
        return {"blocks": out, "stop_reason": next(e.delta.stop_reason for e in events if e.type == "message_delta")}
    if path.endswith("/v1/responses"):
        done = [e.item for e in events if e.type == "response.output_item.done"]
        assert events[-1].type == "response.completed"
        assert [i.id for i in events[-1].response.output] == [i.id for i in done]
        return {"items": [_item(i.model_dump()) for i in done]}
    content, calls, finish = "", [], None
    for chunk in events:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for c in choice.delta.tool_calls or []:
                calls.append({"name": c.function.name, "arguments": json.loads(c.function.arguments)})
            finish = choice.finish_reason or finish
    return {"content": content, "tool_calls": calls, "finish_reason": finish}


def _item(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "message":
        return {"type": "message", "text": "".join(c["text"] for c in item["content"])}
    if item["type"] == "function_call":
        return {"type": "function_call", "name": item["name"], "arguments": json.loads(item["arguments"])}
    return {"type": "reasoning", "text": "".join(s["text"] for s in item["summary"])}


def expected_reply(path: str, reply: dict[str, Any]) -> dict[str, Any]:
    if path.endswith("/v1/messages"):
        blocks = []
        for b in reply["blocks"]:
            if b["type"] == "tool_use":
                blocks.append({"type": "tool_use", "name": b["name"], "input": b["input"]})
            else:
                blocks.append({k: b[k] for k in ("type", b["type"])})
        return {"blocks": blocks, "stop_reason": reply["stop_reason"]}
    if path.endswith("/v1/responses"):
        items = []
        for i in reply["items"]:
            if i["type"] == "reasoning":
                items.append({"type": "reasoning", "text": "".join(s["text"] for s in i["summary"])})
            else:
                items.append(_item(i))
        return {"items": items}
    msg = reply["message"]
    return {
        "content": msg.get("content") or "",
        "finish_reason": reply["finish_reason"],
        "tool_calls": [
            {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
            for c in msg.get("tool_calls") or []
        ],
    }


@pytest.mark.parametrize("scenario", HTTP_SCENARIOS)
async def test_captured_session_replays_through_adapter(scenario: str, qwen_tokenizer: Any) -> None:
    requests = load_capture(scenario)
    sid = f"cap-{scenario}"
    async with running_stack(qwen_tokenizer) as stack:
        seen: set[bytes] = set()  # a retried body is scripted once: its first successful reply
        for r in requests:
            if r.body not in seen and (script := script_for(r.reply)) is not None:
                stack.double.script.append(script)
                seen.add(r.body)
        async with aiohttp.ClientSession() as http:
            for r in requests:
                headers = {k: v for k, v in r.headers.items() if k.lower() not in SKIP_HEADERS}
                headers["Authorization"] = f"Bearer {sid}"
                url = stack.url + r.path + (f"?{r.query}" if r.query else "")
                async with http.request(r.method, url, data=r.body or None, headers=headers) as resp:
                    assert resp.status == 200, await resp.text()
                    raw = await resp.text()
                if r.method == "HEAD":
                    continue
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                events = validate_stream(r.path, raw)
                if r.reply is not None and script_for(r.reply) is not None:
                    assert logical_reply(r.path, events) == expected_reply(r.path, r.reply)
        stats = stack.manager.stats(sid)
        assert stats.forks == {}, stats
        assert stats.samples == 1, stats
        trained_turns = len({body for body in seen if body}) - stats.side_turns
        assert stats.turns == trained_turns
        # Retries (529 / broken stream) were answered from the first completed reply: one engine call each.
        assert len(stack.double.requests) == stats.turns + stats.side_turns
        for sample in stack.manager.samples(sid):
            assert sample.metadata["ill_formed"] is False
