"""OpenAI Responses wire (Codex 0.169) <-> canonical messages, replies as a Response or its SSE events.

Input items between two non-assistant items (reasoning, assistant message, function_call...) form one
assistant message, so a turn's output items come back as the message they were generated from. Reasoning
travels in `encrypted_content` (base64 of the text, opaque to clients that echo it byte-exactly), so the
echo restores exactly the reasoning that was generated.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from tito_rl.trajectory.adapters.canonical import message, text_of, tool_call
from tito_rl.trajectory.adapters.turns import BadRequest, TurnReply, TurnRequest, function_tool, number, sse

ENCRYPTED_PREFIX = "tito:"


def encode_reasoning(text: str) -> str:
    return ENCRYPTED_PREFIX + base64.b64encode(text.encode()).decode()


def decode_reasoning(item: dict[str, Any]) -> str:
    blob = item.get("encrypted_content")
    if isinstance(blob, str) and blob.startswith(ENCRYPTED_PREFIX):
        try:
            return base64.b64decode(blob[len(ENCRYPTED_PREFIX) :], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            pass
    parts = item.get("content") or item.get("summary") or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict))


class _Assistant:
    def __init__(self) -> None:
        self.reasoning, self.content = "", ""
        self.calls: list[dict[str, Any]] = []

    def empty(self) -> bool:
        return not (self.reasoning or self.content or self.calls)

    def to_message(self) -> dict[str, Any]:
        return message("assistant", self.content, self.reasoning, self.calls)


def _translate_input(items: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    current = _Assistant()

    def flush() -> None:
        nonlocal current
        if not current.empty():
            messages.append(current.to_message())
        current = _Assistant()

    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                current.content += text_of(item.get("content"))
                continue
            if role not in ("user", "system", "developer"):
                raise BadRequest(f"input[{i}] has an unsupported role {role!r}")
            flush()
            messages.append(message("system" if role == "developer" else role, text_of(item.get("content"))))
        elif kind == "reasoning":
            if current.content or current.calls:
                flush()
            current.reasoning += decode_reasoning(item)
        elif kind in ("function_call", "custom_tool_call"):
            args = item.get("arguments") if kind == "function_call" else {"input": item.get("input", "")}
            current.calls.append(tool_call(item.get("name", ""), args))
        elif kind in ("function_call_output", "custom_tool_call_output"):
            flush()
            messages.append(message("tool", text_of(item.get("output"))))
        else:
            raise BadRequest(f"input[{i}] has an unsupported item type {kind!r}")
    flush()
    return messages


def _tools(raw_tools: list[Any]) -> list[dict[str, Any]]:
    tools = []
    for t in raw_tools:
        if not isinstance(t, dict):
            continue
        if t.get("type") == "function":
            tools.append(function_tool(t.get("name"), t.get("description"), t.get("parameters")))
        elif t.get("type") == "namespace":
            tools += _tools(t.get("tools") or [])
        elif t.get("type") == "custom":
            tools.append(
                function_tool(
                    t.get("name"),
                    t.get("description"),
                    {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
                )
            )
        # Hosted tools (web_search, ...) have no function form for the template: left out.
    return tools


def parse_request(body: dict[str, Any]) -> TurnRequest:
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        raw_input = [{"type": "message", "role": "user", "content": raw_input}]
    if not isinstance(raw_input, list) or not raw_input:
        raise BadRequest("input must be a non-empty string or list of items")
    if body.get("previous_response_id"):
        raise BadRequest("previous_response_id is not supported: send the full input (store=false)")
    messages = _translate_input(raw_input)
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.insert(0, message("system", body["instructions"]))
    tools = _tools(body.get("tools") or [])
    sampling: dict[str, Any] = {}
    if (value := number(body, "max_output_tokens", int)) is not None:
        sampling["max_tokens"] = value
    for key in ("temperature", "top_p"):
        if (value := number(body, key)) is not None:
            sampling[key] = value
    text_format = ((body.get("text") or {}).get("format") or {}).get("type")
    options = {
        "encrypted": "reasoning.encrypted_content" in (body.get("include") or []),
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice") if isinstance(body.get("tool_choice"), str) else "auto",
    }
    return TurnRequest(
        messages,
        tools,
        sampling,
        bool(body.get("stream")),
        str(body.get("model", "")),
        text_format == "json_schema",
        options,
    )


def output_items(request: TurnRequest, reply: TurnReply) -> list[dict[str, Any]]:
    parsed, items = reply.parsed, []
    if parsed.reasoning:
        item: dict[str, Any] = {
            "id": reply.make_id("rs_"),
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": parsed.reasoning}],
        }
        if request.options.get("encrypted"):
            item["encrypted_content"] = encode_reasoning(parsed.reasoning)
        items.append(item)
    if parsed.content or not parsed.tool_calls:
        items.append(
            {
                "id": reply.make_id("msg_"),
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": parsed.content, "annotations": []}],
            }
        )
    for i, call in enumerate(parsed.tool_calls):
        items.append(
            {
                "id": reply.make_id("fc_", i),
                "type": "function_call",
                "status": "completed",
                "call_id": reply.make_id("call_", i),
                "name": call.name,
                "arguments": call.arguments,
            }
        )
    return items


def build_json(
    request: TurnRequest, reply: TurnReply, status: str = "completed", output: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    incomplete = reply.finish_reason == "length" and status == "completed"
    return {
        "id": reply.make_id("resp_"),
        "object": "response",
        "created_at": reply.created,
        "status": "incomplete" if incomplete else status,
        "model": request.model,
        "output": output_items(request, reply) if output is None else output,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": request.options.get("parallel_tool_calls", True),
        "tool_choice": request.options.get("tool_choice", "auto"),
        "tools": [],
        "store": False,
        "usage": {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": reply.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def build_events(request: TurnRequest, reply: TurnReply) -> list[str]:
    """created, in_progress, per item added/deltas/done, then completed (or incomplete)."""
    events: list[dict[str, Any]] = []
    shell = build_json(request, reply, status="in_progress", output=[])
    shell["usage"] = None
    events += [{"type": "response.created", "response": shell}, {"type": "response.in_progress", "response": shell}]
    for index, item in enumerate(output_items(request, reply)):
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            opening = {**item, "status": "in_progress", "content": []}
            part = item["content"][0]
            text = part["text"]
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": opening},
                {"type": "response.content_part.added", **ids, "content_index": 0, "part": {**part, "text": ""}},
                {"type": "response.output_text.delta", **ids, "content_index": 0, "delta": text, "logprobs": []},
                {"type": "response.output_text.done", **ids, "content_index": 0, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **ids, "content_index": 0, "part": part},
            ]
        elif item["type"] == "function_call":
            opening = {**item, "status": "in_progress", "arguments": ""}
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": opening},
                {"type": "response.function_call_arguments.delta", **ids, "delta": item["arguments"]},
                {"type": "response.function_call_arguments.done", **ids, "arguments": item["arguments"]},
            ]
        else:
            text = item["summary"][0]["text"]
            summary = {"type": "summary_text", "text": text}
            events += [
                {"type": "response.output_item.added", "output_index": index, "item": {**item, "summary": []}},
                {
                    "type": "response.reasoning_summary_part.added",
                    **ids,
                    "summary_index": 0,
                    "part": {**summary, "text": ""},
                },
                {"type": "response.reasoning_summary_text.delta", **ids, "summary_index": 0, "delta": text},
                {"type": "response.reasoning_summary_text.done", **ids, "summary_index": 0, "text": text},
                {"type": "response.reasoning_summary_part.done", **ids, "summary_index": 0, "part": summary},
            ]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    final = build_json(request, reply)
    events.append({"type": f"response.{final['status']}", "response": final})
    return [sse({**e, "sequence_number": n}, e["type"]) for n, e in enumerate(events)]


OVERLOADED_STATUS = 503  # as on Chat Completions: OpenAI answers an overloaded server with 503


def error_body(status: int, text: str) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": text, "type": kind, "param": None, "code": status}}
