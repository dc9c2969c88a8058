"""One engine call in terms every dialect shares: prompt ids, output ids, logprobs, finish reason, sampling.

A cassette stores each engine call raw (request and reply as the engine saw and sent them) with its dialect's
name; the view is read from those bytes, never stored beside them, so it cannot disagree with them. Everything
downstream (replay matching, goldens, inspect, audit) reads calls through it and so treats dialects alike.
`None` means unknown, never guessed: a messages-in call whose engine was not asked for prompt ids has
`prompt_ids=None`, not the ids tito would have rendered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.channels import KeptSets, Routes, VersionSpan

SGLANG = "sglang"  # SGLang's native POST /generate
SGLANG_OPENAI = "sglang-openai"  # SGLang's OpenAI server: /v1/chat/completions with input_ids, return_meta_info
VLLM_OPENAI = "vllm-openai"  # vLLM's /v1/chat/completions and /v1/completions with return_token_ids
VLLM_GENERATE = "vllm-generate"  # vLLM's token-in, token-out /inference/v1/generate
DIALECTS = (SGLANG, SGLANG_OPENAI, VLLM_OPENAI, VLLM_GENERATE)


def object_at(body: Mapping[str, Any], key: str) -> dict[str, Any]:
    """The JSON object under `key`, or {} where there is none or something else: bodies come from engines and
    gateways tito does not control, so a field is read for what it is, never assumed."""
    value = body.get(key)
    return value if isinstance(value, dict) else {}


# Sampling parameters under one set of names (OpenAI's), whatever the dialect calls them.
SAMPLING_NAMES = {
    "max_new_tokens": "max_tokens",
    "max_completion_tokens": "max_tokens",
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "seed": "seed",
    "n": "n",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "min_tokens": "min_tokens",
    "min_new_tokens": "min_tokens",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "no_stop_trim": "no_stop_trim",
}


@dataclass
class EngineView:
    """What one engine call asked for and produced, in a form that does not depend on its dialect."""

    dialect: str
    endpoint: str  # "generate", "chat", "completions", "abort" or "other" (health, model info, tokenize)
    prompt_ids: list[int] | None = None  # None: not in the request and not returned by the engine
    output_ids: list[int] | None = None
    logprobs: list[float | None] | None = None  # one per output id; None: the engine returned none
    finish_reason: str | None = None  # "stop", "length", "abort", "tool_calls" (OpenAI's words)
    sampling: dict[str, Any] = field(default_factory=dict)  # SAMPLING_NAMES' names, as the request set them
    messages_in: bool = False  # the engine rendered the chat template (the prompt is messages, not ids)
    stream: bool = False
    text: str | None = None  # the output text the engine returned, where it returns one
    reasoning: str | None = None  # reasoning the engine's parser split off (messages-in dialects)
    tool_calls: list[dict[str, Any]] | None = None  # tool calls the engine's parser returned
    prompt_ids_asked: bool = False  # the request asked the engine to return its prompt ids
    # Per-token channels (`dialects.channel_reads`): None / () where the answer carries none.
    routes: Routes | None = None  # expert routes of the call's prompt + output rows
    kept: KeptSets | None = None  # top-p kept set of each output token
    weight_versions: tuple[VersionSpan, ...] = ()  # the versions that generated the output, as spans
    routes_asked: bool = False  # the request asked for routes (SGLang's return_routed_experts)
    channel_error: str = ""  # why a channel the answer carries could not be read ("": none)

    @property
    def generates(self) -> bool:
        return self.endpoint in ("generate", "chat", "completions")


def sampling_view(params: dict[str, Any] | None) -> dict[str, Any]:
    """A request's sampling parameters under `SAMPLING_NAMES`' names; unknown keys are kept as they are."""
    out: dict[str, Any] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        out[SAMPLING_NAMES.get(key, key)] = value
    return out
