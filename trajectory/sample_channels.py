"""A sample's channels from its turns: expert routes aligned with its tokens, kept sets over its response region,
one weight version per generated turn.

Routes: each turn's answer covers the positions `[start, prompt + output - 1)` of its own tokens; the row of its
last sampled token comes from the next turn's prefill (which starts at or before it). A builder notes, in order,
each turn's routes as a write and each place its tokens were rewritten (realign, fork) as a cut: rows at and after
a cut were computed over other tokens. Rows are assembled once, when the sample is made; a row no write covers
stays -1 (never expert 0), and the metadata says which rows and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tito_rl.trajectory.channels import UNKNOWN, IntArray, Routes

if TYPE_CHECKING:
    from tito_rl.trajectory.records import TurnRecord


@dataclass(frozen=True)
class RouteWrite:
    turn_index: int
    turn: TurnRecord


@dataclass(frozen=True)
class RouteCut:
    at: int  # rows from here on were computed over tokens the builder no longer holds


RouteOp = RouteWrite | RouteCut


def assemble_routes(n_tokens: int, ops: Sequence[RouteOp], metadata: dict[str, Any]) -> IntArray | None:
    """`[n_tokens - 1, layers, top_k]` rows, or None when no turn the sample holds sent routes."""
    writes = [op for op in ops if isinstance(op, RouteWrite)]
    routed = [w for w in writes if w.turn.routes is not None]
    if not routed:
        return None
    first: Routes = routed[0].turn.routes  # type: ignore[assignment]
    width = first.width
    split = next((w.turn.routes for w in routed if w.turn.routes is not None and w.turn.routes.layers), None)
    n_rows = max(n_tokens - 1, 0)
    dtype = np.int32 if any(w.turn.routes.rows.dtype == np.int32 for w in routed if w.turn.routes) else np.int16
    rows = np.full((n_rows, width), UNKNOWN, dtype=dtype)
    missing: list[dict[str, Any]] = []
    for op in ops:
        if isinstance(op, RouteCut):
            rows[op.at :] = UNKNOWN
            continue
        routes = op.turn.routes
        if routes is None:
            why = "aborted before any forward pass" if op.turn.aborted else "the engine sent none"
            missing.append({"turn": op.turn_index, "why": why})
            continue
        if routes.width != width:
            missing.append({"turn": op.turn_index, "why": f"{routes.width} ids a row, not {width}"})
            continue
        end = min(routes.end, n_rows)
        if end > routes.start:
            rows[routes.start : end] = routes.rows[: end - routes.start]
    unknown = _unknown_ranges(rows)
    if unknown:
        metadata["routes_unknown_rows"] = unknown
    if missing:
        metadata["routes_missing_turns"] = missing
    if split is not None and split.layers and split.top_k and split.layers * split.top_k == width:
        return rows.reshape(n_rows, split.layers, split.top_k)
    metadata["routes_layout"] = f"flat: [tokens - 1, 1, {width}] (the engine did not say layers x top_k)"
    return rows.reshape(n_rows, 1, width)


def _unknown_ranges(rows: IntArray) -> list[list[int]]:
    """`[start, end)` runs of rows no answer covered."""
    if not rows.size:
        return []
    unknown = (rows == UNKNOWN).all(axis=1)
    if not unknown.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate(([0], unknown.astype(np.int8), [0]))))
    return [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2], strict=True)]


def assemble_kept(
    first: int, response_length: int, outputs: Sequence[tuple[int, int, TurnRecord]], metadata: dict[str, Any]
) -> tuple[IntArray, IntArray] | None:
    """CSR kept sets over the response region `[first, first + response_length)` from the trained outputs
    `(start, turn_index, turn)`; untrained tokens get empty spans. None when no trained turn sent any."""
    if not any(turn.kept is not None for _, _, turn in outputs):
        return None
    counts = np.zeros(response_length, dtype=np.int64)
    pieces: list[tuple[int, IntArray]] = []
    missing: list[int] = []
    for start, index, turn in sorted(outputs, key=lambda o: o[0]):
        kept = turn.kept
        if kept is None:
            missing.append(index)
            continue
        at = start - first
        n = len(kept)
        if at < 0 or at + n > response_length:
            continue  # an output before the response region (first-trained layout): not trained
        counts[at : at + n] = np.diff(kept.offsets)
        pieces.append((at, kept.ids))
    if missing:
        metadata["top_p_missing_turns"] = missing
    ids = np.concatenate([p for _, p in pieces]).astype(np.int32) if pieces else np.zeros(0, np.int32)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    return ids, offsets


def version_list(turns: Sequence[tuple[int, TurnRecord]], metadata: dict[str, Any]) -> list[str]:
    """One version per generated turn (`(turn_index, turn)`, in sample order), "" where a turn named none; [] when
    none did. A turn generated across an update lists its spans in the metadata."""
    if not any(turn.weight_versions for _, turn in turns):
        return []
    changes = [
        {"turn": index, "spans": [[s.version, s.start, s.end] for s in turn.weight_versions]}
        for index, turn in turns
        if len({s.version for s in turn.weight_versions}) > 1
    ]
    if changes:
        metadata["weight_version_changes"] = changes
    return [turn.weight_version for _, turn in turns]
