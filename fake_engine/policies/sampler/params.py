"""The sampling parameters a sampler honours, read under either engine's names.

SGLang's `/generate` (and its OpenAI routes, which translate to these) says `max_new_tokens`, `min_new_tokens`,
`sampling_seed`; vLLM's `SamplingParams` says `max_tokens` (the fake engine hands it over as `max_new_tokens`),
`min_tokens`, `seed`. `stop`, `stop_token_ids`, `ignore_eos`, `logit_bias` and `temperature` are common.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# A bias at or below this bans the token (OpenAI's and vLLM's -100 means "never").
BAN_BIAS = -100.0


@dataclass(frozen=True)
class SamplerParams:
    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    logit_bias: Mapping[int, float] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5


def _first(sp: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        if sp.get(key) is not None:
            return sp[key]
    return None


def read_params(sp: Mapping[str, Any]) -> SamplerParams:
    """ValueError (one line) for a value no engine would take."""
    max_new = sp.get("max_new_tokens", 128)
    stop = sp.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop if s)
    bias: dict[int, float] = {}
    for key, value in (sp.get("logit_bias") or {}).items():
        try:
            bias[int(key)] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias: {key!r}: {value!r} is not a token id and a number") from None
    temperature = _first(sp, "temperature")
    seed = _first(sp, "sampling_seed", "seed")
    t = 1.0 if temperature is None else float(temperature)
    if not (math.isfinite(t) and t >= 0):
        raise ValueError(f"temperature must be a non-negative number, got {temperature}")
    return SamplerParams(
        max_new_tokens=None if max_new is None else int(max_new),
        min_new_tokens=int(_first(sp, "min_new_tokens", "min_tokens") or 0),
        temperature=t,
        seed=None if seed is None else int(seed),
        stop=stop,
        stop_token_ids=frozenset(int(t) for t in sp.get("stop_token_ids") or ()),
        ignore_eos=bool(sp.get("ignore_eos")),
        logit_bias=bias,
    )
