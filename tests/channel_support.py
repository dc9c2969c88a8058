"""A deterministic MoE for channel tests: a token's expert row depends only on the ids up to and including it (as a
real model's router, and the fake engine's `--moe`), so any test can recompute the rows a sample must hold.
Also the wire encodings an engine uses for them (CHANNELS.md)."""

from __future__ import annotations

import base64
import hashlib
import io
from typing import Any

import numpy as np

from tito_rl.trajectory.channels import KeptSets, Routes, VersionSpan

LAYERS, TOP_K, EXPERTS = 3, 2, 16


def expert_rows(ids: list[int]) -> np.ndarray:
    """`[len(ids), LAYERS * TOP_K]`: row t from a digest of ids[: t + 1]; TOP_K distinct experts a layer."""
    out = np.empty((len(ids), LAYERS * TOP_K), dtype=np.int32)
    h = hashlib.sha256()
    for t, token in enumerate(ids):
        h.update(int(token).to_bytes(4, "little"))
        d = h.copy().digest()
        row = []
        for layer in range(LAYERS):
            first = d[2 * layer] % EXPERTS
            row += [first, (first + 1 + d[2 * layer + 1] % (EXPERTS - 1)) % EXPERTS]
        out[t] = row
    return out


def routes_for(prompt: list[int], output: list[int], start: int) -> Routes:
    """What an engine answers for one call asked from `start`: rows `[start, prompt + output - 1)`."""
    ids = prompt + output
    rows = expert_rows(ids)[start : max(len(ids) - 1, 0)]
    return Routes(start, rows.astype(np.int16), LAYERS, TOP_K)


def kept_for(output: list[int]) -> KeptSets:
    """Token i keeps itself and i % 3 more ids (1 to 3 a token)."""
    ids: list[int] = []
    offsets = [0]
    for i, token in enumerate(output):
        ids += [token] + [10_000 + 10 * i + j for j in range(i % 3)]
        offsets.append(len(ids))
    return KeptSets(np.asarray(ids, np.int32), np.asarray(offsets, np.int32))


def versions(n_out: int, *names: str) -> tuple[VersionSpan, ...]:
    """Spans of the output split evenly among `names` (one name: the whole output)."""
    names = names or ("v1",)
    cuts = [round(n_out * i / len(names)) for i in range(len(names) + 1)]
    return tuple(VersionSpan(v, a, b) for v, a, b in zip(names, cuts, cuts[1:], strict=False))


def b64_int32(values: Any) -> str:
    """SGLang's encoding: base64 of raw little-endian int32, flat."""
    return base64.b64encode(np.ascontiguousarray(values, dtype="<i4").tobytes()).decode()


def b64_npy(array: np.ndarray) -> str:
    """vLLM's encoding: base64 of the `.npy` bytes."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def expected_rows(tokens: list[int], unknown: list[list[int]] | None = None) -> np.ndarray:
    """The rows a sample of `tokens` must hold, -1 over the `[start, end)` ranges named unknown."""
    rows = expert_rows(tokens)[: max(len(tokens) - 1, 0)].copy()
    for a, b in unknown or []:
        rows[a:b] = -1
    return rows
