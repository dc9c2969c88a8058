"""Records that cross module boundaries: one generated turn in, one training sample out."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tito_rl.trajectory.channels import IntArray, KeptSets, Routes, VersionSpan
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
    # Per-token channels, where the engine sent them (`trajectory.channels`): expert routes for the positions
    # `[routes.start, len(prompt_ids) + len(output_ids) - 1)` (the last sampled token has no row yet), the top-p
    # kept set of each output token, and the weight versions that generated the output.
    routes: Routes | None = None
    kept: KeptSets | None = None
    weight_versions: tuple[VersionSpan, ...] = ()

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
        self._check_channels()
        # Kept for the whole session: never walked by the garbage collector (see tito_rl.trajectory.runtime.untracked).
        for values in (self.prompt_ids, self.output_ids, self.output_log_probs):
            untrack(values)

    def _check_channels(self) -> None:
        n_out = len(self.output_ids)
        rows = max(len(self.prompt_ids) + n_out - 1, 0)
        if self.routes is not None and not 0 <= self.routes.start <= self.routes.end <= rows:
            raise ValueError(
                f"routes cover positions {self.routes.start}..{self.routes.end}, outside the {rows} rows "
                f"of a {len(self.prompt_ids)}-token prompt and {n_out}-token output"
            )
        if self.kept is not None and len(self.kept) != n_out:
            raise ValueError(f"kept sets for {len(self.kept)} tokens of a {n_out}-token output")
        if self.weight_versions and self.weight_versions[-1].end != n_out:
            raise ValueError(f"weight versions cover {self.weight_versions[-1].end} of {n_out} output tokens")

    @property
    def weight_version(self) -> str:
        """The version at the end of the output ("" where the engine named none)."""
        return self.weight_versions[-1].version if self.weight_versions else ""


@dataclass(eq=False)
class Sample:
    """One training sample: `tokens` = prompt + response; masks and logprobs cover the response region."""

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    rollout_log_probs: list[float]
    reward: float = 0.0
    metadata: dict[str, Any] = field(default_factory=dict)
    # Channels (slime's names and layouts), None / empty where no engine answer carried them.
    # Routes: `[len(tokens) - 1, layers, top_k]`, row t = the experts that routed token t; -1 where unknown.
    rollout_routed_experts: IntArray | None = None
    # Kept sets, CSR over the response region: offsets `response_length + 1` long; untrained tokens empty.
    rollout_top_p_token_ids: IntArray | None = None
    rollout_top_p_token_offsets: IntArray | None = None
    weight_versions: list[str] = field(default_factory=list)  # one per generated turn in the sample, in order

    def __post_init__(self) -> None:
        n = self.response_length
        if not (len(self.loss_mask) == len(self.rollout_log_probs) == n <= len(self.tokens)):
            raise ValueError(
                f"inconsistent sample: response_length={n}, loss_mask={len(self.loss_mask)}, "
                f"rollout_log_probs={len(self.rollout_log_probs)}, tokens={len(self.tokens)}"
            )
        for values in (self.tokens, self.loss_mask, self.rollout_log_probs):
            untrack(values)
        self._check_channels()

    def _check_channels(self) -> None:
        routes = self.rollout_routed_experts
        if routes is not None:
            routes = self.rollout_routed_experts = np.asarray(routes)
            rows = max(len(self.tokens) - 1, 0)
            if routes.ndim != 3 or routes.shape[0] != rows or routes.dtype.kind not in "iu":
                raise ValueError(
                    f"inconsistent sample: rollout_routed_experts is {routes.dtype} {list(routes.shape)}, "
                    f"expected [{rows}, layers, top_k] ints for {len(self.tokens)} tokens"
                )
        ids, offsets = self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets
        if (ids is None) != (offsets is None):
            raise ValueError("inconsistent sample: rollout_top_p_token_ids and _offsets come together")
        if ids is not None and offsets is not None:
            ids = self.rollout_top_p_token_ids = np.asarray(ids, dtype=np.int32).reshape(-1)
            offsets = self.rollout_top_p_token_offsets = np.asarray(offsets, dtype=np.int32).reshape(-1)
            n = self.response_length
            if (
                len(offsets) != n + 1
                or offsets[0] != 0
                or int(offsets[-1]) != len(ids)
                or bool((np.diff(offsets) < 0).any())
            ):
                raise ValueError(
                    f"inconsistent sample: rollout_top_p_token_offsets has {len(offsets)} entries "
                    f"(needs response_length + 1 = {n + 1}, rising from 0 to the {len(ids)} ids)"
                )
        if not all(isinstance(v, str) for v in self.weight_versions):
            raise ValueError("inconsistent sample: weight_versions must be strings")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass default was

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    def to_dict(self, arrays: bool = False) -> dict[str, Any]:
        """Plain data. Token lists are copied whole (at C speed): `asdict` deep-copies them int by int, about
        2 s for one 150k-token sample. `arrays`: the channels stay numpy arrays (copied), for the finish path
        that writes them as JSON with orjson and stores them packed: nested lists of a long MoE sample's routes
        (100k tokens x 48 layers x top 8: 38M ints) take tens of seconds to build and as long to write."""
        data: dict[str, Any] = {
            "tokens": untrack(list(self.tokens)),
            "response_length": self.response_length,
            "loss_mask": untrack(list(self.loss_mask)),
            "rollout_log_probs": untrack(list(self.rollout_log_probs)),
            "reward": self.reward,
            "metadata": copy.deepcopy(self.metadata),
        }
        # Channels only where the sample has them: a sample without any has the same dict as before they existed.
        if self.rollout_routed_experts is not None:
            routes = self.rollout_routed_experts
            data["rollout_routed_experts"] = routes.copy() if arrays else routes.tolist()
        if self.rollout_top_p_token_ids is not None and self.rollout_top_p_token_offsets is not None:
            ids, offsets = self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets
            data["rollout_top_p_token_ids"] = ids.copy() if arrays else untrack(ids.tolist())
            data["rollout_top_p_token_offsets"] = offsets.copy() if arrays else untrack(offsets.tolist())
        if self.weight_versions:
            data["weight_versions"] = list(self.weight_versions)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        routes = data.get("rollout_routed_experts")
        return cls(
            **{k: data[k] for k in ("tokens", "response_length", "loss_mask", "rollout_log_probs")},
            reward=data.get("reward", 0.0),
            metadata=dict(data.get("metadata", {})),
            rollout_routed_experts=None if routes is None else _routes_array(routes, len(data["tokens"])),
            rollout_top_p_token_ids=data.get("rollout_top_p_token_ids"),
            rollout_top_p_token_offsets=data.get("rollout_top_p_token_offsets"),
            weight_versions=list(data.get("weight_versions") or []),
        )


def _routes_array(routes: Any, tokens: int) -> IntArray:
    """Nested lists back as an array; an empty list (a one-token sample) keeps its rows-first shape."""
    array = np.asarray(routes, dtype=np.int32)
    if array.size == 0 and array.ndim != 3:
        array = array.reshape(max(tokens - 1, 0), 0, 0)
    return array
