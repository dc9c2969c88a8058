"""The three agent wires as the scripted client speaks them: request bodies, replies read back, echoes.

Each wire builds what its real CLI sends (Claude Code on Anthropic Messages, Qwen Code on OpenAI chat
completions, Codex on OpenAI Responses; see shared/notes/agent-clients.md and the captures), reads the
reply as JSON or SSE, and echoes the assistant turn into the next request's history the way that CLI does:
Claude Code byte-faithfully (thinking with its signature, text, tool_use with ids), Qwen Code with
`reasoning_content` dropped and arguments re-serialised compactly, Codex with its items' keys re-ordered
and `encrypted_content` kept. The history is kept in wire form; the system prompt is added per request.
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from tito_rl.recorder.scripted.script import ToolSpec

EPHEMERAL = {"type": "ephemeral"}


@dataclass
class ToolCallOut:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class AssistantReply:
    echo: list[dict[str, Any]]  # history items the client appends, in its own wire form
    text: str = ""
    calls: list[ToolCallOut] = field(default_factory=list)
    finish: str = "stop"  # stop | tool_calls | length


class Wire(Protocol):
    path: str
    accept: str

    def body(
        self,
        model: str,
        system: str,
        tools: tuple[ToolSpec, ...],
        history: list[dict[str, Any]],
        max_tokens: int,
        stream: bool,
        session_id: str,
    ) -> dict[str, Any]: ...

    def user(self, text: str) -> dict[str, Any]: ...

    def tool_results(self, calls: list[ToolCallOut], outputs: list[str]) -> list[dict[str, Any]]: ...

    def parse(self, raw: bytes, stream: bool) -> AssistantReply: ...


def conversation_uuid(session_id: str) -> str:
    """The client's own conversation id (Claude Code's metadata session_id, Codex's prompt_cache_key): stable
    per session, and never the bearer token, which the real CLIs keep out of the body too."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"tito-scripted-client:{session_id}"))


def sse_data(raw: bytes) -> list[Any]:
    """Every `data:` payload of an SSE body, JSON-decoded (`[DONE]` left out)."""
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload and payload != "[DONE]":
                out.append(json.loads(payload))
    return out


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


class AnthropicWire:
    """Claude Code 2.1.330: `POST /v1/messages?beta=true`, system as text blocks, cache_control on the newest
    message only (so earlier messages are re-sent rewritten: a one-text-block user turn becomes a string)."""

    path = "/v1/messages?beta=true"
    accept = "application/json"

    def body(
        self,
        model: str,
        system: str,
        tools: tuple[ToolSpec, ...],
        history: list[dict[str, Any]],
        max_tokens: int,
        stream: bool,
        session_id: str,
    ) -> dict[str, Any]:
        messages = list(history)
        if messages:
            last = copy.deepcopy(messages[-1])
            if isinstance(last["content"], str):
                last["content"] = [{"type": "text", "text": last["content"]}]
            last["content"][-1]["cache_control"] = EPHEMERAL
            messages[-1] = last
        user_id = json.dumps({"session_id": conversation_uuid(session_id)}, separators=(",", ":"))
        return {
            "model": model,
            "messages": messages,
            "system": [{"type": "text", "text": system, "cache_control": EPHEMERAL}],
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools],
            "metadata": {"user_id": user_id},
            "max_tokens": max_tokens,
            "thinking": {"type": "adaptive"},
            "stream": stream,
        }

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def tool_results(self, calls: list[ToolCallOut], outputs: list[str]) -> list[dict[str, Any]]:
        return [
            {
                "role": "user",
                "content": [
                    {"tool_use_id": c.id, "type": "tool_result", "content": out, "is_error": False}
                    for c, out in zip(calls, outputs, strict=True)
                ],
            }
        ]

    def parse(self, raw: bytes, stream: bool) -> AssistantReply:
        if stream:
            blocks, stop = self._from_events(sse_data(raw))
        else:
            message = json.loads(raw)
            blocks, stop = message["content"], message.get("stop_reason")
        echo: list[dict[str, Any]] = []
        for b in blocks:  # Claude Code's own key order for each block kind
            if b["type"] == "thinking":
                echo.append({"type": "thinking", "thinking": b["thinking"], "signature": b.get("signature", "")})
            elif b["type"] == "text":
                echo.append({"type": "text", "text": b["text"]})
            elif b["type"] == "tool_use":
                echo.append({"type": "tool_use", "id": b["id"], "name": b["name"], "input": b["input"]})
        calls = [ToolCallOut(b["id"], b["name"], b["input"]) for b in echo if b["type"] == "tool_use"]
        text = "".join(b["text"] for b in echo if b["type"] == "text")
        finish = {"tool_use": "tool_calls", "max_tokens": "length"}.get(stop or "", "stop")
        return AssistantReply([{"role": "assistant", "content": echo}], text, calls, finish)

    @staticmethod
    def _from_events(events: list[Any]) -> tuple[list[dict[str, Any]], str | None]:
        blocks: list[dict[str, Any]] = []
        partial: dict[int, str] = {}
        stop = None
        for e in events:
            kind = e.get("type")
            if kind == "content_block_start":
                blocks.append(dict(e["content_block"]))
            elif kind == "content_block_delta":
                block, delta = blocks[e["index"]], e["delta"]
                if delta["type"] == "text_delta":
                    block["text"] += delta["text"]
                elif delta["type"] == "thinking_delta":
                    block["thinking"] += delta["thinking"]
                elif delta["type"] == "signature_delta":
                    block["signature"] = delta["signature"]
                elif delta["type"] == "input_json_delta":
                    partial[e["index"]] = partial.get(e["index"], "") + delta["partial_json"]
            elif kind == "content_block_stop" and e["index"] in partial:
                blocks[e["index"]]["input"] = _arguments(partial[e["index"]])
            elif kind == "message_delta":
                stop = e["delta"].get("stop_reason")
        return blocks, stop


