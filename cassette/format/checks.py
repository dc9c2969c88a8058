"""What a decoded record may hold: each field of the declared type, within the format's own value rules, so
the code that reads records never meets anything else."""

from __future__ import annotations

import functools
import math
import re
import reprlib
import types
from array import array
from collections.abc import Callable
from typing import Any, Union, get_args, get_origin, get_type_hints

from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.packing import U32_MAX, PackedColumn, PackedIds

MAX_NESTING = 64  # lists and maps inside a record (JSON bodies: about a dozen; Python recurses ~1000 deep)


# Checked once its deltas are resolved, so the code that reads records never meets another type than the
# dataclasses declare; `Any` is msgpack data (str-keyed maps, lists, str, bytes, numbers, bool, nil) nested at
# most MAX_NESTING deep. The values below are the format's own invariants (FORMAT.md).

NON_NEGATIVE = ("seq", "retry_of", "turn_index", "response_length")
TIMINGS = ("started_s", "duration_s")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_LINE_BREAK = re.compile(r"[\r\n\x00]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # in a session name: it is printed to terminals as it is


class TokenId(int):
    """A token id in the record checks: a uint32, as the format packs them (a tokenizer refuses others)."""


# Keys of a /generate request and response, and of a sample, that replay and inspect read: typed too.
REQUEST_KEYS: dict[str, Any] = {"input_ids": list[TokenId], "sampling_params": dict[str, Any]}
RESPONSE_KEYS: dict[str, Any] = {"output_ids": list[TokenId], "meta_info": dict[str, Any]}
SAMPLE_KEYS: dict[str, Any] = {
    "tokens": list[TokenId],
    "response_length": int,
    "loss_mask": list[int],
    "rollout_log_probs": list[float],
    "reward": float,
    "metadata": dict[str, Any],
}


def check_fields(record: object, kind: str, built: Built | None = None) -> None:
    """A CorruptCassetteError naming the first field of `record` (a dataclass) that has another type than
    declared, or breaks a value rule of the format. `built`: the lists the decoder made, by id, with the type
    of their items."""
    built = built or {}
    for name, hint in _hints(type(record)).items():
        value = getattr(record, name)
        if not _fits(value, hint, 0, built):
            raise CorruptCassetteError(
                f"corrupt cassette: {kind} record field {name!r}: expected {_named(hint)}, got {_shown(value)}"
            )
        if name in NON_NEGATIVE and value is not None and value < 0:
            raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r} is negative ({value})")
        if name in TIMINGS and not (math.isfinite(value) and value >= 0):
            raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r} is not a time ({value})")
        if name == "status" and not 0 <= value <= 999:
            raise CorruptCassetteError(f"corrupt cassette: {kind} record status {value} is not an HTTP status")
        if name == "session" and _CONTROL.search(value):
            raise CorruptCassetteError(f"corrupt cassette: a session name holds control characters: {value!r}"[:160])
        if name in ("headers", "reply_headers"):
            _check_headers(value, f"{kind} record field {name!r}")
        if name == "method" and not _HEADER_NAME.match(value):  # replay sends it: an HTTP method is a token
            raise CorruptCassetteError(
                f"corrupt cassette: {kind} record field 'method': not an HTTP method: {value!r}"[:200]
            )
    parts = [(f"sample {i}", sample, SAMPLE_KEYS) for i, sample in enumerate(getattr(record, "samples", None) or [])]
    for name, keys in (("request", REQUEST_KEYS), ("response", RESPONSE_KEYS)):
        if isinstance(getattr(record, name, None), dict):
            parts.append((name, getattr(record, name), keys))
    for where, part, keys in parts:
        for key, hint in keys.items():
            if key in part and not _fits(part[key], hint, 1, built):
                raise CorruptCassetteError(
                    f"corrupt cassette: {kind} record {where} {key!r}: expected {_named(hint)}, got {_shown(part[key])}"
                )


