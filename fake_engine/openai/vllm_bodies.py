"""vLLM's response bodies and stream chunks, key for key (vLLM 0.11 `protocol.py`, `serving_chat.py`,
`serving_completion.py`; `/inference/v1/generate` from `serve/disagg/protocol.py`).

Non-streamed bodies are pydantic `model_dump()`s: every field, nulls included. Stream chunks are
`model_dump_json(exclude_unset=True)`: only what the server set, so the first chat chunk carries the role and root
`prompt_token_ids` (null unless asked), the others `delta`, `logprobs`, `finish_reason`, `token_ids`, and the last
adds `stop_reason`. The message carries the reasoning twice, as `reasoning` and its deprecated alias
`reasoning_content` (vLLM 0.11.1 onwards until the alias went), so readers of either name find it.
"""

from __future__ import annotations

from typing import Any

from tito_rl.fake_engine.openai.calls import OpenAICall
from tito_rl.fake_engine.openai.parse import ParsedChat
from tito_rl.fake_engine.openai.tokens import token_bytes, token_text
from tito_rl.trajectory.dialects.view import SGLANG_OPENAI

REASONING_KEYS = ("reasoning", "reasoning_content")


def finish_reason(finish: str, called: bool) -> str:
    """`tool_calls` when the parser found calls in an answer that stopped; a length or abort cut stays itself."""
    return "tool_calls" if called and finish == "stop" else finish


def usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None}


def _token(tokenizer: Any, tid: int, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else token_text(tokenizer, tid)


def chat_logprobs(tokenizer: Any, call: OpenAICall, ids: list[int], lps: list[float]) -> dict[str, Any] | None:
    """`choices[0].logprobs`: one entry per output token; `top_logprobs` holds the sampled token only (the fake
    engine samples no alternatives) when more than 0 are asked."""
    if not call.logprobs:
        return None
    content = []
    for tid, lp in zip(ids, lps, strict=True):
        token = _token(tokenizer, tid, call.tokens_as_ids)
        entry = {"token": token, "logprob": max(lp, -9999.0), "bytes": token_bytes(tokenizer, tid)}
        top = [dict(entry)] if call.top_logprobs > 0 else []
        content.append({**entry, "top_logprobs": top})
    return {"content": content}


def chat_body(tokenizer: Any, call: OpenAICall, prompt: list[int], ids: list[int], lps: list[float],
              finish: str, parsed: ParsedChat, created: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content, "refusal": None, "annotations": None,
                               "audio": None, "function_call": None}
    if parsed.tool_calls:  # the key is absent when there are none
        message["tool_calls"] = parsed.tool_calls
    for key in REASONING_KEYS:
        message[key] = parsed.reasoning
    choice = {"index": 0, "message": message, "logprobs": chat_logprobs(tokenizer, call, ids, lps),
              "finish_reason": finish_reason(finish, bool(parsed.tool_calls)), "stop_reason": None,
              "token_ids": ids if call.return_token_ids else None}
    return {"id": f"chatcmpl-{call.rid}", "object": "chat.completion", "created": created, "model": call.model,
            "choices": [choice], "service_tier": None, "system_fingerprint": None,
            "usage": usage(len(prompt), len(ids)), "prompt_logprobs": None,
            "prompt_token_ids": prompt if call.return_token_ids else None, "kv_transfer_params": None}


def chat_first_chunk(call: OpenAICall, prompt: list[int], created: int) -> dict[str, Any]:
    return {"id": f"chatcmpl-{call.rid}", "object": "chat.completion.chunk", "created": created, "model": call.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None}],
            "prompt_token_ids": prompt if call.return_token_ids else None}


def chat_chunk(tokenizer: Any, call: OpenAICall, delta: dict[str, Any], ids: list[int], lps: list[float],
               created: int, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": chat_logprobs(tokenizer, call, ids, lps),
                              "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    choice["token_ids"] = ids if call.return_token_ids else None
    return {"id": f"chatcmpl-{call.rid}", "object": "chat.completion.chunk", "created": created, "model": call.model,
            "choices": [choice]}


def usage_chunk(call: OpenAICall, prompt: int, completion: int, created: int, object_name: str) -> dict[str, Any]:
    prefix = "chatcmpl" if object_name.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{call.rid}", "object": object_name, "created": created, "model": call.model,
            "choices": [], "usage": usage(prompt, completion)}


