"""The fake engine's MoE router: which experts route each token, deterministic from the token prefix.

A real MoE model routes token t by its hidden state, a function of the tokens up to and including t; so a prefix
routes the same in every later turn, cached or recomputed. The fake does the same with hashes: a chained digest of
the prefix through t seeds a score per (layer, expert), and each layer's top-k scores pick the experts (distinct by
construction, in `[0, experts)`, highest score first as a router orders them).

`routes(ids, shape)` is the reference anyone can call: row t is token t's experts at every layer. An engine's answer
for a prompt plus its output holds rows `[start, len(prompt) + len(output) - 1)`: the last sampled token has not been
forwarded, so it has no row yet (the next turn's prefill routes it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class MoeShape:
    """The model's MoE dimensions: `--moe LAYERS,TOP_K,EXPERTS`."""

    layers: int
    top_k: int
    experts: int

    def __post_init__(self) -> None:
        if self.layers < 1 or self.top_k < 1 or self.experts < 1:
            raise ValueError(f"MoE shape {self}: layers, top_k and experts must be at least 1")
        if self.top_k > self.experts:
            raise ValueError(f"MoE shape: top_k {self.top_k} is more than the {self.experts} experts")

    @classmethod
    def parse(cls, text: str) -> MoeShape:
        """`LAYERS,TOP_K,EXPERTS`, e.g. `2,2,8`; a ValueError naming the expected form otherwise."""
        parts = [p.strip() for p in str(text).split(",")]
        try:
            layers, top_k, experts = (int(p) for p in parts)
        except ValueError:
            raise ValueError(
                f"MoE shape {text!r}: expected LAYERS,TOP_K,EXPERTS (three integers, e.g. 2,2,8)"
            ) from None
        return cls(layers, top_k, experts)

    def __str__(self) -> str:
        return f"{self.layers},{self.top_k},{self.experts}"


# Names model configs give the number of routed experts (Qwen3-MoE, Mixtral, DeepSeek).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def config_shape(folder: str) -> MoeShape | None:
    """The MoE shape the config.json in `folder` states, as a real SGLang serving that folder routes by (its
    capturer's rows are `num_hidden_layers` x `num_experts_per_tok`); None where it states no full shape."""
    from tito_rl.trajectory.adapters.engine.routes_layout import config_layout

    layout = config_layout(folder)
    if layout is None or layout.layers is None:
        return None
    try:
        config = json.loads(Path(folder, "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config")
    for section in (text, config) if isinstance(text, dict) else (config,):
        experts = next((v for k in EXPERT_KEYS if type(v := section.get(k)) is int and v > 0), None)
        if experts is not None:
            return MoeShape(layout.layers, layout.top_k, experts)
    return None


# The tiny random Qwen3-MoE a real SGLang serves on a CPU (shared/notes/real-sglang-cpu.md): 2 layers, top 2 of 8.
DEFAULT_MOE = MoeShape(2, 2, 8)


def prefix_digests(ids: Sequence[int], seed: bytes = b"tito-moe", state: bytes | None = None) -> list[bytes]:
    """Digest t covers ids[0..t] (a chain: each folds the previous one with the next id); `state`: continue a chain
    from the digest of the ids before these."""
    out: list[bytes] = []
    state = state or hashlib.blake2b(seed, digest_size=16).digest()
    for tid in ids:
        state = hashlib.blake2b(state + int(tid).to_bytes(8, "little", signed=True), digest_size=16).digest()
        out.append(state)
    return out


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: np.ndarray = x ^ (x >> np.uint64(31))
    return out


def routes(ids: Sequence[int], shape: MoeShape) -> np.ndarray:
    """Every token's experts: int32 `[len(ids), layers, top_k]`, row t a function of ids[0..t] only."""
    n = len(ids)
    out = np.empty((n, shape.layers, shape.top_k), dtype=np.int32)
    if n == 0:
        return out
    seeds = np.frombuffer(b"".join(d[:8] for d in prefix_digests(ids)), dtype="<u8").astype(np.uint64)
    experts = np.arange(shape.experts, dtype=np.uint64) * _GOLDEN
    with np.errstate(over="ignore"):
        for layer in range(shape.layers):
            salt = _mix(np.array([layer + 1], dtype=np.uint64) * np.uint64(0xD6E8FEB86659FD93) & _MASK)[0]
            scores = _mix(seeds[:, None] ^ salt ^ experts[None, :])
            # The top-k scores, highest first (64-bit scores: ties are as good as impossible).
            keys = ~scores  # ascending keys = descending scores
            top = np.argpartition(keys, shape.top_k - 1, axis=1)[:, : shape.top_k]
            order = np.take_along_axis(top, np.argsort(np.take_along_axis(keys, top, axis=1), axis=1), axis=1)
            out[:, layer, :] = order.astype(np.int32)
    return out


def answer_rows(ids: Sequence[int], shape: MoeShape, start: int = 0) -> np.ndarray:
    """What an engine answers for `ids` (prompt and output): rows `[start, len(ids) - 1)`."""
    return routes(ids, shape)[start : max(start, len(ids) - 1)]
