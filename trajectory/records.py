"""Records that cross module boundaries: one generated turn in, one training sample out."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.runtime.untracked import untrack

FINISH_REASONS = ("stop", "length", "abort")


@dataclass
class TurnRecord:
    """What the engine produced for one agent turn, exactly as token ids.

    `prompt_ids` is what was sent to /generate and `output_ids` what came back (stop token included),
    never re-tokenised text: linearization compares id prefixes, so any re-encoding would show up as drift.
    """

    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str = "stop"
    output_log_probs: list[float] = field(default_factory=list)
    ill_formed: bool = False
    aborted: bool = False
    # Set by the adapter for explanations in events and goldens; never used for routing.
    label: str = ""
    unspliced: str = ""  # why the prompt was rendered although it continues an earlier turn ("": it was not)

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if not self.output_log_probs:
            self.output_log_probs = [0.0] * len(self.output_ids)
        if len(self.output_log_probs) != len(self.output_ids):
            raise ValueError(
                f"output_log_probs has {len(self.output_log_probs)} entries for {len(self.output_ids)} output ids"
            )
        if self.finish_reason == "abort":
            self.aborted = True
        # Kept for the whole session: never walked by the garbage collector (see tito_rl.trajectory.runtime.untracked).
        for values in (self.prompt_ids, self.output_ids, self.output_log_probs):
            untrack(values)


@dataclass
class Sample:
    """One training sample: `tokens` = prompt + response; masks and logprobs cover the response region."""

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.response_length
        if not (len(self.loss_mask) == len(self.rollout_log_probs) == n <= len(self.tokens)):
            raise ValueError(
                f"inconsistent sample: response_length={n}, loss_mask={len(self.loss_mask)}, "
                f"rollout_log_probs={len(self.rollout_log_probs)}, tokens={len(self.tokens)}"
            )
        for values in (self.tokens, self.loss_mask, self.rollout_log_probs):
            untrack(values)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def to_dict(self) -> dict[str, Any]:
        """Plain data. Token lists are copied whole (at C speed): `asdict` deep-copies them int by int, about
        2 s for one 150k-token sample."""
        return {
            "tokens": untrack(list(self.tokens)),
            "response_length": self.response_length,
            "loss_mask": untrack(list(self.loss_mask)),
            "rollout_log_probs": untrack(list(self.rollout_log_probs)),
            "reward": self.reward,
            "metadata": copy.deepcopy(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return cls(
            **{k: data[k] for k in ("tokens", "response_length", "loss_mask", "rollout_log_probs")},
            reward=data.get("reward", 0.0),
            metadata=dict(data.get("metadata", {})),
        )
