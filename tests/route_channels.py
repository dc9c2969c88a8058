"""Per-token channels as engines send them, for the cassette's tests and `benchmarks/bench_cassette_routes.py`:
expert routes by CHANNELS.md's deterministic rule (a token's row depends only on the token prefix through it, so
a prefix routes the same in every later turn, as a real model's does) and top-p kept sets, each encoded as SGLang
(base64 of raw int32) or vLLM (base64 of `.npy` bytes) sends it. Vectorized: a 100k-token prompt's rows at 48
layers take a fraction of a second."""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass
from typing import Any

import numpy as np

_MASK = (1 << 64) - 1
_P = 0x9E3779B97F4A7C15  # odd: invertible mod 2^64
_P_INV = pow(_P, -1, 1 << 64)


@dataclass(frozen=True)
class MoeShape:
    layers: int = 48
    top_k: int = 8
    experts: int = 128

    @property
    def row(self) -> int:
        return self.layers * self.top_k


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def prefix_digests(tokens: list[int] | np.ndarray) -> np.ndarray:
    """h[t] = a hash of tokens[0..t] (h[t] = P * h[t-1] + token[t] mod 2^64, mixed), computed as a prefix sum."""
    ids = np.asarray(tokens, dtype=np.uint64) + np.uint64(1)
    n = ids.size
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(n, _P, dtype=np.uint64)) if n else np.empty(0, np.uint64)  # P^(t+1)
        inverse = np.cumprod(np.full(n, _P_INV, dtype=np.uint64)) if n else np.empty(0, np.uint64)  # P^-(t+1)
        summed = np.cumsum(ids * inverse, dtype=np.uint64)
        return _mix(summed * powers)


def route_rows(tokens: list[int] | np.ndarray, shape: MoeShape) -> np.ndarray:
    """`[len(tokens), layers, top_k]` expert ids: row t picks top_k distinct experts per layer, as a router's top
    scores would be (no order or pattern zlib could find), from a hash of tokens[0..t] and the layer: top_k
    consecutive entries, from a hashed offset, of one of 4096 fixed random permutations of the experts."""
    return rows_of_digests(prefix_digests(tokens), shape)


def rows_of_digests(digest: np.ndarray, shape: MoeShape) -> np.ndarray:
    """`route_rows` from the tokens' prefix digests (a caller routing a growing sequence computes only new rows)."""
    perms = _permutations(shape.experts)
    layer = np.arange(shape.layers, dtype=np.uint64) * np.uint64(0x632BE59BD9B4E019)
    with np.errstate(over="ignore"):
        key = _mix(digest[:, None] + layer[None, :])  # [t, layer]
    table = (key % np.uint64(perms.shape[0])).astype(np.intp)
    offset = ((key >> np.uint64(32)) % np.uint64(shape.experts)).astype(np.intp)
    column = (offset[:, :, None] + np.arange(min(shape.top_k, shape.experts))) % shape.experts
    return perms[table[:, :, None], column].astype(np.int32)


@functools.cache
def _permutations(experts: int, count: int = 4096) -> np.ndarray:
    rng = np.random.default_rng(experts)
    return rng.permuted(np.tile(np.arange(experts, dtype=np.int32), (count, 1)), axis=1)


def sglang_routes(tokens: list[int], shape: MoeShape, start: int = 0, rows: np.ndarray | None = None) -> str:
    """SGLang's `meta_info.routed_experts` for a call whose prompt plus output is `tokens`: base64 of raw int32,
    rows `[start, len(tokens) - 1)` (the last sampled token has no row). `rows`: the session's rows, precomputed."""
    if rows is None:
        rows = route_rows(tokens[: len(tokens) - 1], shape)
    return base64.b64encode(np.ascontiguousarray(rows[start : len(tokens) - 1], dtype="<i4").tobytes()).decode()


def vllm_routes(tokens: list[int], shape: MoeShape, rows: np.ndarray | None = None) -> str:
    """vLLM's choice `routed_experts`: base64 of `.npy` bytes, `[len(tokens) - 1, layers, top_k]`, uint8 when
    experts <= 256 else uint16."""
    if rows is None:
        rows = route_rows(tokens[: len(tokens) - 1], shape)
    out = io.BytesIO()
    np.save(out, rows[: len(tokens) - 1].astype(np.uint8 if shape.experts <= 256 else np.uint16))
    return base64.b64encode(out.getvalue()).decode()


def kept_sets(output_ids: list[int], vocab: int = 151_936, seed: int = 0) -> tuple[str, str]:
    """SGLang's `top_p_token_ids` and `top_p_token_offsets` (base64 int32): per output token 1 to 40 kept ids, the
    sampled one among them."""
    rng = np.random.default_rng(seed)
    ids: list[np.ndarray] = []
    offsets = [0]
    for token in output_ids:
        kept = rng.integers(0, vocab, int(rng.integers(0, 40)), dtype=np.int64)
        ids.append(np.unique(np.append(kept, token)))
        offsets.append(offsets[-1] + ids[-1].size)
    flat = np.concatenate(ids) if ids else np.empty(0, np.int64)
    return (
        base64.b64encode(flat.astype("<i4").tobytes()).decode(),
        base64.b64encode(np.asarray(offsets, dtype="<i4").tobytes()).decode(),
    )


def decoded_routes(text: str, shape: MoeShape) -> np.ndarray:
    """A routes string back to `[rows, layers, top_k]` (either engine's encoding)."""
    raw = base64.b64decode(text)
    if raw.startswith(b"\x93NUMPY"):
        return np.load(io.BytesIO(raw)).astype(np.int32)
    return np.frombuffer(raw, dtype="<i4").reshape(-1, shape.layers, shape.top_k)


def with_routes(response: dict[str, Any], text: str) -> dict[str, Any]:
    """A /generate answer with `meta_info.routed_experts` set."""
    return {**response, "meta_info": {**response.get("meta_info", {}), "routed_experts": text}}


class RowCache:
    """Routes of growing sequences (an engine's sessions), each call computing only the rows it adds: the rows of
    every sequence routed so far, by the digest of its last token's prefix."""

    def __init__(self, shape: MoeShape) -> None:
        self.shape = shape
        self._rows: dict[int, np.ndarray] = {}

    def rows(self, tokens: list[int]) -> np.ndarray:
        digest = prefix_digests(tokens)
        known = next((j for j in range(digest.size - 1, -1, -1) if int(digest[j]) in self._rows), -1)
        head = self._rows[int(digest[known])] if known >= 0 else np.empty((0, self.shape.layers, self.shape.top_k))
        rows = np.concatenate((head.astype(np.int32), rows_of_digests(digest[known + 1 :], self.shape)))
        if digest.size:
            self._rows[int(digest[-1])] = rows
        return rows
