"""Reply fields a target fills with values no replay can pin (random ids, wall-clock times), masked in compares.

A driver names them as paths into a JSON reply or an SSE event's JSON data: `id`, `message.id`,
`content[*].id`, `choices[*].delta.tool_calls[*].id` (`[*]` is every element of a list, `[2]` one of them).
A masked field must still be there on both sides; everything else in the reply is compared.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

MASK = "<volatile>"
_STEP = re.compile(r"\[(\*|\d+)\]|\.?([^.\[\]]+)")


@lru_cache(maxsize=256)
def parse_path(path: str) -> tuple[str | int | None, ...]:
    """`content[*].id` -> ("content", None, "id"); None is every element of a list."""
    steps: list[str | int | None] = []
    at = 0
    while at < len(path):
        found = _STEP.match(path, at)
        if found is None or found.end() == at:
            raise ValueError(f"not a reply field path: {path!r} (e.g. id, content[*].id, message.id)")
        index, key = found.groups()
        steps.append(key if key is not None else (None if index == "*" else int(index)))
        at = found.end()
    return tuple(steps)


def check_paths(paths: Sequence[str]) -> None:
    for path in paths:
        parse_path(path)


def mask(value: Any, paths: Sequence[str]) -> Any:
    """A copy of `value` with every field at `paths` replaced by MASK (where present)."""
    for path in paths:
        value = _mask(value, parse_path(path))
    return value


def _mask(value: Any, steps: tuple[str | int | None, ...]) -> Any:
    if not steps:
        return MASK
    step, rest = steps[0], steps[1:]
    if isinstance(step, str) and isinstance(value, dict) and step in value:
        return {**value, step: _mask(value[step], rest)}
    if isinstance(value, list) and not isinstance(step, str):
        if step is None:
            return [_mask(v, rest) for v in value]
        if 0 <= step < len(value):
            return [*value[:step], _mask(value[step], rest), *value[step + 1 :]]
    return value
