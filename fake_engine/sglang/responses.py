"""Response bodies with SGLang's keys, key order and value shapes, per server version profile.

Key order follows the 0.5.23 TokenizerManager: `text`, `output_ids`, `meta_info`; in meta_info `id`,
`finish_reason`, `prompt_tokens`, `weight_version`, `num_retractions`, the logprob lists, then
`reasoning_tokens`, `completion_tokens`, `cached_tokens`, `weight_versions`, `e2e_latency`,
`response_sent_to_client_ts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ABORT_MESSAGE = "Aborted"
QUEUED_ABORT_MESSAGE = "Abort in waiting queue"


@dataclass(frozen=True)
class VersionProfile:
    """What differs between SGLang releases, as far as an adapter can see."""

    name: str
    contract_check: bool  # 0.5.23: schema gate, unknown sampling keys -> 400 (before: 500)
    info_routes: bool  # /model_info and /server_info (0.5.6+); the get_* aliases exist everywhere
    weight_versions: bool  # meta_info.weight_versions spans
    incremental_flag: str  # the server_info key naming incremental streaming
    cache_details: bool = False  # meta_info.cached_tokens_details {device, host} and dp_rank (0.5.23, seen live)


PROFILES: dict[str, VersionProfile] = {
    "0.5.23": VersionProfile("0.5.23", True, True, True, "incremental_streaming_output", cache_details=True),
    "0.5.6": VersionProfile("0.5.6", False, True, False, "stream_output"),
    "0.5.2": VersionProfile("0.5.2", False, False, False, "stream_output"),
}
DEFAULT_PROFILE = "0.5.23"


def get_profile(name: str) -> VersionProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown SGLang version profile {name!r}; known: {sorted(PROFILES)}") from None


def finish_stop(matched: int | str | list[int] | None) -> dict[str, Any]:
    return {"type": "stop", "matched": matched}


def finish_length(length: int) -> dict[str, Any]:
    return {"type": "length", "length": length}


def finish_abort(message: str = ABORT_MESSAGE) -> dict[str, Any]:
    return {"type": "abort", "message": message, "status_code": None, "err_type": None}


def logprob_entries(ids: list[int], logprobs: list[float], texts: list[str] | None = None) -> list[list[Any]]:
    if texts is None:
        return [[lp, tid, None] for lp, tid in zip(logprobs, ids, strict=True)]
    return [[lp, tid, t] for lp, tid, t in zip(logprobs, ids, texts, strict=True)]


def meta_info(
    *,
    rid: str,
    finish_reason: dict[str, Any] | None,
    prompt_tokens: int,
    n_output: int,
    profile: VersionProfile,
    weight_version: str,
    logprobs: list[list[Any]] | None,
    cached_tokens: int,
    e2e_latency: float | None = None,
    sent_ts: float | None = None,
    weight_versions: list[dict[str, Any]] | None = None,
    channels: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`weight_versions`: the spans over the output (default: all of it `weight_version`'s); `channels`: the
    per-token channels asked for (kept sets, routes), after the spans as the TokenizerManager adds them."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "weight_version": weight_version,
        "num_retractions": 0,
    }
    if logprobs is not None:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = logprobs
        meta["output_token_logprobs_length"] = len(logprobs)
    meta["reasoning_tokens"] = 0
    meta["completion_tokens"] = n_output
    meta["cached_tokens"] = cached_tokens
    # 0.5.23 collects the spans when the request finishes: a stream's earlier chunks have none (seen live).
    if profile.weight_versions and finish_reason is not None:
        meta["weight_versions"] = weight_versions or [{"version": weight_version, "start": 0, "end": n_output}]
    if profile.cache_details:
        meta["cached_tokens_details"] = {"device": cached_tokens, "host": 0}
        meta["dp_rank"] = None
    meta.update(channels or {})
    if e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if sent_ts is not None:
        meta["response_sent_to_client_ts"] = sent_ts
    return meta


def generate_body(text: str | None, output_ids: list[int], meta: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {} if text is None else {"text": text}
    body["output_ids"] = output_ids
    body["meta_info"] = meta
    return body


def queued_abort_body(
    *, rid: str, weight_version: str, with_logprobs: bool, e2e_latency: float, sent_ts: float, has_text: bool = True
) -> dict[str, Any]:
    """A request aborted before it ran: no prompt_tokens/cached_tokens, empty output."""
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": {"type": "abort", "message": QUEUED_ABORT_MESSAGE},
        "weight_version": weight_version,
        "e2e_latency": e2e_latency,
    }
    if with_logprobs:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = []
        meta["output_token_logprobs_length"] = 0
    meta["completion_tokens"] = 0
    meta["response_sent_to_client_ts"] = sent_ts
    return generate_body("" if has_text else None, [], meta)


def stream_error(message: str, code: int = 400) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}}


def model_info(*, model_path: str, served_model_name: str, weight_version: str) -> dict[str, Any]:
    return {
        "model_path": model_path,
        "served_model_name": served_model_name,
        "tokenizer_path": model_path,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": weight_version,
        "load_format": "auto",
        "reasoning_parser": "qwen3",
        "tool_call_parser": "qwen25",
        "disaggregation_mode": "null",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
    }


def server_info(
    *,
    model_path: str,
    served_model_name: str,
    host: str,
    port: int,
    context_length: int,
    incremental: bool,
    profile: VersionProfile,
    startup_time: float,
    enable_return_routed_experts: bool = False,
    weight_version: str = "default",
) -> dict[str, Any]:
    return {
        "model_path": model_path,
        "tokenizer_path": model_path,
        "json_model_override_args": "{}",  # SGLang's default: a client reads the model's config as the folder has it
        "served_model_name": served_model_name,
        "host": host,
        "port": port,
        "context_length": context_length,
        "skip_tokenizer_init": False,
        profile.incremental_flag: incremental,
        "reasoning_parser": "qwen3",
        "tool_call_parser": "qwen25",
        "disaggregation_mode": "null",
        "dp_size": 1,
        "tp_size": 1,
        "enable_return_routed_experts": enable_return_routed_experts,
        "launch_command": "tito fake-engine",
        "max_total_num_tokens": context_length * 8,
        "max_req_input_len": context_length - 1,
        "kv_events": None,
        "startup_time": startup_times(startup_time) if profile.cache_details else startup_time,
        "internal_states": [{"last_gen_throughput": 0.0, "memory_usage": {}}],
        "version": profile.name,
        "frontend": "python",
        **({"weight_version": weight_version, "status": "ready"} if profile.cache_details else {}),
    }


def startup_times(total: float) -> dict[str, float]:
    """0.5.23's `startup_time` is an object of phases (seen live); the fake's whole start is the tokenizer's."""
    return {"load_weight": 0.0, "kv_cache_allocation": 0.0, "scheduler_e2e": 0.0, "tokenizer_e2e": total}


def models_list(served_model_name: str, context_length: int, created: int) -> dict[str, Any]:
    card = {
        "id": served_model_name,
        "object": "model",
        "created": created,
        "owned_by": "sglang",
        "root": served_model_name,
        "parent": None,
        "max_model_len": context_length,
    }
    return {"object": "list", "data": [card]}
