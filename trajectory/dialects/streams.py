"""A streamed OpenAI-style answer as the one body it adds up to: deltas concatenated, the first chunk's prompt ids.

vLLM puts `prompt_token_ids` on the first chunk only (root for chat and `/inference/v1/generate`, on the choice for
completions), a delta of `token_ids` on every chunk, and (0.13+) emits the tokens a parser swallows (tool-call and
reasoning markers) as chunks with an empty delta `{}`; tool calls come as fragments keyed by `index`, the first
carrying `id`, `type` and the name. `finish_reason` and `stop_reason` (SGLang: `matched_stop`) come on the last
choice chunk; with `include_usage` a final chunk has `choices: []` and the usage. A cassette keeps the chunks
themselves (a replay re-sends them); this is how they are read.
"""

from __future__ import annotations

from typing import Any


def merged_chunks(chunks: list[Any]) -> dict[str, Any] | None:
    """The non-streamed body equivalent of `chunks` (first choice only); None when no chunk is a JSON object."""
    objects = [c for c in chunks if isinstance(c, dict)]
    if not objects:
        return None
    body: dict[str, Any] = {k: v for k, v in objects[0].items() if k != "choices"}
    choice: dict[str, Any] = {"index": 0, "finish_reason": None}
    message: dict[str, Any] = {}
    token_ids: list[int] | None = None
    content_lps: list[Any] | None = None
    token_lps: list[Any] | None = None
    tools: dict[int, dict[str, Any]] = {}
    for chunk in objects:
        for key in ("prompt_token_ids", "usage", "metadata"):
            if chunk.get(key) is not None:
                body[key] = chunk[key]
        # SGLang 0.5.23 sends the root `sglext` (its routes) in a chunk of its own after the finish, `choices: []`.
        if isinstance(chunk.get("sglext"), dict) and chunk is not objects[0]:
            body["sglext"] = {**(body.get("sglext") or {}), **chunk["sglext"]}
        choices = chunk.get("choices")
        # With n > 1 each chunk carries one choice, any index: keep choice 0's.
        first = (
            next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), None)
            if isinstance(choices, list)
            else None
        )
        if first is None:
            continue
        if first.get("prompt_token_ids") is not None:
            choice["prompt_token_ids"] = first["prompt_token_ids"]
        if isinstance(first.get("token_ids"), list):
            token_ids = (token_ids or []) + first["token_ids"]
        # The per-token channels come whole on the last choice chunk (vLLM: routed_experts, weight_versions).
        for key in ("finish_reason", "stop_reason", "matched_stop", "routed_experts", "weight_versions", "sgl_ext"):
            if first.get(key) is not None:
                choice[key] = first[key]
        if first.get("meta_info") is not None:
            choice["meta_info"] = first["meta_info"]
        if isinstance(first.get("text"), str):
            choice["text"] = choice.get("text", "") + first["text"]
        logprobs = first.get("logprobs")
        if isinstance(logprobs, dict):
            if isinstance(logprobs.get("content"), list):
                content_lps = (content_lps or []) + logprobs["content"]
            if isinstance(logprobs.get("token_logprobs"), list):
                token_lps = (token_lps or []) + logprobs["token_logprobs"]
        delta = first.get("delta")
        if isinstance(delta, dict):
            for key in ("content", "reasoning_content", "reasoning"):
                if isinstance(delta.get(key), str):
                    message[key] = message.get(key, "") + delta[key]
            if isinstance(delta.get("role"), str):
                message["role"] = delta["role"]
            for fragment in delta.get("tool_calls") or ():
                if isinstance(fragment, dict):
                    _merge_tool_fragment(tools, fragment)
    if token_ids is not None:
        choice["token_ids"] = token_ids
    if content_lps is not None:
        choice["logprobs"] = {"content": content_lps}
    if token_lps is not None:
        choice["logprobs"] = {**choice.get("logprobs", {}), "token_logprobs": token_lps}
    if message or tools or "text" not in choice:
        if tools:
            message["tool_calls"] = [tools[i] for i in sorted(tools)]
        choice["message"] = message
    body["choices"] = [choice]
    return body


def _merge_tool_fragment(tools: dict[int, dict[str, Any]], fragment: dict[str, Any]) -> None:
    given = fragment.get("index")
    index = given if type(given) is int else len(tools)
    call = tools.setdefault(index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    if fragment.get("id"):
        call["id"] = fragment["id"]
    function = fragment.get("function")
    if isinstance(function, dict):
        if isinstance(function.get("name"), str):
            call["function"]["name"] += function["name"]
        if isinstance(function.get("arguments"), str):
            call["function"]["arguments"] += function["arguments"]
