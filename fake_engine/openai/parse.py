"""Output ids -> reasoning, content and tool calls, as each engine's parsers report them.

vLLM (`--reasoning-parser qwen3 --tool-call-parser hermes --enable-auto-tool-choice`), non-streamed: the qwen3
reasoning parser needs both `<think>` and `</think>` in the text (else it is all content), and does not strip:
reasoning is the text between them, content what follows (None when empty); the hermes parser then reads
`<tool_call>{json}</tool_call>` blocks from the content, keeping the text before the first as content (None when
empty) and each call's `arguments` as `json.dumps(arguments, ensure_ascii=False)`.

vLLM, streamed (one chunk per token, `return_token_ids` on): `<think>`, `</think>`, `<tool_call>`, `</tool_call>`
and the stop token are control tokens, chunks with an empty delta; reasoning and content come as text pieces; a
tool call's first fragment (`index`, `type`, `id`, `function.name`) on the token that completes its name, then
`function.arguments` fragments that concatenate to the non-streamed arguments.

SGLang (`--reasoning-parser qwen3 --tool-call-parser qwen25`): sglang's own parsers, loaded on CPU the way tito's
adapter loads them (`trajectory/adapters/parsing/sglang_loader.py`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tito_rl.fake_engine.openai.tokens import text_pieces

THINK, THINK_END, TOOL_CALL, TOOL_CALL_END = "<think>", "</think>", "<tool_call>", "</tool_call>"


@dataclass
class ParsedChat:
    reasoning: str | None
    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def tool_call_id(seed: str, index: int, prefix: str = "chatcmpl-tool-") -> str:
    """Deterministic per (session, turn, index), so replays and goldens compare; shaped like vLLM's
    `chatcmpl-tool-<32 hex>` (SGLang: `call_<24 hex>`)."""
    digest = hashlib.blake2b(f"{seed}|{index}".encode(), digest_size=16).hexdigest()
    return prefix + (digest if prefix.startswith("chatcmpl") else digest[:24])


def _hermes(content: str | None, seed: str) -> tuple[list[dict[str, Any]], str | None]:
    if content is None or TOOL_CALL not in content:
        return [], content
    try:
        found = re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", content, flags=re.DOTALL)
        raw = [json.loads(a if a else b) for a, b in found]
        calls = [
            {
                "id": tool_call_id(seed, i),
                "type": "function",
                "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)},
            }
            for i, c in enumerate(raw)
        ]
    except (ValueError, KeyError, TypeError):
        return [], content
    before = content[: content.find(TOOL_CALL)]
    return calls, before or None


def vllm_chat(
    text: str,
    *,
    thinking: bool,
    tool_parsing: bool,
    seed: str,
    reasoning_parser: bool = True,
    starts_in_reasoning: bool = False,
) -> ParsedChat:
    """The non-streamed message vLLM's qwen3 + hermes parsers make of `text` (module docstring). Without a reasoning
    parser the text is all content. vLLM 0.32's qwen3 parser (`starts_in_reasoning`) reads everything before
    `</think>` as reasoning when thinking is on, a leading `<think>` dropped. It does so even when no `</think>`
    ever comes (all reasoning, content null); the fake engine reads such a text as content, deliberately
    (docs/engine-dialects.md, "Left out": a scripted turn without reasoning has no think block at all)."""
    reasoning: str | None = None
    content: str | None = text
    if not reasoning_parser:
        pass
    elif starts_in_reasoning and thinking and THINK_END in text:
        rest = text[len(THINK) :] if text.startswith(THINK) else text
        reasoning, _, after = rest.partition(THINK_END)
        content = after or None
    elif THINK in text and THINK_END in text:
        rest = text.partition(THINK)[2]
        reasoning, _, after = rest.partition(THINK_END)
        content = after or None
    if not tool_parsing:
        return ParsedChat(reasoning, content)
    calls, content = _hermes(content, seed)
    return ParsedChat(reasoning, content, calls)


def vllm_chat_deltas(
    tokenizer: Any,
    ids: list[int],
    *,
    tool_parsing: bool,
    seed: str,
    skip_special: bool = True,
    reasoning_keys: tuple[str, ...] = ("reasoning", "reasoning_content"),
    reasoning_parser: bool = True,
    starts_in_reasoning: bool = False,
) -> list[dict[str, Any]]:
    """One delta per output token, as vLLM streams them with `return_token_ids` (module docstring; `vllm_chat`
    for the reasoning parser's two behaviours)."""
    think, think_end, tool, tool_end = tokenizer.convert_tokens_to_ids([THINK, THINK_END, TOOL_CALL, TOOL_CALL_END])
    control = {*((think, think_end) if reasoning_parser else ()), *((tool, tool_end) if tool_parsing else ())}
    special = set(getattr(tokenizer, "all_special_ids", []))
    pieces = text_pieces(tokenizer, ids, skip_special_tokens=skip_special)
    has_reasoning = reasoning_parser and think in ids and think_end in ids
    deltas: list[dict[str, Any]] = [{} for _ in ids]
    region = "reasoning" if reasoning_parser and starts_in_reasoning and think_end in ids else "content"
    body: list[int] = []  # positions of the current tool call's body tokens
    n_calls = 0
    spelled = _spelled_tool_call(pieces) if tool_parsing and tool not in ids else None
    for pos, tid in enumerate(ids):
        if spelled is not None and pos >= spelled[0] and region == "content":
            region, body = "tool", []  # `<tool_call>` spelled in text pieces (structured outputs force it so)
        if spelled is not None and spelled[0] <= pos < spelled[1]:
            continue  # the tag's own tokens: held back, as the hermes parser holds them
        if tid == think and has_reasoning and region == "content" and pos < ids.index(think_end):
            region = "reasoning"
            continue
        if tid == think_end and region == "reasoning":
            region = "content"
            continue
        if tid == think and region == "reasoning" and starts_in_reasoning:
            continue
        if tool_parsing and tid == tool and region == "content":
            region, body = "tool", []
            continue
        if tool_parsing and tid == tool_end and region == "tool":
            _tool_fragments(deltas, body, pieces, n_calls, tool_call_id(seed, n_calls))
            n_calls += 1
            region = "content"
            continue
        if region == "tool":
            body.append(pos)
            continue
        if tid in control or tid in special or not pieces[pos]:
            continue
        if region == "reasoning":
            deltas[pos] = {k: pieces[pos] for k in reasoning_keys}
        else:
            deltas[pos] = {"content": pieces[pos]}
    if region == "tool" and body:  # cut inside a tool call: what the parser could read of it
        _tool_fragments(deltas, body, pieces, n_calls, tool_call_id(seed, n_calls))
    return deltas


def _spelled_tool_call(pieces: list[str]) -> tuple[int, int] | None:
    """Where a `<tool_call>` spelled across ordinary tokens starts and ends (token positions, the end exclusive):
    under `tool_choice` required or named, vLLM's structured outputs make the model write the tag as text, and its
    hermes parser reads it from the text all the same."""
    text = "".join(pieces)
    at = text.find(TOOL_CALL)
    if at < 0:
        return None
    starts, offset = [], 0
    for piece in pieces:
        starts.append(offset)
        offset += len(piece)
    first = max(i for i, start in enumerate(starts) if start <= at)
    end = at + len(TOOL_CALL)
    after = next((i for i, start in enumerate(starts) if start >= end), len(pieces))
    return first, after


_PARTIAL_NAME = re.compile(r'"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_PARTIAL_ARGUMENTS = re.compile(r'"arguments"\s*:\s*')


def _call_parts(text: str) -> tuple[str, str, int] | None:
    """(name, arguments, where the arguments start in `text`) of a tool call's JSON; a call cut short (by
    `max_tokens`) gives what is there of it once its name is complete, as vLLM 0.32's hermes parser streams it."""
    try:
        call = json.loads(text)
        name, arguments = call["name"], json.dumps(call["arguments"], ensure_ascii=False)
    except (ValueError, KeyError, TypeError):
        named = _PARTIAL_NAME.search(text)
        if named is None:
            return None
        rest = _PARTIAL_ARGUMENTS.search(text, named.end())
        at = rest.end() if rest else -1
        return json.loads(named.group(1)), text[at:] if rest else "", at
    name_end = text.find(json.dumps(name, ensure_ascii=False), text.find('"name"')) + len(
        json.dumps(name, ensure_ascii=False)
    )
    return name, arguments, text.find(arguments, name_end)


def _tool_fragments(deltas: list[dict[str, Any]], body: list[int], pieces: list[str], index: int, call_id: str) -> None:
    """The fragments of one tool call over its body tokens: the name where it completes, then the arguments
    spread over the tokens that spell them."""
    text = "".join(pieces[p] for p in body)
    parts = _call_parts(text)
    if parts is None:
        return  # no name yet: vLLM's hermes streams nothing for it
    name, arguments, args_at = parts
    name_at = text.find('"name"')
    name_end = text.find(json.dumps(name, ensure_ascii=False), name_at) + len(json.dumps(name, ensure_ascii=False))
    starts = []
    offset = 0
    for p in body:
        starts.append(offset)
        offset += len(pieces[p])
    sent_name = False
    sent_args = 0
    for k, p in enumerate(body):
        end = starts[k] + len(pieces[p])
        fragment: dict[str, Any] = {}
        if not sent_name and end >= name_end:
            fragment = {"index": index, "type": "function", "id": call_id, "function": {"name": name}}
            sent_name = True
        if sent_name:
            upto = (
                len(arguments)
                if args_at < 0 and k == len(body) - 1
                else (0 if args_at < 0 else max(0, min(len(arguments), end - args_at)))
            )
            if upto > sent_args:
                fragment.setdefault("index", index)
                fragment.setdefault("function", {})["arguments"] = arguments[sent_args:upto]
                sent_args = upto
        if fragment:
            deltas[p] = {"tool_calls": [fragment]}
    if sent_name and sent_args < len(arguments):  # arguments not spelled as dumped: the rest on the last token
        last = deltas[body[-1]].setdefault("tool_calls", [{"index": index, "function": {}}])[0]
        last.setdefault("function", {})["arguments"] = last["function"].get("arguments", "") + arguments[sent_args:]


def sglang_chat(
    text: str, tools: list[dict[str, Any]] | None, *, tool_parsing: bool, seed: str
) -> tuple[ParsedChat, bool]:
    """SGLang 0.5.23's message for `text` (its qwen3 reasoning and qwen25 tool parsers); the flag: tools called."""
    from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers

    sglang = parsers()
    reasoning, normal = sglang.ReasoningParser("qwen3", stream_reasoning=False).parse_non_stream(text)
    if not (tool_parsing and tools):
        return ParsedChat(reasoning or None, normal or ""), False
    models = [
        sglang.Tool(
            type="function",
            function=sglang.Function(
                name=t["function"]["name"],
                description=t["function"].get("description"),
                parameters=t["function"].get("parameters") or {"type": "object", "properties": {}},
            ),
        )
        for t in tools
    ]
    parser = sglang.FunctionCallParser(models, "qwen25")
    if not parser.has_tool_call(normal or ""):
        return ParsedChat(reasoning or None, normal or ""), False
    content, items = parser.parse_non_stream(normal or "")
    calls = [
        {
            "id": tool_call_id(seed, i, "call_"),
            "index": i,
            "type": "function",
            "function": {"name": item.name, "arguments": item.parameters},
        }
        for i, item in enumerate(items)
    ]
    return ParsedChat(reasoning or None, content or "", calls), bool(calls)
