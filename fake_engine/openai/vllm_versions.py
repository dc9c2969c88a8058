"""Which vLLM release the fake engine imitates (`tito fake-engine --vllm-version`), as SGLang's profiles do.

The default is the release the engine contract checked live (`make engine-contract-live`: vLLM 0.32.0 on the CPU);
the others differ where docs/engine-dialects.md pins a change by version. A profile holds only what changes.
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM_DEFAULT_VERSION = "0.32.0"


@dataclass(frozen=True)
class VllmProfile:
    """What a vLLM release writes, where releases differ."""

    version: str
    generate_token_ids_in_logprobs: bool  # /inference/v1/generate: entries `{token_id, logprob, rank}` (0.32)
    generate_usage: bool  # /inference/v1/generate: `usage`, `model`, `created`, `weight_versions` (0.32)
    reasoning_content_alias: bool  # the message's `reasoning_content` beside `reasoning` (0.11.1 to 0.15.1)
    starts_in_reasoning: bool  # the qwen3 reasoning parser: all reasoning until `</think>` when thinking (0.32)
    usage_details: bool  # chat usage: `completion_tokens_details.reasoning_tokens`; `system_fingerprint` (0.32)
    # chat and completions choices: `routed_experts` with --enable-return-routed-experts (0.22, PR #38939);
    # /inference/v1/generate has it (and `weight_versions`) with its 0.32 shape (`generate_usage`)
    routed_experts: bool
    # `routed_experts_prompt_start` read and checked (0.32's SamplingParams; where it was added is not pinned here:
    # the other profiles ignore it, as an engine without the field ignores an unknown key)
    routed_experts_prompt_start: bool = False

    @property
    def reasoning_keys(self) -> tuple[str, ...]:
        return ("reasoning", "reasoning_content") if self.reasoning_content_alias else ("reasoning",)


VLLM_PROFILES = {
    "0.32.0": VllmProfile(
        "0.32.0",
        generate_token_ids_in_logprobs=True,
        generate_usage=True,
        reasoning_content_alias=False,
        starts_in_reasoning=True,
        usage_details=True,
        routed_experts=True,
        routed_experts_prompt_start=True,
    ),
    "0.31.0": VllmProfile(
        "0.31.0",
        generate_token_ids_in_logprobs=False,
        generate_usage=False,
        reasoning_content_alias=False,
        starts_in_reasoning=False,
        usage_details=False,
        routed_experts=True,
    ),
    "0.15.1": VllmProfile(
        "0.15.1",
        generate_token_ids_in_logprobs=False,
        generate_usage=False,
        reasoning_content_alias=True,
        starts_in_reasoning=False,
        usage_details=False,
        routed_experts=False,
    ),
}


def vllm_profile(version: str) -> VllmProfile:
    try:
        return VLLM_PROFILES[version]
    except KeyError:
        raise ValueError(f"unknown vLLM version {version!r} (known: {', '.join(sorted(VLLM_PROFILES))})") from None
