"""vLLM's response bodies and stream chunks, key for key, as the release `call.vllm` names writes them (0.32.0 by
default: held to a running vLLM 0.32.0 by the engine contract, `recorder/engine_contract`).

Non-streamed bodies are pydantic `model_dump()`s: every field, nulls included. Stream chunks are
`model_dump_json(exclude_unset=True)`: only what the server set, so the first chat chunk carries the role and root
`prompt_token_ids` (null unless asked), the others `delta`, `logprobs`, `finish_reason`, `token_ids`, and the last
adds `stop_reason` (the stop id or string that matched; null at the end of the text). The last chunk of a stream
carries `system_fingerprint` (the usage chunk when one follows); `continuous_usage_stats` puts `usage` on every
chunk. The message's reasoning is `reasoning` (and its alias `reasoning_content` in the releases that had it).
`/inference/v1/generate` (0.32): logprob entries `{token_id, logprob, rank, top_logprobs}`, `usage`, `model`,
`created`, `output_mode`, and per choice `weight_versions` (the last chunk only when streamed).
"""

from __future__ import annotations

from typing import Any

from tito_rl.fake_engine.openai.calls import OpenAICall
from tito_rl.fake_engine.openai.parse import ParsedChat
from tito_rl.fake_engine.openai.tokens import token_bytes, token_text
from tito_rl.trajectory.dialects.view import SGLANG_OPENAI

REASONING_KEYS = ("reasoning", "reasoning_content")  # the 0.11.1-0.15.1 message; `call.vllm.reasoning_keys`
WEIGHT_VERSION = "default"
UNSET = object()  # `routed_experts` not given: the key stays out (an engine started without the flag)


def stop_reason(call: OpenAICall, finish: str | None, matched: Any) -> int | str | None:
    """What a stop matched: a stop string, or a stop id the request asked for; null for the end-of-text token."""
    if finish != "stop" or matched is None:
        return None
    if isinstance(matched, str):
        return matched
    stops = call.sampling.get("stop_token_ids") or []
    return matched if isinstance(matched, int) and matched in stops else None


def fingerprint(call: OpenAICall) -> str | None:
    return f"vllm-{call.vllm.version}-tito" if call.vllm.usage_details else None


def finish_reason(finish: str, called: bool) -> str:
    """`tool_calls` when the parser found calls in an answer that stopped; a length or abort cut stays itself."""
    return "tool_calls" if called and finish == "stop" else finish


def usage(prompt: int, completion: int, reasoning: int | None = None, streamed: bool = False) -> dict[str, Any]:
    """`usage`: a body's has `prompt_tokens_details` (null) and `completion_tokens_details`, a stream's only the
    latter where it is set; `reasoning` is the count under a reasoning parser (vLLM 0.32's chat), else none."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if not streamed:
        out["prompt_tokens_details"] = None
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    elif not streamed:
        out["completion_tokens_details"] = None
    return out


def chat_usage(
    call: OpenAICall, prompt: int, completion: int, reasoning: int, streamed: bool = False
) -> dict[str, Any]:
    counted = call.vllm.usage_details and call.reasoning_parser
    return usage(prompt, completion, reasoning if counted else None, streamed)


def _token(tokenizer: Any, tid: int, as_ids: bool) -> str:
    return f"token_id:{tid}" if as_ids else token_text(tokenizer, tid)


def chat_logprobs(
    tokenizer: Any, call: OpenAICall, ids: list[int], lps: list[float], sampled_in_top: bool = False
) -> dict[str, Any] | None:
    """`choices[0].logprobs`: one entry per output token; `top_logprobs` holds the sampled token only (the fake
    engine samples no alternatives) when more than 0 are asked, or always (`sampled_in_top`: vLLM's
    SamplingParams.logprobs counts alternatives beside the sampled token, /inference/v1/generate)."""
    if not call.logprobs:
        return None
    content = []
    for tid, lp in zip(ids, lps, strict=True):
        token = _token(tokenizer, tid, call.tokens_as_ids)
        entry = {"token": token, "logprob": max(lp, -9999.0), "bytes": token_bytes(tokenizer, tid)}
        top = [dict(entry)] if call.top_logprobs > 0 or sampled_in_top else []
        content.append({**entry, "top_logprobs": top})
    return {"content": content}


def token_id_logprobs(call: OpenAICall, ids: list[int], lps: list[float]) -> dict[str, Any] | None:
    """/inference/v1/generate's entries from 0.32: `{token_id, logprob, rank, top_logprobs}`, the sampled token
    first in `top_logprobs` (its rank is not known to the fake engine: 1)."""
    if not call.logprobs:
        return None
    content = []
    for tid, lp in zip(ids, lps, strict=True):
        entry = {"token_id": tid, "logprob": max(lp, -9999.0), "rank": 1}
        content.append({**entry, "top_logprobs": [dict(entry)]})
    return {"content": content}


def chat_body(
    tokenizer: Any,
    call: OpenAICall,
    prompt: list[int],
    ids: list[int],
    lps: list[float],
    finish: str,
    parsed: ParsedChat,
    created: int,
    matched: Any = None,
    reasoning_tokens: int = 0,
    routed_experts: Any = UNSET,
) -> dict[str, Any]:
    """`routed_experts`: the choice's (a `.npy` string, or None) when the engine was started with them."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": parsed.content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if parsed.tool_calls:  # the key is absent when there are none
        message["tool_calls"] = parsed.tool_calls
    for key in call.vllm.reasoning_keys:
        message[key] = parsed.reasoning
    choice = {
        "index": 0,
        "message": message,
        "logprobs": chat_logprobs(tokenizer, call, ids, lps),
        "finish_reason": finish_reason(finish, bool(parsed.tool_calls)),
        "stop_reason": stop_reason(call, finish, matched),
        "token_ids": ids if call.return_token_ids else None,
    }
    if routed_experts is not UNSET and call.vllm.routed_experts:
        choice["routed_experts"] = routed_experts
    return {
        "id": f"chatcmpl-{call.rid}",
        "object": "chat.completion",
        "created": created,
        "model": call.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": fingerprint(call),
        "usage": chat_usage(call, len(prompt), len(ids), reasoning_tokens),
        "prompt_logprobs": None,
        "prompt_token_ids": prompt if call.return_token_ids else None,
        "kv_transfer_params": None,
    }


