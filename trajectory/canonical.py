"""Canonical chat messages: the identity the manager routes by.

Clients echo history with cosmetic changes (content as one text block or a string, `content: null`
added, ids and signatures injected, tool-call arguments as a JSON string or a dict, `cache_control`
moved). Two messages are the same turn when their canonical forms are equal dicts; comparison is
structural, never by serialization, so key order never matters.
"""

from __future__ import annotations

import json
from typing import Any

# Keys that carry transport detail, not conversation content.
IGNORED_KEYS = frozenset({"id", "tool_call_id", "cache_control", "signature", "index", "type", "status"})


def canonical_arguments(arguments: Any) -> Any:
    """Tool-call arguments compared by value: a JSON string and the dict it encodes are equal."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments  # malformed arguments are kept verbatim, never lost
    return arguments


def canonical_content(content: Any) -> Any:
    if isinstance(content, list):
        parts = [canonical_value(p) for p in content]
        if all(isinstance(p, dict) and set(p) == {"text"} for p in parts):
            return "".join(p["text"] for p in parts) or None
        return parts
    return canonical_value(content)


def canonical_value(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in IGNORED_KEYS:
                continue
            item = canonical_value(item)
            if item is None or item == "" or item == []:
                continue
            out[key] = item
        return out
    if isinstance(value, list):
        return [canonical_value(v) for v in value]
    return value


def canonical_tool_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function", call)
    return {"name": fn.get("name"), "arguments": canonical_arguments(fn.get("arguments"))}


def canonical_message(message: dict[str, Any], *, keep_reasoning: bool = False) -> dict[str, Any]:
    """The routing identity of one chat message.

    Reasoning is left out unless `keep_reasoning`: harnesses disagree on echoing `reasoning_content`,
    and token comparison during linearization still catches any real difference it makes.
    """
    out: dict[str, Any] = {"role": message.get("role")}
    for key, value in message.items():
        if key == "role" or key in IGNORED_KEYS:
            continue
        if key == "reasoning_content" and not keep_reasoning:
            continue
        if key == "content":
            value = canonical_content(value)
        elif key == "tool_calls":
            value = [canonical_tool_call(c) for c in value or []]
        else:
            value = canonical_value(value)
        if value is None or value == "" or value == []:
            continue
        out[key] = value
    return out
