"""Two answers compared by structure, not values: key paths, types, where ids and logprobs sit, stream order.

A JSON value flattens to `{path: types}`: `choices[].logprobs.content[].logprob: {float}`; list elements share
one path, an empty list is its own type (`list:empty`), so what sits under it on the other side is not counted.
Compared, a path the real engine sends as null may be absent from the fake's answer or hold anything there (the
issue's rule: fields the real engine sends as null are value, not structure); a path the real engine fills and the
fake one sends as null is a difference. A few values are
structure: `object` (what kind of body or chunk it is) and the status code.

A stream compares as its parts: the first chunk, the token chunks (their shapes merged), the chunk that carries
the finish, what follows it (usage, `[DONE]`), and, where the chunks carry token ids, the number of chunks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tito_rl.recorder.engine_contract.exchange import DONE, Answer

STRUCTURAL_VALUES = ("object",)
NULL = "null"
EMPTY = "list:empty"


def type_name(value: Any) -> str:
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list" if value else EMPTY
    return "object"


def flatten(value: Any, path: str = "", out: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """`{path: type names}` for every node under `value` (the root is the empty path)."""
    out = {} if out is None else out
    out.setdefault(path, set()).add(type_name(value))
    if isinstance(value, dict):
        for key, item in value.items():
            key = "*" if _is_map(path) else key
            flatten(item, f"{path}.{key}" if path else str(key), out)
            if key in STRUCTURAL_VALUES and isinstance(item, str):
                out.setdefault(f"{path}.{key}={item}" if path else f"{key}={item}", set()).add("value")
    elif isinstance(value, list):
        for item in value:
            flatten(item, f"{path}[]", out)
    return out


def _is_map(path: str) -> bool:
    """A dict keyed by values, not names: the legacy completions logprobs' `top_logprobs` entries (token text ->
    logprob), compared as `{*: float}`."""
    return path.endswith("logprobs.top_logprobs[]")


def merged(values: Iterable[Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for value in values:
        flatten(value, "", out)
    return out


def _under_empty(path: str, other: dict[str, set[str]]) -> bool:
    """True when an ancestor list of `path` is empty (and only empty) on the other side, or absent there
    because it was null: what would sit under it is a value difference, not a structural one."""
    probe = path
    while probe:
        cut = max(probe.rfind("."), probe.rfind("[]"))
        if cut <= 0:
            return False
        probe = probe[:cut]
        types = other.get(probe)
        if types is not None and (types <= {EMPTY, NULL}):
            return True
        if types is not None:
            return False
    return False


def compare_shapes(real: dict[str, set[str]], fake: dict[str, set[str]], where: str) -> list[str]:
    """The structural differences, one line each, prefixed by `where`."""
    found: list[str] = []
    reported: list[str] = []  # a missing path's children are not reported again
    for path in sorted(real.keys() | fake.keys()):
        shown = path or "(root)"
        mine, theirs = fake.get(path), real.get(path)
        if any(path.startswith(parent + ".") or path.startswith(parent + "[]") for parent in reported):
            continue
        if theirs is None:
            if mine and not mine <= {NULL} and not _under_empty(path, real):
                found.append(f"{where}: {shown}: the fake engine sends it ({_types(mine)}), the real one does not")
                reported.append(path)
            continue
        if mine is None:
            if not theirs <= {NULL} and not _under_empty(path, fake):
                found.append(f"{where}: {shown}: the real engine sends it ({_types(theirs)}), the fake one does not")
                reported.append(path)
            continue
        real_types, fake_types = theirs - {NULL}, mine - {NULL}
        if EMPTY in real_types or EMPTY in fake_types:
            real_types, fake_types = _lists(real_types), _lists(fake_types)
        if real_types and fake_types and real_types != fake_types:
            found.append(f"{where}: {shown}: real {_types(theirs)}, fake {_types(mine)}")
        elif real_types and not fake_types:  # the real engine fills it where the fake one leaves it null
            found.append(f"{where}: {shown}: real {_types(theirs)}, fake null")
    return found


def _lists(types: set[str]) -> set[str]:
    return {"list" if t == EMPTY else t for t in types}


def _types(types: set[str]) -> str:
    return "|".join(sorted(types))


def stream_parts(chunks: list[Any]) -> dict[str, list[Any]]:
    """A stream cut into its parts (module docstring)."""
    events = [c for c in chunks if c != DONE]
    finish_at = next((i for i in range(len(events) - 1, -1, -1) if _has_finish(events[i])), None)
    head = events[:1]
    if finish_at is None:
        middle, finish, tail = events[1:], [], []
    else:
        middle, finish, tail = events[1:finish_at], events[finish_at : finish_at + 1], events[finish_at + 1 :]
        if finish_at == 0:
            head = []
    return {"first chunk": head, "token chunks": middle, "finish chunk": finish, "after the finish": tail}


def _has_finish(chunk: Any) -> bool:
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list):
        return False
    return any(isinstance(c, dict) and c.get("finish_reason") is not None for c in choices)


def compare_answers(real: Answer, fake: Answer, name: str) -> list[str]:
    """Every structural difference between the real engine's answer and the fake's, one line each."""
    if real.status != fake.status:
        return [f"{name}: status: real {real.status}, fake {fake.status}"]
    if real.streamed != fake.streamed:
        return [
            f"{name}: the real engine {'streams' if real.streamed else 'answers with one body'}, "
            f"the fake one {'streams' if fake.streamed else 'answers with one body'}"
        ]
    if not real.streamed:
        if (real.body is None) != (fake.body is None):
            return [
                f"{name}: body: real {'JSON' if real.body is not None else 'not JSON'}, "
                f"fake {'JSON' if fake.body is not None else 'not JSON'}"
            ]
        if real.body is None:
            return []
        return compare_shapes(flatten(real.body), flatten(fake.body), name)
    found: list[str] = []
    real_parts, fake_parts = stream_parts(real.chunks), stream_parts(fake.chunks)
    for part, real_events in real_parts.items():
        fake_events = fake_parts[part]
        if bool(real_events) != bool(fake_events) or len(real_events) != len(fake_events) and part != "token chunks":
            found.append(f"{name}: {part}: real {len(real_events)} chunk(s), fake {len(fake_events)}")
            continue
        found += compare_shapes(merged(real_events), merged(fake_events), f"{name}: {part}")
    if (DONE in real.chunks) != (DONE in fake.chunks):
        found.append(
            f"{name}: [DONE]: real {'sends' if DONE in real.chunks else 'omits'} it, fake "
            f"{'sends' if DONE in fake.chunks else 'omits'} it"
        )
    if not found and len(real.chunks) != len(fake.chunks) and _carries_ids(real.chunks):
        found.append(f"{name}: stream length: real {len(real.chunks)} events, fake {len(fake.chunks)}")
    return found


def _carries_ids(chunks: list[Any]) -> bool:
    """Whether a stream says which tokens each chunk holds: only then is the fake engine, given the same tokens,
    held to the same number of chunks (a stream of text alone is re-tokenized, and may split otherwise)."""
    for chunk in chunks:
        if not isinstance(chunk, dict):
            continue
        if isinstance(chunk.get("output_ids"), list):
            # SGLang's /generate: cumulative chunks, as many as the scheduler's steps happened to produce (two
            # starts of the same server gave 5 and 6 events for the same answer): not a structure.
            return False
        if any(isinstance(c, dict) and isinstance(c.get("token_ids"), list) for c in chunk.get("choices") or []):
            return True
    return False