def chat_first_chunk(call: OpenAICall, prompt: list[int], created: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{call.rid}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": call.model,
        "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        ],
        "prompt_token_ids": prompt if call.return_token_ids else None,
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
    choice: dict[str, Any] = {
        "index": 0,
        "delta": delta,
        "logprobs": chat_logprobs(tokenizer, call, ids, lps),
        "finish_reason": finish,
    }
    if finish is not None:
        choice["stop_reason"] = stop_reason(call, "stop" if finish == "tool_calls" else finish, matched)
    choice["token_ids"] = ids if call.return_token_ids else None
    return {
        "id": f"chatcmpl-{call.rid}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": call.model,
        "choices": [choice],
    }


def usage_chunk(
    call: OpenAICall, prompt: int, completion: int, created: int, object_name: str, reasoning_tokens: int = 0
) -> dict[str, Any]:
    prefix = "chatcmpl" if object_name.startswith("chat") else "cmpl"
    counts = (
        chat_usage(call, prompt, completion, reasoning_tokens, streamed=True)
        if prefix == "chatcmpl"
        else usage(prompt, completion, streamed=True)
    )
    chunk = {
        "id": f"{prefix}-{call.rid}",
        "object": object_name,
        "created": created,
        "model": call.model,
        "choices": [],
        "usage": counts,
    }
    if call.vllm.usage_details:
        chunk["system_fingerprint"] = fingerprint(call)
    return chunk


def with_stream_usage(
    call: OpenAICall, chunks: list[tuple[int, dict[str, Any]]], prompt: int, reasoning_at: list[bool]
) -> list[tuple[int, dict[str, Any]]]:
    """A chat or completions stream as the release sends it: `usage` so far on every chunk under
    `continuous_usage_stats` (with `include_usage`), and `system_fingerprint` on the last chunk when no usage chunk
    follows. `reasoning_at[i]`: output token i went to the reasoning (counted in the usage's details)."""
    if not call.vllm.usage_details:
        return chunks
    chat = call.endpoint == "chat"
    done = reasoned = 0
    out: list[tuple[int, dict[str, Any]]] = []
    for n, chunk in chunks:
        reasoned += sum(reasoning_at[done : done + n])
        done += n
        if chunk and call.continuous_usage and call.include_usage:
            counts = (
                chat_usage(call, prompt, done, reasoned, streamed=True) if chat else usage(prompt, done, streamed=True)
            )
            chunk = {**chunk, "usage": counts}
        out.append((n, chunk))
    if not call.include_usage:
        last = max((i for i, (_, chunk) in enumerate(out) if chunk), default=None)
        if last is not None:
            out[last] = (out[last][0], {**out[last][1], "system_fingerprint": fingerprint(call)})
    return out


def completion_logprobs(
    tokenizer: Any, call: OpenAICall, ids: list[int], lps: list[float], pieces: list[str], offset: int = 0
) -> dict[str, Any] | None:
    """`choices[0].logprobs` of `/v1/completions`: OpenAI's legacy columns; `top_logprobs` per position holds the
    sampled token (the `logprobs: N` alternatives are not sampled)."""
    if not call.logprobs:
        return None
    tokens = [_token(tokenizer, tid, call.tokens_as_ids) for tid in ids]
    offsets = []
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    return {
        "text_offset": offsets,
        "token_logprobs": [max(lp, -9999.0) for lp in lps],
        "tokens": tokens,
        "top_logprobs": [{t: max(lp, -9999.0)} for t, lp in zip(tokens, lps, strict=True)],
    }


def _stop_key(call: OpenAICall) -> str:
    """SGLang's completions (a request with its own fields, e.g. `no_stop_trim`) name it `matched_stop`."""
    return "matched_stop" if call.dialect == SGLANG_OPENAI else "stop_reason"


def completion_body(
    tokenizer: Any,
    call: OpenAICall,
    prompt: list[int],
    ids: list[int],
    lps: list[float],
    finish: str,
    pieces: list[str],
    created: int,
    matched: Any = None,
    routed_experts: Any = UNSET,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": "".join(pieces),
        "logprobs": completion_logprobs(tokenizer, call, ids, lps, pieces),
        "finish_reason": finish,
        _stop_key(call): stop_reason(call, finish, matched),
        "token_ids": ids if call.return_token_ids else None,
        "prompt_logprobs": None,
        "prompt_token_ids": prompt if call.return_token_ids else None,
    }
    if routed_experts is not UNSET and call.vllm.routed_experts and call.dialect != SGLANG_OPENAI:
        choice["routed_experts"] = routed_experts
    return {
        "id": f"cmpl-{call.rid}",
        "object": "text_completion",
        "created": created,
        "model": call.model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": fingerprint(call),
        "usage": usage(len(prompt), len(ids)),
        "kv_transfer_params": None,
    }


def completion_chunk(
    tokenizer: Any,
    call: OpenAICall,
    ids: list[int],
    lps: list[float],
    pieces: list[str],
    offset: int,
    created: int,
    finish: str | None,
    prompt: list[int] | None,
    matched: Any = None,
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "text": "".join(pieces),
        "logprobs": completion_logprobs(tokenizer, call, ids, lps, pieces, offset),
        "finish_reason": finish,
        _stop_key(call): stop_reason(call, finish, matched),
        "prompt_token_ids": prompt if call.return_token_ids else None,
        "token_ids": ids if call.return_token_ids else None,
    }
    return {
        "id": f"cmpl-{call.rid}",
        "object": "text_completion",
        "created": created,
        "model": call.model,
        "choices": [choice],
    }


def generate_body(
    tokenizer: Any,
    call: OpenAICall,
    ids: list[int],
    lps: list[float],
    finish: str | None,
    prompt: list[int] | None = None,
    matched: Any = None,
    *,
    chunk: bool = False,
    created: int = 0,
    total: int | None = None,
    weight_versions: list[dict[str, Any]] | None = None,
    routed_experts: str | None = None,
) -> dict[str, Any]:
    """`/inference/v1/generate`'s GenerateResponse: a body, or (`chunk`) one stream event with this step's ids;
    root `prompt_token_ids` with `return_token_ids` (vLLM 0.30; a stream's first chunk only). `total`: the output
    so far (a stream's weight-version span); `weight_versions`: the spans the tokens were made under (default: all
    of them "default"); `routed_experts`: the `.npy` string (finished answers). Before 0.32: `{request_id, choices}`
    with chat-style entries."""
    text_mode = call.body.get("output_mode") == "text"
    if not call.vllm.generate_usage:
        old_choice = {
            "index": 0,
            "logprobs": chat_logprobs(tokenizer, call, ids, lps),
            "finish_reason": finish,
            "token_ids": ids,
        }
        old: dict[str, Any] = {"request_id": call.rid, "choices": [old_choice]}
        if call.return_token_ids and prompt is not None:
            old["prompt_token_ids"] = prompt
        old.update({"prompt_logprobs": None, "kv_transfer_params": None})
        return old
    n = len(ids) if total is None else total
    versions = (weight_versions or [{"version": WEIGHT_VERSION, "start": 0, "end": n}]) if finish is not None else None
    choice: dict[str, Any] = {
        "index": 0,
        "finish_reason": finish,
        "stop_reason": stop_reason(call, finish, matched),
        "token_ids": ids,
        "routed_experts": routed_experts if finish is not None else None,
        "sampling_mask": None,
        "weight_versions": versions,
    }
    if text_mode:
        choice["text"] = tokenizer.decode(
            ids[:-1] if finish == "stop" and matched is not None and not isinstance(matched, str) else ids,
            skip_special_tokens=True,
        )
        choice["logprobs"] = chat_logprobs(tokenizer, call, ids, lps, sampled_in_top=True)
    else:
        choice["logprobs"] = token_id_logprobs(call, ids, lps)
    mode = "text" if text_mode else "tokens"
    if chunk:
        event: dict[str, Any] = {"request_id": call.rid, "usage": None}
        if prompt is not None and call.return_token_ids:
            event["prompt_token_ids"] = prompt
        return {**event, "output_mode": mode, "choices": [choice]}
    prompt_n = len(prompt or [])
    return {
        "request_id": call.rid,
        "model": call.model,
        "created": created,
        "usage": usage(prompt_n, len(ids)),
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": prompt if call.return_token_ids else None,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "output_mode": mode,
        "choices": [choice],
    }


def models_list(model: str, context_length: int, created: int) -> dict[str, Any]:
    """`GET /v1/models` as vLLM answers it."""
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": context_length,
        "permission": [
            {
                "id": "modelperm-tito",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return {"object": "list", "data": [card]}
