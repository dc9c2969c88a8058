"""Per-token channels an engine sends beside the ids: expert routes, top-p kept sets, weight versions.

The wire forms (`docs/engine-dialects.md`, `docs/adapters.md`) are decoded here once, into compact numpy
arrays: routes are large (layers x top_k ids for every token of every turn), so they never become Python lists
until a sample is exported. Every decoder raises `ChannelError` with a one-line reason on malformed input.

- SGLang `meta_info.routed_experts`: base64 of raw little-endian int32, flat, rows `[start, prompt + output - 1)`
  (`start`: the request's `routed_experts_start_len`); the split of a row into layers x top_k is not sent.
- vLLM `routed_experts`: base64 of `.npy` bytes, shape `[prompt + output - 1, layers, top_k]`, uint8 or uint16.
- Kept sets (`top_p_token_ids`, `top_p_token_offsets`): CSR over the output, offsets `output + 1` long.
- Weight versions: `{"version", "start", "end"}` spans over the output positions, or one version string.
"""

from __future__ import annotations

import binascii
import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.integer[Any]]
UNKNOWN = -1  # a route row no engine answer supplied (never expert 0: that is a real expert)


class ChannelError(ValueError):
    """A channel the engine sent that cannot be read; the message says which and why, in one line."""


@dataclass(frozen=True, eq=False)
class Routes:
    """Expert ids for the absolute token positions `[start, start + len(rows))` of one call's prompt + output.

    `rows` is `[n, layers * top_k]` (the smallest signed dtype that holds the ids and -1); `layers` and `top_k`
    are None where the engine sent a flat array (SGLang) and nothing told the split."""

    start: int
    rows: IntArray
    layers: int | None = None
    top_k: int | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.rows)

    @property
    def width(self) -> int:
        return int(self.rows.shape[1])

    def from_row(self, start: int) -> Routes:
        """Only the rows from `start` on (a copy, so the rest is freed): an engine that sends every row each turn
        (vLLM) is kept to the rows the spliced prefix's earlier answers do not already hold."""
        if start <= self.start:
            return self
        return Routes(start, self.rows[start - self.start :].copy(), self.layers, self.top_k)

    def with_split(self, top_k: int | None, layers: int | None = None) -> Routes:
        """The same rows with their split into layers x top_k where `top_k` divides the width (and, where `layers`
        is known, `layers * top_k` is the width: a layout of another model leaves the rows flat)."""
        if self.layers is not None or not top_k or self.width % top_k:
            return self
        if layers is not None and layers * top_k != self.width:
            return self
        return Routes(self.start, self.rows, self.width // top_k, top_k)


@dataclass(frozen=True, eq=False)
class KeptSets:
    """Top-p kept ids per output token, CSR: token i's are `ids[offsets[i]:offsets[i + 1]]`."""

    ids: IntArray
    offsets: IntArray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def of(self, i: int) -> list[int]:
        return [int(t) for t in self.ids[int(self.offsets[i]) : int(self.offsets[i + 1])]]


@dataclass(frozen=True)
class VersionSpan:
    """The weight version that generated output positions `[start, end)`."""

    version: str
    start: int
    end: int


def compact(values: IntArray) -> IntArray:
    """`values` in int16 where every id fits (with -1), else int32: routes are most of a channel's memory."""
    if values.size and (int(values.max()) > np.iinfo(np.int16).max or int(values.min()) < UNKNOWN):
        return values.astype(np.int32, copy=False)
    return values.astype(np.int16, copy=False)


def _b64(value: str, what: str) -> bytes:
    """pybase64 (SIMD): a long MoE turn's routes are megabytes of base64, which the stdlib decoded at a tenth of
    the speed, most of an audit's time with routes; it accepts and refuses what `base64.b64decode(validate=True)`
    does."""
    import pybase64

    try:
        return pybase64.b64decode(value, validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise ChannelError(f"{what}: not base64 ({exc})") from None


def int32_array(value: Any, what: str) -> IntArray:
    """A flat int32 array from SGLang's base64 of little-endian int32 (or a plain JSON list of ints)."""
    if isinstance(value, str):
        raw = _b64(value, what)
        if len(raw) % 4:
            raise ChannelError(f"{what}: {len(raw)} bytes is not a whole number of int32")
        return np.frombuffer(raw, dtype="<i4").astype(np.int32)
    if isinstance(value, list) and all(type(v) is int for v in value):
        try:
            return np.asarray(value, dtype=np.int32)
        except OverflowError:
            raise ChannelError(f"{what}: an id does not fit int32") from None
    raise ChannelError(f"{what}: expected a base64 string or a list of ints, got {type(value).__name__}")


def sglang_routes(value: Any, start: int, rows: int, top_k: int | None = None) -> Routes:
    """SGLang's flat int32 routes for the rows `[start, start + rows)`; the width is what divides evenly."""
    flat = int32_array(value, "routed_experts")
    if rows <= 0:
        if flat.size:
            raise ChannelError(f"routed_experts: {flat.size} ids where no row was expected")
        return Routes(start, np.zeros((0, 0), np.int16))
    if flat.size % rows or not flat.size:
        raise ChannelError(f"routed_experts: {flat.size} ids do not split into {rows} rows")
    _check_ids(flat)
    return Routes(start, compact(flat.reshape(rows, -1))).with_split(top_k)


def npy_routes(value: Any, rows: int | None = None) -> Routes | None:
    """vLLM's base64 `.npy` routes (`[tokens - 1, layers, top_k]`); None for a `null` (aborted before any forward
    pass, or the engine started without them). `rows`: how many the call's tokens call for, where known."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ChannelError(f"routed_experts: expected base64 .npy bytes, got {type(value).__name__}")
    raw = _b64(value, "routed_experts")
    try:
        array = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise ChannelError(f"routed_experts: not a .npy array ({reason})") from None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iu" or array.ndim != 3:
        shape = getattr(array, "shape", None)
        raise ChannelError(f"routed_experts: expected a 3-d integer array, got {getattr(array, 'dtype', '?')} {shape}")
    if rows is not None and array.shape[0] != rows:
        raise ChannelError(f"routed_experts: {array.shape[0]} rows where the call's tokens call for {rows}")
    n, layers, top_k = (int(d) for d in array.shape)
    flat = array.reshape(n, layers * top_k).astype(np.int64)
    _check_ids(flat)
    return Routes(0, compact(flat), layers, top_k)


def _check_ids(values: IntArray) -> None:
    if values.size and int(values.min()) < 0:
        raise ChannelError(f"routed_experts: negative expert id {int(values.min())}")


def kept_sets(ids_value: Any, offsets_value: Any, output_len: int) -> KeptSets:
    """The CSR pair; offsets must be `output_len + 1` long, start at 0, never fall and end at the ids' count."""
    ids = int32_array(ids_value, "top_p_token_ids")
    offsets = int32_array(offsets_value, "top_p_token_offsets")
    if len(offsets) != output_len + 1:
        raise ChannelError(f"top_p_token_offsets: {len(offsets)} entries for {output_len} output tokens (needs +1)")
    if offsets[0] != 0 or int(offsets[-1]) != len(ids) or (len(offsets) > 1 and bool((np.diff(offsets) < 0).any())):
        raise ChannelError(
            f"top_p_token_offsets: must rise from 0 to the {len(ids)} ids, got {offsets[0]}..{offsets[-1]}"
        )
    return KeptSets(ids, offsets)


def version_spans(spans: Any, version: Any, output_len: int) -> tuple[VersionSpan, ...]:
    """`weight_versions` spans over the output (checked: in order, within it, covering it); without spans, the
    single `weight_version` over the whole output; () when the engine sent neither."""
    if spans is None:
        if version is None:
            return ()
        if not isinstance(version, str):
            raise ChannelError(f"weight_version: expected a string, got {type(version).__name__}")
        return (VersionSpan(version, 0, output_len),)
    if not isinstance(spans, list):
        raise ChannelError(f"weight_versions: expected a list of spans, got {type(spans).__name__}")
    out: list[VersionSpan] = []
    at = 0
    for span in spans:
        if not isinstance(span, dict) or not isinstance(span.get("version"), str):
            raise ChannelError(f"weight_versions: each span needs a string version, got {str(span)[:80]!r}")
        start, end = span.get("start"), span.get("end")
        if type(start) is not int or type(end) is not int or not at == start <= end <= output_len:
            raise ChannelError(
                f"weight_versions: span {start}..{end} does not continue at {at} within {output_len} output tokens"
            )
        out.append(VersionSpan(span["version"], start, end))
        at = end
    if at != output_len:
        raise ChannelError(f"weight_versions: spans cover {at} of {output_len} output tokens")
    if not out and isinstance(version, str):  # no output (aborted before its first token): the version still says
        return (VersionSpan(version, 0, 0),)
    return tuple(out)


def routes_digest(rows: IntArray) -> str:
    """A short digest of route rows (as little-endian int32): goldens pin routes without showing them."""
    import hashlib

    return hashlib.sha1(np.ascontiguousarray(rows, dtype="<i4").tobytes()).hexdigest()[:8]


def versions_text(versions: Sequence[str]) -> str:
    """Consecutive equal versions folded (`v1 x3, v2`): a long session's list stays one short line."""
    parts: list[str] = []
    i = 0
    while i < len(versions):
        j = i
        while j < len(versions) and versions[j] == versions[i]:
            j += 1
        parts.append(f"{versions[i] or '?'}" + (f" x{j - i}" if j - i > 1 else ""))
        i = j
    return ", ".join(parts)
