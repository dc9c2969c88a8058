"""Tiny model-API stubs on loopback for driving real agent CLIs in tests.

Each stub answers the first model turn with one shell tool call and, once a tool result comes back, with
a final text, over the same SSE event sequence the real APIs stream. Ids are derived from the request
number so two runs see identical replies.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer


@dataclass
class SeenRequest:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class StubState:
    requests: list[SeenRequest] = field(default_factory=list)


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _record(request: web.Request, state: StubState) -> SeenRequest:
    raw = await request.read()
    seen = SeenRequest(
        request.method,
        request.path,
        request.query_string,
        dict(request.headers),
        json.loads(raw) if raw else {},
    )
    state.requests.append(seen)
    return seen


async def _stream(request: web.Request, events: list[bytes]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for event in events:
        await response.write(event)
    await response.write_eof()
    return response


# ---- Anthropic Messages -------------------------------------------------------------------------------


def _has_tool_result(messages: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"])
        for m in messages
    )


def anthropic_events(number: int, model: str, blocks: list[dict[str, Any]], stop_reason: str) -> list[bytes]:
    message: dict[str, Any] = {
        "id": f"msg_stub_{number:04d}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }
    events = [_sse("message_start", {"type": "message_start", "message": message})]
    for index, block in enumerate(blocks):
        start: dict[str, Any]
        if block["type"] == "text":
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events += [
            _sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": start}),
            _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}),
            _sse("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]
    events += [
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        ),
        _sse("message_stop", {"type": "message_stop"}),
    ]
    return events


def anthropic_app(state: StubState, command: str = "echo hi") -> web.Application:
    async def messages(request: web.Request) -> web.StreamResponse:
        seen = await _record(request, state)
        number = len(state.requests)
        blocks: list[dict[str, Any]]
        if _has_tool_result(seen.body.get("messages", [])):
            blocks, stop = [{"type": "text", "text": "done"}], "end_turn"
        else:
            blocks = [
                {"type": "text", "text": "I'll run a command."},
                {
                    "type": "tool_use",
                    "id": f"toolu_stub_{number:04d}",
                    "name": "Bash",
                    "input": {"command": command},
                },
            ]
            stop = "tool_use"
        return await _stream(request, anthropic_events(number, seen.body.get("model", "stub"), blocks, stop))

    app = web.Application()
    app.router.add_post("/v1/messages", messages)
    return app


# ---- OpenAI Responses ---------------------------------------------------------------------------------


def responses_events(number: int, model: str, items: list[dict[str, Any]]) -> list[bytes]:
    response = {
        "id": f"resp_stub_{number:04d}",
        "object": "response",
        "created_at": 0,
        "model": model,
        "status": "in_progress",
        "output": [],
    }
    events = [_sse("response.created", {"type": "response.created", "response": response})]
    for index, item in enumerate(items):
        if item["type"] == "function_call":
            events += [
                _sse(
                    "response.output_item.added",
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": item | {"arguments": "", "status": "in_progress"},
                    },
                ),
                _sse(
                    "response.function_call_arguments.delta",
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": item["id"],
                        "output_index": index,
                        "delta": item["arguments"],
                    },
                ),
                _sse(
                    "response.function_call_arguments.done",
                    {
                        "type": "response.function_call_arguments.done",
                        "item_id": item["id"],
                        "output_index": index,
                        "arguments": item["arguments"],
                    },
                ),
            ]
        else:
            text = item["content"][0]["text"]
            empty_part = {"type": "output_text", "text": "", "annotations": []}
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [
                _sse(
                    "response.output_item.added",
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": item | {"content": [], "status": "in_progress"},
                    },
                ),
                _sse(
                    "response.content_part.added",
                    {"type": "response.content_part.added", **where, "part": empty_part},
                ),
                _sse(
                    "response.output_text.delta",
                    {"type": "response.output_text.delta", **where, "delta": text},
                ),
                _sse("response.output_text.done", {"type": "response.output_text.done", **where, "text": text}),
                _sse(
                    "response.content_part.done",
                    {"type": "response.content_part.done", **where, "part": item["content"][0]},
                ),
            ]
        events.append(
            _sse(
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": index, "item": item},
            )
        )
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    done = response | {"status": "completed", "output": items, "usage": usage}
    events.append(_sse("response.completed", {"type": "response.completed", "response": done}))
    return events


def responses_app(state: StubState, command: str = "echo hi") -> web.Application:
    async def responses(request: web.Request) -> web.StreamResponse:
        seen = await _record(request, state)
        number = len(state.requests)
        message = {
            "id": f"msg_stub_{number:04d}",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "", "annotations": []}],
        }
        if any(item.get("type") == "function_call_output" for item in seen.body.get("input", [])):
            message["content"][0]["text"] = "done"
            items = [message]
        else:
            message["content"][0]["text"] = "I'll run a command."
            items = [
                message,
                {
                    "id": f"fc_stub_{number:04d}",
                    "type": "function_call",
                    "status": "completed",
                    "call_id": f"call_stub_{number:04d}",
                    "name": "exec_command",
                    "arguments": json.dumps({"cmd": command}),
                },
            ]
        return await _stream(request, responses_events(number, seen.body.get("model", "stub"), items))

    app = web.Application()
    app.router.add_post("/v1/responses", responses)
    return app


# ---- OpenAI chat completions -------------------------------------------------------------------------


def chat_events(
    number: int, model: str, content: str, tool_calls: list[dict[str, Any]], finish_reason: str
) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        body = {
            "id": f"chatcmpl-stub-{number:04d}",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if usage:
            body["usage"] = usage
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n".encode()

    events = [chunk({"role": "assistant", "content": ""}), chunk({"content": content})]
    for index, call in enumerate(tool_calls):
        events.append(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": index,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["name"], "arguments": call["arguments"]},
                        }
                    ]
                }
            )
        )
    events += [
        chunk({}, finish_reason),
        chunk({}, usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}),
        b"data: [DONE]\n\n",
    ]
    return events


def chat_app(state: StubState, shell_tool: str, argument: str = "command", command: str = "echo hi") -> web.Application:
    """Requests without tools (title generation and other side requests) get a short text answer."""

    async def completions(request: web.Request) -> web.StreamResponse:
        seen = await _record(request, state)
        number = len(state.requests)
        messages = seen.body.get("messages", [])
        model = seen.body.get("model", "stub")
        if not seen.body.get("tools"):
            events = chat_events(number, model, "title", [], "stop")
        elif any(m.get("role") == "tool" for m in messages):
            events = chat_events(number, model, "done", [], "stop")
        else:
            call = {
                "id": f"call_stub_{number:04d}",
                "name": shell_tool,
                "arguments": json.dumps({argument: command}),
            }
            events = chat_events(number, model, "I'll run a command.", [call], "tool_calls")
        return await _stream(request, events)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    return app


def chat_json_app(state: StubState, commands: list[str], tool: str = "bash") -> web.Application:
    """Unstreamed chat completions (`stream` absent or false; a streamed request is refused with 400, as Agent
    Lightning's proxy does): the Nth request gets one `tool` call running `commands[N]`, as JSON."""

    async def completions(request: web.Request) -> web.StreamResponse:
        seen = await _record(request, state)
        if seen.body.get("stream"):
            return web.json_response({"detail": "Streaming responses are not supported"}, status=400)
        number = len(state.requests)
        call = {
            "id": f"call_stub_{number:04d}",
            "type": "function",
            "function": {"name": tool, "arguments": json.dumps({"command": commands[number - 1]})},
        }
        message = {"role": "assistant", "content": f"Running command {number}.", "tool_calls": [call]}
        return web.json_response(
            {
                "id": f"chatcmpl-stub-{number:04d}",
                "object": "chat.completion",
                "created": 0,
                "model": seen.body.get("model", "stub"),
                "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    return app


async def start_stub(app: web.Application) -> TestServer:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


# ---- Gemini API -----------------------------------------------------------------------------------------


def gemini_events(number: int, model: str, parts: list[dict[str, Any]]) -> list[bytes]:
    """`data:` events as `:streamGenerateContent?alt=sse` sends them: one part each, finishReason last."""
    events = []
    for index, part in enumerate(parts):
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}, "index": 0}
        chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": f"stub{number:04d}"}
        if index == len(parts) - 1:
            candidate["finishReason"] = "STOP"
            chunk["usageMetadata"] = {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15}
        events.append(f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n".encode())
    return events


def gemini_app(state: StubState, command: str = "echo hi") -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        seen = await _record(request, state)
        model = request.match_info["model_action"].rpartition(":")[0]
        parts = [p for c in seen.body.get("contents", []) for p in c.get("parts", [])]
        reply: list[dict[str, Any]]
        if any("functionResponse" in p for p in parts):
            reply = [{"text": "done"}]
        else:
            reply = [
                {"text": "I'll run a command."},
                {"functionCall": {"name": "run_shell_command", "args": {"command": command}}},
            ]
        return await _stream(request, gemini_events(len(state.requests), model, reply))

    app = web.Application()
    app.router.add_post("/v1beta/models/{model_action}", generate)
    return app