def completion_logprobs(tokenizer: Any, call: OpenAICall, ids: list[int], lps: list[float],
                        pieces: list[str], offset: int = 0) -> dict[str, Any] | None:
    """`choices[0].logprobs` of `/v1/completions`: OpenAI's legacy columns; `top_logprobs` per position holds the
    sampled token (the `logprobs: N` alternatives are not sampled)."""
    if not call.logprobs:
        return None
    tokens = [_token(tokenizer, tid, call.tokens_as_ids) for tid in ids]
    offsets = []
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    return {"text_offset": offsets, "token_logprobs": [max(lp, -9999.0) for lp in lps], "tokens": tokens,
            "top_logprobs": [{t: max(lp, -9999.0)} for t, lp in zip(tokens, lps, strict=True)]}


def _stop_key(call: OpenAICall) -> str:
    """SGLang's completions (a request with its own fields, e.g. `no_stop_trim`) name it `matched_stop`."""
    return "matched_stop" if call.dialect == SGLANG_OPENAI else "stop_reason"


def completion_body(tokenizer: Any, call: OpenAICall, prompt: list[int], ids: list[int], lps: list[float],
                    finish: str, pieces: list[str], created: int) -> dict[str, Any]:
    choice = {"index": 0, "text": "".join(pieces),
              "logprobs": completion_logprobs(tokenizer, call, ids, lps, pieces), "finish_reason": finish,
              _stop_key(call): None, "token_ids": ids if call.return_token_ids else None, "prompt_logprobs": None,
              "prompt_token_ids": prompt if call.return_token_ids else None}
    return {"id": f"cmpl-{call.rid}", "object": "text_completion", "created": created, "model": call.model,
            "choices": [choice], "service_tier": None, "system_fingerprint": None,
            "usage": usage(len(prompt), len(ids)), "kv_transfer_params": None}


def completion_chunk(tokenizer: Any, call: OpenAICall, ids: list[int], lps: list[float], pieces: list[str],
                     offset: int, created: int, finish: str | None, prompt: list[int] | None) -> dict[str, Any]:
    choice = {"index": 0, "text": "".join(pieces),
              "logprobs": completion_logprobs(tokenizer, call, ids, lps, pieces, offset), "finish_reason": finish,
              _stop_key(call): None, "prompt_token_ids": prompt if call.return_token_ids else None,
              "token_ids": ids if call.return_token_ids else None}
    return {"id": f"cmpl-{call.rid}", "object": "text_completion", "created": created, "model": call.model,
            "choices": [choice]}


def generate_body(tokenizer: Any, call: OpenAICall, ids: list[int], lps: list[float], finish: str | None,
                  prompt: list[int] | None = None) -> dict[str, Any]:
    """`/inference/v1/generate`'s GenerateResponse (a stream sends the same shape per chunk, ids as deltas);
    root `prompt_token_ids` with `return_token_ids` (vLLM 0.30; a stream's first chunk only)."""
    choice = {"index": 0, "logprobs": chat_logprobs(tokenizer, call, ids, lps), "finish_reason": finish,
              "token_ids": ids}
    body: dict[str, Any] = {"request_id": call.rid, "choices": [choice]}
    if call.return_token_ids and prompt is not None:
        body["prompt_token_ids"] = prompt
    body.update({"prompt_logprobs": None, "kv_transfer_params": None})
    return body


def models_list(model: str, context_length: int, created: int) -> dict[str, Any]:
    """`GET /v1/models` as vLLM answers it."""
    card = {"id": model, "object": "model", "created": created, "owned_by": "vllm", "root": model, "parent": None,
            "max_model_len": context_length,
            "permission": [{"id": "modelperm-tito", "object": "model_permission", "created": created,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}
    return {"object": "list", "data": [card]}
