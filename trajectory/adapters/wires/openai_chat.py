"""OpenAI Chat Completions wire (Qwen Code, opencode) <-> canonical messages, replies as JSON or chunks.

All tool calls are kept, in order (the reference kept only the first, issue #2283); each streams as one
chunk carrying the complete arguments, which every OpenAI-compatible client accumulates correctly.
"""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.adapters.canonical import message, text_of, tool_call
from tito_rl.trajectory.adapters.turns import BadRequest, TurnReply, TurnRequest, function_tool, number, sse, stop_list


def parse_request(body: dict[str, Any]) -> TurnRequest:
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise BadRequest("messages must be a non-empty list")
    messages = []
    for i, raw in enumerate(raw_messages):
        role = raw.get("role") if isinstance(raw, dict) else None
        if role == "developer":
            role = "system"
        if role not in ("system", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{i}] has an unsupported role {role!r}")
        calls = [
            tool_call((c.get("function") or {}).get("name", ""), (c.get("function") or {}).get("arguments"))
            for c in raw.get("tool_calls") or []
            if isinstance(c, dict)
        ]
        reasoning = raw.get("reasoning_content") or raw.get("reasoning") or None
        messages.append(
            message(
                role,
                text_of(raw.get("content")),
                reasoning if role == "assistant" else None,
                calls if role == "assistant" else None,
            )
        )
    tools = []
    for t in body.get("tools") or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict):
            tools.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters")))
    sampling: dict[str, Any] = {}
    max_tokens = number(body, "max_completion_tokens", int) or number(body, "max_tokens", int)
    if max_tokens is not None:
        sampling["max_tokens"] = max_tokens
    for key, kind in (("temperature", float), ("top_p", float), ("top_k", int)):
        if (value := number(body, key, kind)) is not None:
            sampling[key] = value
    if (stops := stop_list(body.get("stop"), "stop")) is not None:
        sampling["stop"] = stops
    response_format = body.get("response_format") or {}
    options = {"include_usage": bool((body.get("stream_options") or {}).get("include_usage"))}
    return TurnRequest(
        messages,
        tools,
        sampling,
        bool(body.get("stream")),
        str(body.get("model", "")),
        response_format.get("type") == "json_schema",
        options,
    )


def finish_reason(reply: TurnReply) -> str:
    if reply.finish_reason == "length":
        return "length"
    return "tool_calls" if reply.has_tool_calls else "stop"


def _tool_calls(reply: TurnReply) -> list[dict[str, Any]]:
    return [
        {"id": reply.make_id("call_", i), "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for i, c in enumerate(reply.parsed.tool_calls)
    ]


def _usage(reply: TurnReply) -> dict[str, Any]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": reply.cached_tokens},
    }


def build_json(request: TurnRequest, reply: TurnReply) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": reply.parsed.content or None}
    if reply.parsed.reasoning:
        msg["reasoning_content"] = reply.parsed.reasoning
    if reply.has_tool_calls:
        msg["tool_calls"] = _tool_calls(reply)
    elif msg["content"] is None:
        msg["content"] = ""
    return {
        "id": reply.make_id("chatcmpl-"),
        "object": "chat.completion",
        "created": reply.created,
        "model": request.model,
        "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish_reason(reply)}],
        "usage": _usage(reply),
    }


def build_events(request: TurnRequest, reply: TurnReply) -> list[str]:
    base = {
        "id": reply.make_id("chatcmpl-"),
        "object": "chat.completion.chunk",
        "created": reply.created,
        "model": request.model,
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    events = [chunk({"role": "assistant", "content": ""})]
    if reply.parsed.reasoning:
        events.append(chunk({"reasoning_content": reply.parsed.reasoning}))
    if reply.parsed.content:
        events.append(chunk({"content": reply.parsed.content}))
    for i, call in enumerate(_tool_calls(reply)):
        events.append(chunk({"tool_calls": [{"index": i, **call}]}))
    events.append(chunk({}, finish_reason(reply)))
    if request.options.get("include_usage"):
        events.append(sse({**base, "choices": [], "usage": _usage(reply)}))
    events.append(sse("[DONE]"))
    return events


ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error"}


OVERLOADED_STATUS = 503  # OpenAI's "server overloaded": the OpenAI SDKs, Codex and opencode retry 5xx


def error_body(status: int, text: str) -> dict[str, Any]:
    return {"error": {"message": text, "type": ERROR_TYPES.get(status, "server_error"), "param": None, "code": status}}
