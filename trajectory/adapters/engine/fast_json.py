"""JSON on the engine leg: orjson where it gives the stdlib's answer, the stdlib where it does not.

Every turn encodes an engine request (its `input_ids` grow with the session) and decodes the engine's
reply (one logprob triple per output token); orjson does both several times faster than `json`.
It refuses NaN and Infinity literals and lone surrogate escapes, so those take the stdlib path and read as
before. It reads integers past 64 bits as floats, which the stdlib does not: a body an agent sends is read by
orjson, then read again by the stdlib when it holds a float that large (`loads_body`: a walk over the parsed
values, where searching the bytes for long digit runs cost more than the parse it saved); SGLang's own replies
are written by orjson and never hold them. Replies to agents keep the stdlib encoder: their bytes are recorded
and compared on replay, and orjson writes some floats differently (`1e-5` for `1e-05`).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    """`json.loads` for engine replies, faster; raises ValueError for what `json.loads` rejects."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)


_INT64 = 2.0**63


def loads_body(data: bytes) -> Any:
    """`json.loads` for a body an agent sent (it holds the whole conversation: a long session's is megabytes),
    faster; raises ValueError for what `json.loads` rejects."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)
    return json.loads(data) if _has_huge_float(value) else value


def _has_huge_float(value: Any) -> bool:
    """Whether a float at or past 2**63 is in `value`: what orjson makes of an integer that long."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float and not -_INT64 < item < _INT64:
            return True
    return False


def dumps(value: Any) -> bytes:
    """Compact JSON bytes for an engine request or a finish's samples (their channels numpy arrays, written as
    the lists they hold); the stdlib's output where orjson refuses the value."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:  # integers past 64 bits, non-string keys
        return json.dumps(value, separators=(",", ":"), default=_listed).encode()


def _listed(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
