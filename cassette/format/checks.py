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
from tito_rl.cassette.format.routes import IntArray

MAX_NESTING = 64  # lists and maps inside a record (JSON bodies: about a dozen; Python recurses ~1000 deep)


# Checked once its deltas are resolved, so the code that reads records never meets another type than the
# dataclasses declare; `Any` is msgpack data (str-keyed maps, lists, str, bytes, numbers, bool, nil) nested at
# most MAX_NESTING deep. The values below are the format's own invariants (FORMAT.md).

NON_NEGATIVE = ("seq", "retry_of", "turn_index", "response_length")
TIMINGS = ("started_s", "duration_s")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
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


Built = dict[int, Any]
Check = Callable[[Any, int, Built], bool]


def check_fields(record: object, kind: str, built: Built | None = None) -> None:
    """A CorruptCassetteError naming the first field of `record` (a dataclass) that has another type than
    declared, or breaks a value rule of the format. `built`: the lists the decoder made, by id, with the type
    of their items."""
    built = built or {}
    for name, hint, fits, rule in _plan(type(record)):
        value = getattr(record, name)
        if not fits(value, 0, built):
            raise CorruptCassetteError(
                f"corrupt cassette: {kind} record field {name!r}: expected {_named(hint)}, got {_shown(value)}"
            )
        if rule is not None:
            rule(value, kind, name)
    samples = getattr(record, "samples", None)
    if samples:
        for i, sample in enumerate(samples):
            _check_part(sample, SAMPLE_CHECKS, kind, f"sample {i}", built)
    request, response = getattr(record, "request", None), getattr(record, "response", None)
    if isinstance(request, dict):
        _check_part(request, REQUEST_CHECKS, kind, "request", built)
    if isinstance(response, dict):
        _check_part(response, RESPONSE_CHECKS, kind, "response", built)


def _check_part(
    part: dict[str, Any], checks: tuple[tuple[str, Any, Check], ...], kind: str, where: str, built: Built
) -> None:
    for key, hint, fits in checks:
        if key in part and not fits(part[key], 1, built):
            raise CorruptCassetteError(
                f"corrupt cassette: {kind} record {where} {key!r}: expected {_named(hint)}, got {_shown(part[key])}"
            )


def _non_negative(value: Any, kind: str, name: str) -> None:
    if value is not None and value < 0:
        raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r} is negative ({value})")


def _a_time(value: Any, kind: str, name: str) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r} is not a time ({value})")


def _a_status(value: Any, kind: str, name: str) -> None:
    if not 0 <= value <= 999:
        raise CorruptCassetteError(f"corrupt cassette: {kind} record status {value} is not an HTTP status")


def _a_session(value: Any, kind: str, name: str) -> None:
    if _CONTROL.search(value):
        raise CorruptCassetteError(f"corrupt cassette: a session name holds control characters: {value!r}"[:160])


def _headers(value: Any, kind: str, name: str) -> None:
    _check_headers(value, f"{kind} record field {name!r}")


def _a_method(value: Any, kind: str, name: str) -> None:
    if not _HEADER_NAME.fullmatch(value):  # replay sends it: an HTTP method is a token
        raise CorruptCassetteError(
            f"corrupt cassette: {kind} record field 'method': not an HTTP method: {value!r}"[:200]
        )


SSE_SEPARATORS = ("\n\n", "\r\n\r\n")  # what ends an SSE event (the spec allows either line break)
_WIRE_TYPES: dict[str, tuple[type, ...]] = {"content_type": (str,), "style": (str,), "raw": (bytes,), "done": (bool,)}


def _a_wire(value: Any, kind: str, name: str) -> None:
    """An engine answer's bytes (`tito_rl.cassette.answer_bytes`): a replay serves them, its content type as a
    header, so each key holds what it says."""
    if value is None:
        return
    wrong = [k for k, types_ in _WIRE_TYPES.items() if k in value and type(value[k]) not in types_]
    if "sse" in value and value["sse"] not in SSE_SEPARATORS:
        wrong.append("sse")
    if not wrong and isinstance(value.get("content_type"), str) and _LINE_BREAK.search(value["content_type"]):
        wrong.append("content_type")
    if wrong:
        raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r}: bad {wrong[0]!r}")


def _an_order(value: Any, kind: str, name: str) -> None:
    """A call's or an event's place on the recording's engine counter: `[started, answered]`, started first."""
    if value is None or (not value and kind == "event"):
        return
    if len(value) != 2 or value[0] < 0 or value[1] < value[0]:
        raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r}: not [started, answered]")


Rule = Callable[[Any, str, str], None]
# The value rules, by field name, checked once the field's type is (FORMAT.md).
RULES: dict[str, Rule] = {
    **{name: _non_negative for name in NON_NEGATIVE},
    **{name: _a_time for name in TIMINGS},
    "status": _a_status,
    "session": _a_session,
    "headers": _headers,
    "reply_headers": _headers,
    "method": _a_method,
    "wire": _a_wire,
    "order": _an_order,
}


