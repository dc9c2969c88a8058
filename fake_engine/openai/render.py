"""Messages in: the chat template rendered as vLLM renders it, so the policy sees the ids a real engine would.

vLLM (`entrypoints/chat_utils.py`, `serving_engine._preprocess_chat`) gives the tokenizer's own template the
conversation with each message's text parts joined by newlines (Qwen3's template takes string content), assistant
tool calls' `arguments` parsed from JSON text into objects, the tools as their models dump them (`type`, then
`function` with `name`, `description`, `parameters`, null where absent), `add_generation_prompt` (default true) and
`chat_template_kwargs`; it renders text (`tokenize=False`) and then encodes it with `add_special_tokens` (default
false). The tokenizer's `apply_chat_template` renders as transformers does (`trajectory/tokens/chat_template.py`
for tito's light tokenizer; the wire tests hold it to transformers' own).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from jinja2 import TemplateError

from tito_rl.fake_engine.sglang.validation import EngineHTTPError


def _content(value: Any) -> Any:
    if isinstance(value, list):
        return "\n".join(str(p.get("text", "")) for p in value if isinstance(p, dict) and p.get("type") == "text")
    return value


def _message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise ValueError("each message must be an object")
    out = dict(message)
    if "content" in out:
        out["content"] = _content(out["content"])
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        parsed = []
        for call in calls:
            call = dict(call) if isinstance(call, dict) else call
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                with contextlib.suppress(ValueError):  # vLLM keeps text that does not parse as it is
                    call["function"] = {**function, "arguments": json.loads(function["arguments"])}
            parsed.append(call)
        out["tool_calls"] = parsed
    return out


def _tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
        raise ValueError("each tool must be {type: function, function: {...}}")
    function = tool["function"]
    dumped = {
        "name": function.get("name"),
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    dumped.update({k: v for k, v in function.items() if k not in dumped})
    out = {"type": tool.get("type", "function"), "function": dumped}
    out.update({k: v for k, v in tool.items() if k not in out})
    return out


def render_chat(tokenizer: Any, body: dict[str, Any], error: Any) -> list[int]:
    """The prompt ids of a messages-in chat request; `error(message)` builds the dialect's 400."""
    kwargs = body.get("chat_template_kwargs")
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    for reserved in ("tools", "add_generation_prompt", "tokenize", "conversation", "messages"):
        kwargs.pop(reserved, None)
    try:
        messages = [_message(m) for m in body["messages"]]
        tools = [_tool(t) for t in body["tools"]] if isinstance(body.get("tools"), list) and body["tools"] else None
        text = tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=body.get("add_generation_prompt", True) is not False,
            tokenize=False,
            **kwargs,
        )
    except (ValueError, TypeError, TemplateError) as exc:
        raise EngineHTTPError(400, error(f"chat template: {exc}")) from None
    ids = list(tokenizer.encode(text, add_special_tokens=bool(body.get("add_special_tokens", False))))
    if not ids:
        raise EngineHTTPError(400, error("the rendered prompt is empty"))
    return ids