class ChatWire:
    """Qwen Code 0.24.4: `POST /v1/chat/completions`, streaming with usage; on echo `reasoning_content` is
    not sent back and tool-call arguments are re-serialised compactly."""

    path = "/v1/chat/completions"
    accept = "application/json"

    def body(
        self,
        model: str,
        system: str,
        tools: tuple[ToolSpec, ...],
        history: list[dict[str, Any]],
        max_tokens: int,
        stream: bool,
        session_id: str,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "system", "content": system}, *history],
            "max_tokens": max_tokens,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        body["tools"] = [
            {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in tools
        ]
        return body

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def tool_results(self, calls: list[ToolCallOut], outputs: list[str]) -> list[dict[str, Any]]:
        return [{"role": "tool", "tool_call_id": c.id, "content": out} for c, out in zip(calls, outputs, strict=True)]

    def parse(self, raw: bytes, stream: bool) -> AssistantReply:
        if stream:
            text, finish = "", None
            raw_calls: dict[int, dict[str, Any]] = {}
            for chunk in sse_data(raw):
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    text += delta.get("content") or ""
                    for c in delta.get("tool_calls") or []:
                        slot = raw_calls.setdefault(c["index"], {"id": "", "name": "", "arguments": ""})
                        slot["id"] = c.get("id") or slot["id"]
                        fn = c.get("function") or {}
                        slot["name"] += fn.get("name") or ""
                        slot["arguments"] += fn.get("arguments") or ""
                    finish = choice.get("finish_reason") or finish
            calls = [ToolCallOut(c["id"], c["name"], _arguments(c["arguments"])) for _, c in sorted(raw_calls.items())]
        else:
            choice = json.loads(raw)["choices"][0]
            message, finish = choice["message"], choice.get("finish_reason")
            text = message.get("content") or ""
            calls = [
                ToolCallOut(c["id"], c["function"]["name"], _arguments(c["function"]["arguments"]))
                for c in message.get("tool_calls") or []
            ]
        echo: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            echo["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.name,
                        "arguments": json.dumps(c.arguments, separators=(",", ":"), ensure_ascii=False),
                    },
                }
                for c in calls
            ]
        return AssistantReply(
            [echo], text, calls, "tool_calls" if calls else ("length" if finish == "length" else "stop")
        )


class ResponsesWire:
    """Codex 0.169: `POST /v1/responses` (SSE), the system prompt as a `developer` input item, output items
    echoed with Codex's key order, `content: null` added to reasoning, `encrypted_content` kept."""

    path = "/v1/responses"
    accept = "text/event-stream"

    def body(
        self,
        model: str,
        system: str,
        tools: tuple[ToolSpec, ...],
        history: list[dict[str, Any]],
        max_tokens: int,
        stream: bool,
        session_id: str,
    ) -> dict[str, Any]:
        developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": system}]}
        return {
            "model": model,
            "stream": stream,
            "input": [developer, *history],
            "tools": [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "strict": False,
                    "parameters": t.parameters,
                }
                for t in tools
            ],
            "tool_choice": "auto",
            "parallel_tool_calls": True,
            "reasoning": {"effort": "medium"},
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": conversation_uuid(session_id),
        }

    def user(self, text: str) -> dict[str, Any]:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}

    def tool_results(self, calls: list[ToolCallOut], outputs: list[str]) -> list[dict[str, Any]]:
        return [
            {"type": "function_call_output", "call_id": c.id, "output": out}
            for c, out in zip(calls, outputs, strict=True)
        ]

    def parse(self, raw: bytes, stream: bool) -> AssistantReply:
        if stream:
            events = sse_data(raw)
            items = [e["item"] for e in events if e.get("type") == "response.output_item.done"]
            final: dict[str, Any] = next(
                (
                    e["response"]
                    for e in reversed(events)
                    if e.get("type") in ("response.completed", "response.incomplete")
                ),
                {},
            )
        else:
            final = json.loads(raw)
            items = final.get("output") or []
        echo: list[dict[str, Any]] = []
        for it in items:
            if it["type"] == "reasoning":
                item = {"type": "reasoning", "id": it["id"], "summary": it.get("summary", []), "content": None}
                if "encrypted_content" in it:
                    item["encrypted_content"] = it["encrypted_content"]
                echo.append(item)
            elif it["type"] == "message":
                echo.append(
                    {
                        "type": "message",
                        "status": it.get("status", "completed"),
                        "id": it["id"],
                        "role": "assistant",
                        "content": it["content"],
                    }
                )
            elif it["type"] == "function_call":
                echo.append(
                    {
                        "type": "function_call",
                        "status": it.get("status", "completed"),
                        "id": it["id"],
                        "name": it["name"],
                        "arguments": it["arguments"],
                        "call_id": it["call_id"],
                    }
                )
        calls = [
            ToolCallOut(i["call_id"], i["name"], _arguments(i["arguments"]))
            for i in echo
            if i["type"] == "function_call"
        ]
        text = "".join(p.get("text", "") for i in echo if i["type"] == "message" for p in i["content"])
        finish = "tool_calls" if calls else ("length" if final.get("status") == "incomplete" else "stop")
        return AssistantReply(echo, text, calls, finish)


WIRE_CODECS: dict[str, Wire] = {"anthropic": AnthropicWire(), "chat": ChatWire(), "responses": ResponsesWire()}