def _check_headers(headers: dict[str, Any], where: str) -> None:
    """HTTP header names are tokens and values hold no line break: what was on the wire (replay re-sends them).
    All at once first (one match over the names joined, one search over the values): every record has headers."""
    values = list(headers.values())
    if (
        set(map(type, values)) <= _STR
        and all(headers)
        and _HEADER_NAME.fullmatch("".join(headers))
        and not _LINE_BREAK.search("".join(values))
    ):
        return
    for key, value in headers.items():
        values = value if isinstance(value, list) else [value]
        if not _HEADER_NAME.fullmatch(key) or any(_LINE_BREAK.search(v) for v in values):
            raise CorruptCassetteError(f"corrupt cassette: {where}: {key!r} is not an HTTP header"[:200])


_PLANS: dict[type, tuple[tuple[str, Any, Check, Rule | None], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, Any, Check, Rule | None], ...]:
    """A record class's fields with their types, checks and value rules, resolved once (the decoder checks every
    record it reads: resolving a hint's check per field and record was a tenth of the checks' time)."""
    plan = _PLANS.get(cls)
    if plan is None:
        fields = get_type_hints(cls).items()
        plan = _PLANS[cls] = tuple((name, hint, _checker(hint), RULES.get(name)) for name, hint in fields)
    return plan


@functools.cache
def _checker(hint: Any) -> Check:
    """A function telling whether a value is of type `hint`, built once per annotation (reading is hot)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return _is_data
    scalar = _exact_types(hint)
    if scalar is not None:  # a scalar type or a union of them: one set lookup
        return lambda v, d, b: type(v) in scalar
    if origin in (Union, types.UnionType):
        options = tuple(_checker(option) for option in args)
        return lambda v, d, b: any(fits(v, d, b) for fits in options)
    if hint is TokenId:
        return lambda v, d, b: type(v) is int and 0 <= v <= U32_MAX
    if origin is dict:
        return _dict_checker(args[0], args[1])
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
        exact = _exact_types(args[0])
        if number is None and exact is not None:  # list[str]: the set of its items' types
            return lambda v, d, b: type(v) is list and d < MAX_NESTING and set(map(type, v)) <= exact
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


def _exact_types(hint: Any) -> frozenset[type] | None:
    """The types a value of `hint` may have when its type alone decides (str, bytes, int, bool, None, float and
    unions of them); None for any other hint."""
    if hint is type(None):
        return frozenset({type(None)})
    if hint is float:
        return frozenset({float, int})
    if get_origin(hint) in (Union, types.UnionType):
        found: set[type] = set()
        for option in get_args(hint):
            types_of = _exact_types(option)
            if types_of is None:
                return None
            found |= types_of
        return frozenset(found)
    if hint in (str, bytes, int, bool):
        return frozenset({hint})
    return None


def _dict_checker(key_hint: Any, item_hint: Any) -> Check:
    """A map's check: keys and values of exact types checked by the set of their types, gathered at C speed."""
    keys, items = _exact_types(key_hint), _exact_types(item_hint)
    key, item = _checker(key_hint), _checker(item_hint)
    if keys is None:
        return lambda v, d, b: (
            type(v) is dict and d < MAX_NESTING and all(key(k, d, b) and item(x, d + 1, b) for k, x in v.items())
        )
    if item_hint is Any and keys == _STR:  # msgpack data (`_is_data` walks it the same way)
        return lambda v, d, b: type(v) is dict and _is_data(v, d, b)
    if items is not None:
        return lambda v, d, b: (
            type(v) is dict and d < MAX_NESTING and set(map(type, v)) <= keys and set(map(type, v.values())) <= items
        )
    return lambda v, d, b: (
        type(v) is dict and d < MAX_NESTING and set(map(type, v)) <= keys and all(item(x, d + 1, b) for x in v.values())
    )


_SCALARS = frozenset({str, int, float, bool, bytes, PackedIds, PackedColumn, IntArray, type(None)})
_STR = frozenset({str})


def _is_data(value: Any, depth: int, built: Built) -> bool:
    """msgpack data nested at most MAX_NESTING deep, maps keyed by str. The item types of a list or map are
    gathered at C speed (`set(map(type, ...))`) and only the containers among them walked: a record's maps and
    lists are mostly scalars, and a walk in Python per value was a tenth of an audit's time."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if depth >= MAX_NESTING:
        return False
    if kind is list:
        if id(value) in built:
            return True
        items = value
    elif kind is dict:
        if not set(map(type, value)) <= _STR:
            return False
        items = value.values()
    else:
        return False
    if set(map(type, items)) <= _SCALARS:
        return True
    return all(_is_data(v, depth + 1, built) for v in items if type(v) not in _SCALARS)


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


def _part_checks(keys: dict[str, Any]) -> tuple[tuple[str, Any, Check], ...]:
    return tuple((key, hint, _checker(hint)) for key, hint in keys.items())


REQUEST_CHECKS, RESPONSE_CHECKS, SAMPLE_CHECKS = map(_part_checks, (REQUEST_KEYS, RESPONSE_KEYS, SAMPLE_KEYS))
