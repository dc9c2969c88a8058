"""Anthropic Messages wire <-> canonical chat messages, and Messages replies (JSON or SSE).

Translation follows the reference adapter: system -> one system message; each user content block is its
own message (tool_result -> role tool); an assistant message's thinking/text/tool_use blocks -> one message
with reasoning_content/content/tool_calls, wire ids dropped so echoes compare by value.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from tito_rl.trajectory.adapters.canonical import message, text_of, tool_call
from tito_rl.trajectory.adapters.turns import BadRequest, TurnReply, TurnRequest, function_tool, number, sse, stop_list


def parse_request(body: dict[str, Any]) -> TurnRequest:
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise BadRequest("messages must be a non-empty list")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append(message("system", text_of(system)))
    for i, raw in enumerate(raw_messages):
        if not isinstance(raw, dict) or raw.get("role") not in ("user", "assistant", "system"):
            raise BadRequest(f"messages[{i}] needs a role of user, assistant or system")
        messages.extend(_translate(raw))
    tools = [
        function_tool(t.get("name"), t.get("description"), t.get("input_schema"))
        for t in body.get("tools") or []
        if isinstance(t, dict) and t.get("type") in (None, "custom")
    ]
    sampling: dict[str, Any] = {}
    for key, kind in (("max_tokens", int), ("temperature", float), ("top_p", float), ("top_k", int)):
        if (value := number(body, key, kind)) is not None:
            sampling[key] = value
    if (stops := stop_list(body.get("stop_sequences"), "stop_sequences")) is not None:
        sampling["stop"] = stops
    output_format = (body.get("output_config") or {}).get("format") or {}
    return TurnRequest(
        messages,
        tools,
        sampling,
        bool(body.get("stream")),
        str(body.get("model", "")),
        structured_output=output_format.get("type") == "json_schema",
    )


def _translate(raw: dict[str, Any]) -> list[dict[str, Any]]:
    role, content = raw["role"], raw.get("content")
    if role == "system":
        return [message("system", text_of(content))]
    if isinstance(content, str) or content is None:
        return [message(role, content)]
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or a list of blocks")
    if role == "assistant":
        reasoning = "".join(b.get("thinking", "") for b in content if b.get("type") == "thinking")
        text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
        calls = [tool_call(b.get("name", ""), b.get("input")) for b in content if b.get("type") == "tool_use"]
        return [message("assistant", text, reasoning, calls)]
    out = []
    for block in content:
        if block.get("type") == "tool_result":
            out.append(message("tool", text_of(block.get("content"))))
        else:
            out.append(message("user", text_of(block)))
    return out


def count_tokens_body(n: int) -> dict[str, Any]:
    return {"input_tokens": n}


def _signature(reasoning: str) -> str:
    # Deterministic stand-in: clients only echo it back; nothing verifies it.
    return base64.b64encode(hashlib.sha256(reasoning.encode()).digest()).decode()


def _blocks(reply: TurnReply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    parsed = reply.parsed
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": _signature(parsed.reasoning)})
    if parsed.content or not (parsed.tool_calls or parsed.reasoning):
        blocks.append({"type": "text", "text": parsed.content})
    for i, call in enumerate(parsed.tool_calls):
        blocks.append(
            {
                "type": "tool_use",
                "id": reply.make_id("toolu_", i),
                "name": call.name,
                "input": call.arguments_dict(),
                "_arguments": call.arguments,
            }
        )
    return blocks


def stop_reason(reply: TurnReply) -> str:
    if reply.finish_reason == "length":
        return "max_tokens"
    return "tool_use" if reply.has_tool_calls else "end_turn"


def _usage(reply: TurnReply, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": reply.prompt_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": reply.cached_tokens,
    }


def build_json(request: TurnRequest, reply: TurnReply, blocks: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    blocks = [{k: v for k, v in b.items() if k != "_arguments"} for b in blocks or _blocks(reply)]
    return {
        "id": reply.make_id("msg_"),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": blocks,
        "stop_reason": stop_reason(reply),
        "stop_sequence": None,
        "usage": _usage(reply, reply.completion_tokens),
    }


def build_events(request: TurnRequest, reply: TurnReply) -> list[str]:
    """The Messages stream: message_start, per block start/delta/stop, message_delta, message_stop."""
    blocks = _blocks(reply)
    start = build_json(request, reply, blocks)
    start.update(content=[], stop_reason=None, usage=_usage(reply, 0))
    events = [sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(blocks):
        kind = block["type"]
        if kind == "thinking":
            opening: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        elif kind == "text":
            opening = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
        else:
            opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": block["_arguments"]}]
        events.append(
            sse({"type": "content_block_start", "index": index, "content_block": opening}, "content_block_start")
        )
        events += [
            sse({"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta") for d in deltas
        ]
        events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    events.append(
        sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason(reply), "stop_sequence": None},
                "usage": {"output_tokens": reply.completion_tokens},
            },
            "message_delta",
        )
    )
    events.append(sse({"type": "message_stop"}, "message_stop"))
    return events


ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}


OVERLOADED_STATUS = 529  # Anthropic's overloaded_error: Claude Code retries it with its overloaded back-off


def error_body(status: int, text: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": text}}
