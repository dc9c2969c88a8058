"""The model's native Qwen3 output format, rendered to token ids with the real tokenizer.

`<think>\\n...\\n</think>\\n\\n` + text + one `\\n<tool_call>\\n{json}\\n</tool_call>` per call + `<|im_end|>`:
exactly what sglang's `ReasoningParser("qwen3")` and `FunctionCallParser(tools, "qwen25")` parse back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

EOS_ID = 151645  # <|im_end|>


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def render_text(reasoning: str | None, text: str, tool_calls: list[ToolCall]) -> str:
    out = ""
    if reasoning is not None:
        out += f"<think>\n{reasoning.strip(chr(10))}\n</think>\n\n"
    out += text
    for i, call in enumerate(tool_calls):
        payload = json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False)
        sep = "" if (i == 0 and not text) else "\n"
        out += f"{sep}<tool_call>\n{payload}\n</tool_call>"
    return out


def render_ids(
    tokenizer: Any, reasoning: str | None, text: str, tool_calls: list[ToolCall], stop: bool = True
) -> list[int]:
    ids = list(tokenizer.encode(render_text(reasoning, text, tool_calls), add_special_tokens=False))
    return ids + [EOS_ID] if stop else ids