def _check_headers(headers: dict[str, Any], where: str) -> None:
    """HTTP header names are tokens and values hold no line break: what was on the wire (replay re-sends them)."""
    for key, value in headers.items():
        values = value if isinstance(value, list) else [value]
        if not _HEADER_NAME.match(key) or any(_LINE_BREAK.search(v) for v in values):
            raise CorruptCassetteError(f"corrupt cassette: {where}: {key!r} is not an HTTP header"[:200])


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    """A record class's field types, resolved once (the decoder checks every record it reads)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = get_type_hints(cls)
    return hints


Built = dict[int, Any]
Check = Callable[[Any, int, Built], bool]


def _fits(value: Any, hint: Any, depth: int, built: Built) -> bool:
    return _checker(hint)(value, depth, built)


@functools.cache
def _checker(hint: Any) -> Check:
    """A function telling whether a value is of type `hint`, built once per annotation (reading is hot)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return _is_data
    if origin in (Union, types.UnionType):
        options = tuple(_checker(option) for option in args)
        return lambda v, d, b: any(fits(v, d, b) for fits in options)
    if hint is type(None):
        return lambda v, d, b: v is None
    if hint is float:
        return lambda v, d, b: type(v) is float or type(v) is int
    if hint is TokenId:
        return lambda v, d, b: type(v) is int and 0 <= v <= U32_MAX
    if origin is dict:
        key, item = _checker(args[0]), _checker(args[1])
        return lambda v, d, b: (
            type(v) is dict and d < MAX_NESTING and all(key(k, d, b) and item(x, d + 1, b) for k, x in v.items())
        )
    if origin is list:
        item, number = _checker(args[0]), args[0] if args[0] in (int, float, TokenId) else None
        known = {int: (int,), TokenId: (int,), float: (int, float)}.get(args[0], ())  # built lists whose items fit
        if args[0] is TokenId:  # or a prompt left packed: the format's own uint32 array
            return lambda v, d, b: (
                type(v) is PackedIds
                or type(v) is list
                and d < MAX_NESTING
                and (b.get(id(v)) in known or _numbers(v, TokenId) or all(item(x, d + 1, b) for x in v))
            )
        # or a sample's column left packed (`PackedColumn`): a mask holds only 0 and 1, float64s are floats
        column = {int: "mask", float: "f64"}.get(args[0])
        return lambda v, d, b: (
            (type(v) is PackedColumn and v.kind == column)
            or (
                type(v) is list
                and d < MAX_NESTING
                and (
                    b.get(id(v)) in known
                    or (number is not None and _numbers(v, number))
                    or all(item(x, d + 1, b) for x in v)
                )
            )
        )
    return lambda v, d, b: type(v) is hint


def _is_data(value: Any, depth: int, built: Built) -> bool:
    kind = type(value)
    if kind in (str, int, float, bool, bytes, PackedIds, PackedColumn) or value is None:
        return True
    if depth >= MAX_NESTING:
        return False
    if kind is list:
        return id(value) in built or _numbers(value, float) or all(_is_data(v, depth + 1, built) for v in value)
    return kind is dict and all(type(k) is str and _is_data(v, depth + 1, built) for k, v in value.items())


def _numbers(values: list[Any], item: Any) -> bool:
    """A list of ints (or, for floats, of numbers) checked at C speed: token lists hold 150k of them."""
    try:
        array({int: "q", TokenId: "I", float: "d"}[item], values)
    except (TypeError, OverflowError):
        return False
    return True


def _named(hint: Any) -> str:
    if get_origin(hint) is None and isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace(f"{__name__}.", "")


def _shown(value: Any) -> str:
    """A short, safe picture of a value: a hostile one can be nested too deep for repr()."""
    shown = reprlib.Repr()
    shown.maxlevel, shown.maxstring, shown.maxother = 3, 40, 40
    return f"{type(value).__name__} {shown.repr(value)}"
