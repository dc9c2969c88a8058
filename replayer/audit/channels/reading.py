"""What the channel rules share: a session's channel notes (kept past its finishes), what the recording says of the
engine (does it serve routes, how many experts), a sample's routes as rows, and the engine's rows placed in a
sample's positions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tito_rl.cassette.format.records import Header
from tito_rl.replayer.audit.traffic import Call, SessionState, as_ids, traced_calls
from tito_rl.trajectory.adapters.engine.routes_layout import TOP_K_KEYS
from tito_rl.trajectory.dialects.view import SGLANG, SGLANG_OPENAI

NO_ROW = -2  # a position no engine answer routed (a sample's unknown row is -1)
SERVER_INFO_PATHS = ("/get_server_info", "/server_info")
ROUTES_FLAG = "enable_return_routed_experts"
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts", "num_routed_experts")
ASKING_DIALECTS = (SGLANG, SGLANG_OPENAI, None)  # engines that send routes only when asked (None: SGLang)


@dataclass
class EngineRows:
    """One call's route rows as the engine answered them: absolute positions `[start, start + len(rows))`."""

    start: int
    rows: np.ndarray  # [n, width]
    top_k: int | None


@dataclass
class ChannelNotes:
    """One session's notes for the channel rules; unlike `SessionState.notes` they outlive a finish."""

    serves_routes: str | None = None  # why the engine is known to serve routes ("" while unknown)
    width: int | None = None  # ids in an engine route row, from the session's first routes
    rows: dict[int, EngineRows] = field(default_factory=dict)  # call index -> its rows (let go at a finish)
    order: dict[str, int] = field(default_factory=dict)  # weight version -> rank of first appearance
    vllm: bool = False  # a generation spoke a vLLM dialect (its /update_weight_version aborts nothing)
    updates: list[tuple[float, float, str]] = field(default_factory=list)  # abort-all updates: start, end, path
    gateway_aborts: set[str] = field(default_factory=set)  # rids the gateway aborted itself (/abort_request)
    aborted: list[tuple[Call, float, float, str | None]] = field(default_factory=list)
    last_version: dict[int, str] = field(default_factory=dict)  # generation call index -> its last version
    first_version: dict[int, str] = field(default_factory=dict)


def notes(state: SessionState) -> ChannelNotes:
    found = state.channels
    if found is None:
        found = state.channels = ChannelNotes()
    assert isinstance(found, ChannelNotes)
    return found


def _places(header: Header) -> list[dict[str, Any]]:
    places = [header.engine or {}, header.extra or {}, header.adapter or {}, (header.target or {}).get("settings")]
    extra = header.extra or {}
    for key in ("engine_server_info", "server_info"):
        places.append(extra.get(key))
    return [p for p in places if isinstance(p, dict)]


def header_serves_routes(header: Header) -> bool:
    """Whether the header keeps the engine's start arguments saying it serves routes."""
    return any(place.get(ROUTES_FLAG) is True for place in _places(header))


def _model_number(header: Header, keys: tuple[str, ...], moe_part: int) -> int | None:
    for place in _places(header):
        for key in keys:
            value = place.get(key)
            if type(value) is int and value > 0:
                return value
        moe = place.get("moe")
        if isinstance(moe, str) and moe.count(",") == 2:
            try:
                return int(moe.split(",")[moe_part])
            except ValueError:
                continue
    return None


def experts_of(header: Header) -> int | None:
    """The model's expert count where the recording says it (engine info, settings, the fake's `moe` shape
    `LAYERS,TOP_K,EXPERTS`)."""
    return _model_number(header, EXPERT_KEYS, 2)


def top_k_of(header: Header) -> int | None:
    """The model's experts per token where the recording says it (its config's names, the fake's `moe`, or the
    adapter's route layout `[layers, top_k]`)."""
    layout = (header.adapter or {}).get("engine_routes_layout")
    if isinstance(layout, list) and len(layout) == 2 and type(layout[1]) is int and layout[1] > 0:
        return layout[1]
    return _model_number(header, TOP_K_KEYS, 1)


def sample_routes(value: Any) -> tuple[np.ndarray, int | None] | None:
    """A sample's `rollout_routed_experts` as `[rows, width]` ids and its top_k (None: a flat row, split unknown);
    None where it is not an integer array."""
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        return None
    if array.dtype.kind not in "iu" and not (array.size == 0 and array.ndim >= 1):
        return None
    if array.ndim == 0:
        return None
    rows = array.reshape(array.shape[0], -1).astype(np.int64) if array.shape[0] else np.zeros((0, 0), np.int64)
    top_k = int(array.shape[2]) if array.ndim == 3 and array.shape[1] > 1 else None
    return rows, top_k


def placed_rows(
    calls: list[Call], traced: list[tuple[int, int, int]], rows_of: dict[int, EngineRows], n_rows: int, width: int
) -> np.ndarray:
    """The engine's rows in a sample's positions (NO_ROW where none): each traced call's rows through the tokens it
    shares with the sample (a row depends on its token's prefix only), later calls over earlier ones."""
    placed = np.full((n_rows, width), NO_ROW, dtype=np.int64)
    for p, i, n in sorted(traced, key=lambda t: t[1]):
        rows = rows_of.get(calls[i].index)
        if rows is None or rows.rows.shape[1] != width:
            continue
        end = min(rows.start + len(rows.rows), p + n, n_rows)
        if end > rows.start:
            placed[rows.start : end] = rows.rows[: end - rows.start]
    return placed


def sample_tokens(sample: dict[str, Any]) -> np.ndarray:
    return as_ids(sample.get("tokens"))


def generated(calls: list[Call]) -> list[Call]:
    return [c for c in calls if c.generated]


def traced(calls: list[Call], tokens: np.ndarray) -> list[tuple[int, int, int]]:
    return traced_calls(calls, tokens)


def bad_rows(rows: np.ndarray, top_k: int | None, experts: int | None) -> dict[str, np.ndarray]:
    """Rows that cannot be routes, by kind: an id below -1 or at or past the expert count (`out of range`), a row
    of expert 0 only (`zero padding`: -1 marks an unknown row), an id twice in one layer's top_k (`repeated`)."""
    if not rows.size:
        return {}
    out: dict[str, np.ndarray] = {}
    low = np.asarray((rows < -1).any(axis=1), dtype=bool)
    if experts is not None:
        low |= np.asarray((rows >= experts).any(axis=1), dtype=bool)
    zero = np.asarray((rows == 0).all(axis=1), dtype=bool) if rows.shape[1] > 1 else np.zeros(len(rows), dtype=bool)
    repeated = np.zeros(len(rows), dtype=bool)
    if top_k and top_k > 1 and rows.shape[1] % top_k == 0:
        groups = np.sort(rows.reshape(len(rows), -1, top_k), axis=2)
        same = (groups[:, :, 1:] == groups[:, :, :-1]) & (groups[:, :, 1:] != -1)
        repeated = np.asarray(same.any(axis=(1, 2)), dtype=bool)
    for kind, mask in (("out of range", low), ("zero padding", zero & ~low), ("repeated", repeated & ~zero & ~low)):
        if mask.any():
            out[kind] = mask
    return out
