"""The Qwen3 chat template, written out in Python, for tokenizers that ship exactly that template.

Jinja renders a message in ~37 us on a 2 GHz core, most of it the sandbox's attribute checks, so an agent
session of 200 messages cost ~7.5 ms of proxy CPU per turn, on the request's path, growing with every turn.
This renders the same text with plain string operations (~50x faster). It is used only when the template's
digest is the one transcribed here, and only for inputs whose types it handles exactly as Jinja does
(`render` returns None otherwise and the caller renders with Jinja). `tests/test_qwen3_template.py`
checks it against the real template on generated conversations.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tito_rl.trajectory.adapters.value_cache import ValueCache

# sha256 of the Qwen3 chat template (the embedded tokenizer's), without its trailing newlines.
DIGEST = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"

_TOOLS_OPEN = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_CLOSE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)


def is_qwen3_template(template: str) -> bool:
    return hashlib.sha256(template.rstrip("\n").encode()).hexdigest() == DIGEST


def render(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    *,
    keep_reasoning: bool,
    enable_thinking: Any = None,
    add_generation_prompt: bool = True,
) -> str | None:
    """The template's output, or None when an input is outside what this transcription covers."""
    if not _supported(messages, tools):
        return None
    out: list[str] = []
    first = messages[0]
    if tools:
        out.append("<|im_start|>system\n")
        if first["role"] == "system":
            out.append(first["content"] + "\n\n")
        block = _tools_block(tools)
        if block is None:
            return None
        out.append(block)
    elif first["role"] == "system":
        out.append("<|im_start|>system\n" + first["content"] + "<|im_end|>\n")
    last_query = _last_query_index(messages)
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        role = msg["role"]
        if role == "user" or (role == "system" and i):
            out.append("<|im_start|>" + role + "\n" + msg["content"] + "<|im_end|>\n")
        elif role == "assistant":
            text = _assistant(msg, keep_reasoning or i > last_query, i == last)
            if text is None:
                return None
            out.append(text)
        elif role == "tool":
            if i == 0 or messages[i - 1]["role"] != "tool":
                out.append("<|im_start|>user")
            out.append("\n<tool_response>\n" + msg["content"] + "\n</tool_response>")
            if i == last or messages[i + 1]["role"] != "tool":
                out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


_TOOL_BLOCKS: ValueCache[str | None] = ValueCache()  # serialising Claude Code's tools: ~0.6 ms


def _tools_block(tools: list[dict[str, Any]]) -> str | None:
    return _TOOL_BLOCKS.get(tools, _serialise_tools)


def _serialise_tools(tools: list[dict[str, Any]]) -> str | None:
    try:
        return _TOOLS_OPEN + "".join("\n" + json.dumps(tool, ensure_ascii=False) for tool in tools) + _TOOLS_CLOSE
    except (TypeError, ValueError):
        return None


def _supported(messages: Any, tools: Any) -> bool:
    if not isinstance(messages, list) or not messages:
        return False
    for msg in messages:
        if not (isinstance(msg, dict) and isinstance(msg.get("role"), str) and isinstance(msg.get("content"), str)):
            return False
        if msg.get("reasoning_content") is not None and not isinstance(msg["reasoning_content"], str):
            return False
    return tools is None or (isinstance(tools, list) and all(isinstance(t, dict) for t in tools))


def _last_query_index(messages: list[dict[str, Any]]) -> int:
    """The last user message that is not a wrapped tool response; reasoning before it is dropped."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg["role"] == "user":
            content = msg["content"]
            if not (content.startswith("<tool_response>") and content.endswith("</tool_response>")):
                return i
    return len(messages) - 1


def _assistant(msg: dict[str, Any], in_window: bool, is_last: bool) -> str | None:
    content = msg["content"]
    reasoning = msg.get("reasoning_content")
    if reasoning is None:
        reasoning = ""
        if "</think>" in content:
            reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            content = content.split("</think>")[-1].lstrip("\n")
    if in_window and (is_last or reasoning):
        head = "<|im_start|>assistant\n<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
    else:
        head = "<|im_start|>assistant\n" + content
    parts = [head]
    calls = msg.get("tool_calls")
    if calls:
        if not isinstance(calls, list):
            return None
        for j, call in enumerate(calls):
            if not isinstance(call, dict):
                return None
            if j or content:
                parts.append("\n")
            if call.get("function"):
                call = call["function"]
                if not isinstance(call, dict):
                    return None
            name, arguments = call.get("name"), call.get("arguments")
            if not isinstance(name, str):
                return None
            if not isinstance(arguments, str):
                if arguments is None:
                    return None  # Jinja's tojson of an undefined value; let Jinja say what it does
                try:
                    arguments = json.dumps(arguments, ensure_ascii=False)
                except (TypeError, ValueError):
                    return None
            parts.append('<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments + "}\n</tool_call>")
    parts.append("<|im_end|>\n")
    return "".join(parts)
