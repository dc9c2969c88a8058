"""What an agent reads in a reply, whatever the wire and whoever built it: text, reasoning, tool calls, stop reason.

Two gateways answer the same generation with different bytes (ids, key order, how a stream is chunked); an
agent notices only what this module keeps. Conformance replays compare replies this way: a difference here
is one an agent would act on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tito_rl.replayer.comparison.differences import parse_json, sse_payload

STOPS: dict[Any, str] = {
    "end_turn": "stop",
    "stop": "stop",
    "stop_sequence": "stop",
    "STOP": "stop",
    "completed": "stop",
    "tool_use": "tool_calls",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "max_tokens": "length",
    "length": "length",
    "MAX_TOKENS": "length",
    "incomplete": "length",
}


@dataclass
class Meaning:
    status: int
    text: str = ""
    reasoning: str = ""  # thinking / reasoning_content / reasoning items / thought parts, as the agent shows it
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)  # (name, parsed arguments)
    stop: str | None = None

    def differences(self, other: Meaning) -> list[str]:
        """What differs between two readings, one line each (recorded first); a status that differs is the one
        line. Text and reasoning are compared without their surrounding whitespace, which no agent acts on."""
        if self.status != other.status:  # an error reply has no text or calls: the rest would follow from it
            return [f"status: {self.status} vs {other.status}"]
        out = []
        if self.text.strip() != other.text.strip():
            out.append("text: " + _pair(self.text.strip(), other.text.strip()))
        if self.reasoning.strip() != other.reasoning.strip():
            out.append("reasoning: " + _pair(self.reasoning.strip(), other.reasoning.strip()))
        if self.tool_calls != other.tool_calls:
            out.append(f"tool calls: {_calls(self.tool_calls)} vs {_calls(other.tool_calls)}")
        if self.stop != other.stop:
            out.append(f"stop reason: {self.stop} vs {other.stop}")
        return out


def _pair(a: str, b: str, limit: int = 60) -> str:
    """Two texts side by side, each cut to `limit` characters around where they start to differ."""
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    start = max(0, same - limit // 3) if max(len(a), len(b)) > limit else 0

    def cut(text: str) -> str:
        piece = text[start : start + limit]
        return ("…" if start else "") + piece + ("…" if start + limit < len(text) else "")

    return f"{cut(a)!r} vs {cut(b)!r}"


def _calls(calls: list[tuple[str, Any]]) -> str:
    return "[" + ", ".join(f"{n}({json.dumps(a, ensure_ascii=False, sort_keys=True)[:40]})" for n, a in calls) + "]"


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value) if value.strip() else {}
        except ValueError:
            return value
    return value if value is not None else {}


def meaning(path: str, status: int, body: bytes | None, events: list[str] | None) -> Meaning:
    """The reading of one reply to a request on `path` (the wire is in the path)."""
    found = Meaning(status)
    if status != 200:
        return found
    payloads = [sse_payload(e)[1] for e in events] if events is not None else [parse_json(body)]
    payloads = [p for p in payloads if isinstance(p, dict)]
    if "/v1/messages" in path:
        _anthropic(found, payloads)
    elif "/v1/chat/completions" in path:
        _chat(found, payloads)
    elif "/v1/responses" in path:
        _responses(found, payloads)
    elif "/v1beta/models/" in path:
        _gemini(found, payloads)
    return found


def _anthropic(found: Meaning, payloads: list[dict[str, Any]]) -> None:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: dict[int, list[Any]] = {}  # index -> [name, input of the block's start, partial JSON of its deltas]
    for p in payloads:
        kind = p.get("type")
        if kind == "message" or (kind is None and "content" in p):
            for block in p.get("content") or []:
                if block.get("type") == "text":
                    texts.append(block.get("text", ""))
                elif block.get("type") == "thinking":
                    thoughts.append(block.get("thinking", ""))
                elif block.get("type") == "tool_use":
                    calls[len(calls)] = [block.get("name"), block.get("input"), ""]
            found.stop = STOPS.get(p.get("stop_reason"), p.get("stop_reason"))
        elif kind == "content_block_start":
            block = p.get("content_block") or {}
            if block.get("type") == "text" and block.get("text"):
                texts.append(block["text"])
            elif block.get("type") == "thinking" and block.get("thinking"):
                thoughts.append(block["thinking"])
            elif block.get("type") == "tool_use":
                calls[p.get("index", len(calls))] = [block.get("name"), block.get("input"), ""]
        elif kind == "content_block_delta":
            delta = p.get("delta") or {}
            if delta.get("type") == "text_delta":
                texts.append(delta.get("text", ""))
            elif delta.get("type") == "thinking_delta":
                thoughts.append(delta.get("thinking", ""))
            elif delta.get("type") == "input_json_delta" and p.get("index") in calls:
                calls[p["index"]][2] += delta.get("partial_json", "")
        elif kind == "message_delta":
            reason = (p.get("delta") or {}).get("stop_reason")
            found.stop = STOPS.get(reason, reason)
    found.text, found.reasoning = "".join(texts), "".join(thoughts)
    # a stream's input arrives as partial JSON after an empty `input` in the block's start
    found.tool_calls = [
        (n, _args(partial) if partial else _args(start)) for _, (n, start, partial) in sorted(calls.items())
    ]


def _chat(found: Meaning, payloads: list[dict[str, Any]]) -> None:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: dict[int, list[Any]] = {}
    for p in payloads:
        for choice in p.get("choices") or []:
            part = choice.get("message") or choice.get("delta") or {}
            if part.get("content"):
                texts.append(part["content"])
            reasoning = part.get("reasoning_content") or part.get("reasoning")
            if isinstance(reasoning, str):
                thoughts.append(reasoning)
            for i, call in enumerate(part.get("tool_calls") or []):
                index = call.get("index", i)
                function = call.get("function") or {}
                entry = calls.setdefault(index, [function.get("name"), ""])
                entry[0] = entry[0] or function.get("name")
                arguments = function.get("arguments")
                if isinstance(arguments, str):  # a stream's pieces, or a whole JSON reply's string
                    entry[1] = entry[1] + arguments if isinstance(entry[1], str) else arguments
                elif arguments is not None:  # already parsed (a gateway that sends an object)
                    entry[1] = arguments
            if choice.get("finish_reason"):
                found.stop = STOPS.get(choice["finish_reason"], choice["finish_reason"])
    found.text, found.reasoning = "".join(texts), "".join(thoughts)
    found.tool_calls = [(n, _args(a)) for _, (n, a) in sorted(calls.items())]


def _responses(found: Meaning, payloads: list[dict[str, Any]]) -> None:
    final = next(
        (
            p.get("response")
            for p in reversed(payloads)
            if p.get("type") in ("response.completed", "response.incomplete")
        ),
        None,
    )
    response = final if isinstance(final, dict) else next((p for p in payloads if p.get("object") == "response"), {})
    texts, thoughts, calls = [], [], []
    for item in response.get("output") or []:
        if item.get("type") == "message":
            texts += [c.get("text", "") for c in item.get("content") or [] if c.get("type") == "output_text"]
        elif item.get("type") == "reasoning":
            parts = [*(item.get("summary") or []), *(item.get("content") or [])]
            thoughts += [c.get("text", "") for c in parts if c.get("type") in ("summary_text", "reasoning_text")]
        elif item.get("type") == "function_call":
            calls.append((item.get("name"), _args(item.get("arguments"))))
    found.text, found.reasoning, found.tool_calls = "".join(texts), "".join(thoughts), calls
    status = response.get("status")
    found.stop = "tool_calls" if calls and status == "completed" else STOPS.get(status, status)


def _gemini(found: Meaning, payloads: list[dict[str, Any]]) -> None:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[Any] = []
    for p in payloads:
        for candidate in p.get("candidates") or []:
            for part in (candidate.get("content") or {}).get("parts") or []:
                if part.get("text"):
                    (thoughts if part.get("thought") else texts).append(part["text"])
                if part.get("functionCall"):
                    call = part["functionCall"]
                    calls.append((call.get("name"), _args(call.get("args"))))
            if candidate.get("finishReason"):
                found.stop = STOPS.get(candidate["finishReason"], candidate["finishReason"])
    found.text, found.reasoning, found.tool_calls = "".join(texts), "".join(thoughts), calls
