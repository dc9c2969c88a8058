"""The channels as each dialect's answer carries them, from one request's prompt, output and produced versions.

SGLang (`/generate`, and its OpenAI routes through the same meta_info): `top_p_token_ids` / `top_p_token_offsets`
when the request asks (`custom_params.return_top_p_token_ids`), on every streamed chunk for the output so far;
`routed_experts` when asked (`return_routed_experts`) of an engine started with `--enable-return-routed-experts`,
on the finished answer only (SGLang 0.5.23 collects them when the request finishes). vLLM: `routed_experts` on
every choice of an engine started with the flag, unasked, for the whole sequence (`.npy`, see `wire.py`), or from
the request's `routed_experts_prompt_start` (0.32: `sampling_params` of `/inference/v1/generate`, the body's root
on chat and completions; `openai/calls.py` `check_prompt_start`); null when aborted before any token was made.
Weight versions: spans of the versions the tokens were made under.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tito_rl.fake_engine.channels.kept import csr, kept_sets
from tito_rl.fake_engine.channels.moe import MoeShape
from tito_rl.fake_engine.channels.routes import answered_routes
from tito_rl.fake_engine.channels.versions import WeightVersions, spans
from tito_rl.fake_engine.channels.wire import b64_int32, npy_b64
from tito_rl.fake_engine.faults import FaultSpec
from tito_rl.fake_engine.policy import GenerateRequest


@dataclass(frozen=True)
class ChannelSettings:
    """What the engine was started with: `--enable-return-routed-experts`, `--moe`, the vocabulary's size."""

    routes: bool
    moe: MoeShape
    vocab_size: int


def sglang_channels(
    settings: ChannelSettings, greq: GenerateRequest, output: list[int], faults: FaultSpec, *, final: bool
) -> dict[str, Any]:
    """meta_info's channel keys for the output so far (`final`: the finished answer)."""
    out: dict[str, Any] = {}
    if greq.return_top_p:
        flat, offsets = csr(kept_sets(greq.input_ids, output, greq.sampling_params, settings.vocab_size))
        out["top_p_token_ids"] = b64_int32(flat)
        out["top_p_token_offsets"] = b64_int32(offsets)
    if final and settings.routes and greq.return_routed_experts:
        rows = answered_routes(greq.input_ids, output, settings.moe, greq.routed_experts_start_len, faults)
        if rows is not None:
            out["routed_experts"] = b64_int32(rows)
    return out


def vllm_routes(
    settings: ChannelSettings,
    prompt: list[int],
    output: list[int],
    faults: FaultSpec,
    finish: str | None,
    prompt_start: int = 0,
) -> str | None:
    """A vLLM choice's `routed_experts`: None with the flag off, or when aborted before any token was made.
    `prompt_start`: the request's `routed_experts_prompt_start` (checked in `[0, len(prompt)]` before): vLLM 0.32
    leaves the rows before it out, as SGLang does for `routed_experts_start_len`, and does not echo it."""
    if not settings.routes or (finish == "abort" and not output):
        return None
    rows = answered_routes(prompt, output, settings.moe, prompt_start, faults)
    return None if rows is None else npy_b64(rows, settings.moe.experts)


def version_spans(
    weights: WeightVersions, made: list[str], n_output: int, faults: FaultSpec
) -> tuple[str, list[dict[str, Any]]]:
    """(`weight_version`, `weight_versions`) for the first `n_output` tokens, of which `made` says the versions
    (tokens not yet noted, as in a policy's answer cut before production, take the current one)."""
    per_token = (made + [weights.current] * n_output)[:n_output]
    current = weights.current
    if faults.stale_weight_version:
        per_token, current = [weights.stale] * n_output, weights.stale
    found = spans(per_token, current)
    return found[-1]["version"], found
