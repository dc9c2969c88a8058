"""Canonical chat messages, and recognising a client's echo of a reply this adapter sent.

Clients rewrite history between turns: `cache_control` moves, a single text block comes back as a plain
string, keys are re-ordered, `content: null` appears, ids and signatures are injected, tool-call arguments
are re-serialised, some clients drop `reasoning_content`. The manager routes by dict equality, so every
wire module builds messages through `message()` below, and `EchoMemory` swaps an echoed assistant message
for the exact reply dict that was recorded, so the tree sees one node instead of a false fork.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from typing import Any

REMINDER_OPEN = "<system-reminder>\n"
REMINDER_CLOSE = "\n</system-reminder>"


def text_of(content: Any) -> str:
    """Plain string for wire content: a string, a list of text-like blocks, or null."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict):
                kind = block.get("type", "text")
                if "text" in block and isinstance(block["text"], str):
                    parts.append(block["text"])
                elif kind in ("image", "input_image", "image_url"):
                    parts.append("[image]")
                elif kind == "refusal":
                    parts.append(str(block.get("refusal", "")))
        return "".join(parts)
    raise ValueError(f"unsupported message content of type {type(content).__name__}")


def arguments_value(arguments: Any) -> dict[str, Any]:
    """Tool-call arguments by value: JSON text and dicts compare equal whatever their spacing or order."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            return {"_raw": arguments}
    else:
        value = arguments
    return value if isinstance(value, dict) else {"_value": value}


def tool_call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments_value(arguments)}}


def message(
    role: str, content: Any = "", reasoning: str | None = None, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The one canonical message shape; optional keys are present only when non-empty."""
    msg: dict[str, Any] = {"role": role, "content": text_of(content)}
    if reasoning:
        msg["reasoning_content"] = reasoning
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return msg


def fold_system_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge leading system messages into one and fold later ones into a neighbouring user message.

    Qwen-style templates reject (or mis-place) a system message that is not first; the reference folds
    it as `<system-reminder>` text. It goes into the preceding user message so earlier turns' history is
    unchanged; with no user message before it, into the next one.
    """
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for msg in messages:
        if msg["role"] != "system":
            if pending and msg["role"] == "user":
                msg = {**msg, "content": "".join(pending) + msg["content"]}
                pending = []
            out.append(msg)
            continue
        if all(m["role"] == "system" for m in out):
            if out:
                out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + msg["content"]}
            else:
                out.append(dict(msg))
            continue
        reminder = REMINDER_OPEN + msg["content"] + REMINDER_CLOSE
        for prev in reversed(range(len(out))):
            if out[prev]["role"] == "user":
                out[prev] = {**out[prev], "content": out[prev]["content"] + "\n\n" + reminder}
                break
        else:
            pending.append(reminder + "\n\n")
    if pending:
        out.append(message("user", "".join(pending).rstrip("\n")))
    return out


def echo_key(msg: dict[str, Any]) -> str:
    """Identity of an assistant message as clients echo it: reasoning and whitespace at the ends ignored."""
    return json.dumps(
        {"c": msg.get("content", "").strip(), "t": msg.get("tool_calls") or []}, sort_keys=True, ensure_ascii=False
    )


class EchoMemory:
    """Per session: the assistant replies sent, so their echoes map back to the recorded dicts.

    Clients re-send the whole history every turn. Keying an assistant message costs a JSON dump (~12 us),
    so restoring 200 of them took 2.5 ms a turn, on the request path, growing with the session. The last
    few histories are kept with their results: an assistant message equal (dict equality, as the manager
    routes) to the one at the same position last time gets the same answer without being keyed again.
    Several histories, because sub-agents and side requests of one session alternate with the main chain.
    """

    def __init__(self, capacity: int = 4096, histories: int = 4) -> None:
        self._sent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.capacity = capacity
        self._histories: deque[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = deque(maxlen=histories)

    def remember(self, reply: dict[str, Any]) -> None:
        key = echo_key(reply)
        self._sent[key] = reply
        self._sent.move_to_end(key)
        while len(self._sent) > self.capacity:
            self._sent.popitem(last=False)

    def restore(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for i, msg in enumerate(messages):
            if msg["role"] == "assistant":
                msg = self._restored_before(i, msg) or self._restore_one(msg)
            out.append(msg)
        self._histories.appendleft((messages, out))
        return out

    def _restored_before(self, index: int, msg: dict[str, Any]) -> dict[str, Any] | None:
        for raw, restored in self._histories:
            if index < len(raw) and raw[index] == msg:
                return restored[index]
        return None

    def _restore_one(self, msg: dict[str, Any]) -> dict[str, Any]:
        sent = self._sent.get(echo_key(msg))
        if sent is not None and msg.get("reasoning_content", sent.get("reasoning_content")) == sent.get(
            "reasoning_content"
        ):
            return sent
        return msg
