"""The wire-neutral middle of a turn: what a request asks for, and what the engine answered.

Each wire module (anthropic, openai_chat, responses, gemini) parses its request into a `TurnRequest` and builds
its reply from a `TurnReply`; everything between (rendering, /generate, parsing, recording) is shared.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.adapters.parsing.sglang_parsers import ParsedOutput

SAMPLING_KEYS = ("max_tokens", "temperature", "top_p", "top_k", "stop")


class BadRequest(ValueError):
    """A request the adapter refuses, answered as a 400 in the client's error format."""


@dataclass
class TurnRequest:
    messages: list[dict[str, Any]]  # canonical chat messages
    tools: list[dict[str, Any]]  # OpenAI-style: {"type":"function","function":{name, description, parameters}}
    sampling: dict[str, Any] = field(default_factory=dict)  # subset of SAMPLING_KEYS the client set
    stream: bool = False
    model: str = ""
    structured_output: bool = False  # the client asked for JSON of a schema (for itself, not the agent's work)
    options: dict[str, Any] = field(default_factory=dict)  # wire specifics the reply builder needs
    side: bool = False  # set by the app (`side_requests`): answered, kept out of the training tree


@dataclass
class TurnReply:
    id_seed: str  # session name + request number: reply ids are deterministic, so replays re-send equal bytes
    message: dict[str, Any]  # canonical assistant message, as recorded in the manager
    parsed: ParsedOutput
    finish_reason: str  # stop, length, abort
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    created: int = 0
    reasoning_tokens: int = 0  # the output's leading tokens up to the reasoning's end marker (Gemini reports them)

    def make_id(self, prefix: str, index: int = 0, length: int = 24) -> str:
        digest = hashlib.sha256(f"{self.id_seed}/{prefix}/{index}".encode()).hexdigest()
        return f"{prefix}{digest[:length]}"

    @property
    def has_tool_calls(self) -> bool:
        return bool(self.parsed.tool_calls)


_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # one encoder, not one per event


def sse(data: dict[str, Any] | str, event: str | None = None) -> str:
    """One SSE event's raw text, compact JSON, raw UTF-8 (what the real APIs send)."""
    payload = data if isinstance(data, str) else _compact(data)
    return (f"event: {event}\n" if event else "") + f"data: {payload}\n\n"


def function_tool(name: Any, description: Any, parameters: Any) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise BadRequest("every tool needs a non-empty string name")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description if isinstance(description, str) else "",
            "parameters": parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}},
        },
    }


def number(body: dict[str, Any], key: str, kind: type = float) -> float | int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key} must be a number, got {value!r}")
    if not math.isfinite(value):  # Python's JSON reads NaN and Infinity; JSON out to the engine cannot carry them
        raise BadRequest(f"{key} must be a finite number, got {value!r}")
    converted: float | int = kind(value)
    return converted


def stop_list(value: Any, key: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return list(value)
    raise BadRequest(f"{key} must be a string or a list of strings")
