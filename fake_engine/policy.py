"""The Policy interface: what the fake engine asks "the model" for, and what it gets back.

The app owns HTTP, validation, queues, aborts and faults; a policy only maps a request to token ids.
Policies shipped: `scripted.ScriptedPolicy` (scenario files, the demo), `sampler.policy.RandomPolicy` (samples
like a model). A cassette-backed policy plugs in
the same way: implement `generate`, raise `PolicyError` for "no match"-style failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from tito_rl.fake_engine.faults import FaultSpec

FinishKind = Literal["stop", "length", "abort"]
FINISH_KINDS: tuple[FinishKind, ...] = ("stop", "length", "abort")


def finish_kind(value: Any) -> FinishKind:
    """A recorded finish type as one the engine plays; anything else (an engine's own, a corrupt one) as "stop"."""
    return next((kind for kind in FINISH_KINDS if kind == value), "stop")


@dataclass(frozen=True)
class GenerateRequest:
    """One validated single (non-batch) /generate call, as a policy sees it."""

    input_ids: list[int]
    sampling_params: dict[str, Any]
    rid: str
    stream: bool = False
    return_logprob: bool = False
    routing_key: str | None = None  # X-SMG-Routing-Key header, else the body's routing_key
    headers: Mapping[str, str] = field(default_factory=dict)
    session_key: str = ""  # routing key, else a digest of the prompt's opening (see sessions.py)
    turn_index: int = 0  # assistant turns already in the prompt
    # The per-token channels asked for (fake_engine/channels): routes from this absolute token index on, kept sets.
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    return_top_p: bool = False
    choice_index: int = 0  # which of the request's `n` choices (a sampling policy draws each its own stream)
    dialect: str = "sglang"  # the API it came in on (trajectory/dialects/view.py), for engine-specific sampling
    body: Mapping[str, Any] = field(default_factory=dict)  # the request as sent (SGLang's logprob layout reads it)

    @property
    def max_new_tokens(self) -> int | None:
        value = self.sampling_params.get("max_new_tokens", 128)
        return None if value is None else int(value)


@dataclass
class Generation:
    """What the model produced: output ids (stop token included when it stopped) and their logprobs."""

    output_ids: list[int]
    logprobs: list[float] | None = None  # one per output id; None: the app derives deterministic ones
    finish: FinishKind = "stop"
    matched: int | str | list[int] | None = None  # stop: what matched (default: the last output id)
    cached_tokens: int = 0
    faults: FaultSpec | None = None

    def __post_init__(self) -> None:
        if self.finish not in ("stop", "length", "abort"):
            raise ValueError(f"finish must be stop, length or abort, got {self.finish!r}")
        if self.logprobs is not None and len(self.logprobs) != len(self.output_ids):
            raise ValueError(f"{len(self.logprobs)} logprobs for {len(self.output_ids)} output ids")


class PolicyError(Exception):
    """A policy's refusal, answered as HTTP `status` with SGLang's ValueError envelope."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@runtime_checkable
class Policy(Protocol):
    def generate(self, req: GenerateRequest) -> Generation: ...
