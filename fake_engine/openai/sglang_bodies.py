"""SGLang 0.5.23's OpenAI chat bodies (`srt/entrypoints/openai/protocol.py`, `serving_chat.py`), key for key.

The choice holds what the request asked for: `prompt_token_ids` (`return_prompt_token_ids` or `return_token_ids`),
`response_token_ids` (`return_token_ids`: SGLang's name for the output ids on the chat choice) and `meta_info`
(`return_meta_info`: the /generate meta_info, its `output_token_logprobs` triples carrying the token text as
serving_chat asks with `return_text_in_logprobs`). A tool call turns the finish reason into `tool_calls`, in
`meta_info` too (serving_chat mutates the same dict). Streamed chunks carry no ids and no meta_info.
"""

from __future__ import annotations

from typing import Any

from tito_rl.fake_engine.openai.calls import OpenAICall
from tito_rl.fake_engine.openai.parse import ParsedChat
from tito_rl.fake_engine.openai.tokens import token_bytes, token_text

DEFAULT_MODEL = "default"  # SGLang's ChatCompletionRequest.model default


def usage(prompt: int, completion: int, reasoning: int = 0) -> dict[str, Any]:
    """SGLang's usage; `completion_tokens_details` only where some output was reasoning (seen live, 0.5.23)."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "reasoning_tokens": reasoning,
        "completion_tokens_details": {"reasoning_tokens": reasoning} if reasoning else None,
    }


def metadata(weight_version: str, spans: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The answer's root `metadata` (0.5.23): the weight version, and the spans over the output."""
    out: dict[str, Any] = {"weight_version": weight_version}
    if spans is not None:
        out["weight_versions"] = spans
    return out


def completion_body(
    body: dict[str, Any], prompt: int, completion: int, weight_version: str, spans: list[dict[str, Any]]
) -> dict[str, Any]:
    """vLLM's completion body as SGLang writes it (seen live, 0.5.23): SGLang's usage, the root `metadata`, no
    `system_fingerprint`."""
    out = {k: v for k, v in body.items() if k != "system_fingerprint"}
    out["usage"] = usage(prompt, completion)
    out["metadata"] = metadata(weight_version, spans)
    return out


def reasoning_count(tokenizer: Any, reasoning: str | None, limit: int) -> int:
    """How many output tokens the reasoning took (its text re-encoded, at most the output's length)."""
    if not reasoning:
        return 0
    return min(limit, len(tokenizer.encode(reasoning, add_special_tokens=False)))


def model_of(call: OpenAICall) -> str:
    return str(call.body.get("model") or DEFAULT_MODEL)


def chat_logprobs(tokenizer: Any, ids: list[int], lps: list[float]) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": token_text(tokenizer, tid),
                "bytes": token_bytes(tokenizer, tid),
                "logprob": lp,
                "top_logprobs": [],
            }
            for tid, lp in zip(ids, lps, strict=True)
        ]
    }


def chat_body(
    tokenizer: Any,
    call: OpenAICall,
    prompt: list[int],
    ids: list[int],
    lps: list[float],
    finish: dict[str, Any],
    parsed: ParsedChat,
    meta: dict[str, Any],
    created: int,
) -> dict[str, Any]:
    """`finish` is /generate's finish_reason dict (mutated for tool calls, as SGLang does); `meta` its meta_info."""
    if parsed.tool_calls and finish.get("type") == "stop":
        finish["type"], finish["matched"] = "tool_calls", None
    message: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content or "",
        "reasoning_content": parsed.reasoning,
    }
    if parsed.tool_calls:
        message["tool_calls"] = parsed.tool_calls
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": chat_logprobs(tokenizer, ids, lps) if call.logprobs else None,
        "finish_reason": finish.get("type"),
        "matched_stop": finish.get("matched"),
    }
    if call.return_prompt_token_ids or call.return_token_ids:
        choice["prompt_token_ids"] = prompt
    if call.return_token_ids:
        choice["response_token_ids"] = ids
    if call.return_meta_info:
        choice["meta_info"] = meta
    metadata = {"weight_version": meta.get("weight_version")}
    if "weight_versions" in meta:
        metadata["weight_versions"] = meta["weight_versions"]
    return {
        "id": meta.get("id"),
        "object": "chat.completion",
        "created": created,
        "model": model_of(call),
        "choices": [choice],
        "usage": usage(len(prompt), len(ids), reasoning_count(tokenizer, parsed.reasoning, len(ids))),
        "metadata": metadata,
    }


def chat_chunk(
    tokenizer: Any,
    call: OpenAICall,
    delta: dict[str, Any],
    ids: list[int],
    lps: list[float],
    created: int,
    finish: str | None = None,
    matched: Any = None,
) -> dict[str, Any]:
    """One streamed chunk; `delta` in SGLang's DeltaMessage keys (role, content, reasoning_content, tool_calls)."""
    full = {
        "role": delta.get("role"),
        "content": delta.get("content"),
        "reasoning_content": delta.get("reasoning_content"),
    }
    if delta.get("tool_calls"):
        full["tool_calls"] = [
            {
                "id": c.get("id"),
                "index": c.get("index"),
                "type": "function",
                "function": {
                    "name": c.get("function", {}).get("name"),
                    "arguments": c.get("function", {}).get("arguments"),
                },
            }
            for c in delta["tool_calls"]
        ]
    choice = {
        "index": 0,
        "delta": full,
        "logprobs": chat_logprobs(tokenizer, ids, lps) if call.logprobs and ids else None,
        "finish_reason": finish,
        "matched_stop": matched,
    }
    return {
        "id": call.rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model_of(call),
        "choices": [choice],
        "usage": None,
    }
