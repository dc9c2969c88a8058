"""JSON on the engine leg: orjson where it gives the stdlib's answer, the stdlib where it does not.

Every turn encodes an engine request (its `input_ids` grow with the session) and decodes the engine's
reply (one logprob triple per output token); orjson does both several times faster than `json`.
It refuses NaN and Infinity literals and lone surrogate escapes, so those take the stdlib path and read as
before. It reads integers past 64 bits as floats, which the stdlib does not, so it is not used for bodies
that agents send (finding such integers first costs more than it saves); SGLang's own replies are
written by orjson and never hold them. Replies to agents keep the stdlib encoder: their bytes are recorded
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


def dumps(value: Any) -> bytes:
    """Compact JSON bytes for an engine request; the stdlib's output where orjson refuses the value."""
    try:
        return orjson.dumps(value)
    except TypeError:  # integers past 64 bits, non-string keys
        return json.dumps(value, separators=(",", ":")).encode()
