"""Token id and logprob lists that the cyclic garbage collector never walks.

A list of numbers cannot be part of a reference cycle, yet CPython's collector visits every item of every
tracked list in the generation it collects. Each prompt in flight is walked by the next gen0 and gen1 pass,
and each prompt a session keeps by every full pass: with 64 agents at 100k-token contexts a pass costs about
45 ms on the CI VM (`benchmarks/bench_gc_pauses.py`), and the pause lands on whichever request becomes
ready during it. CPython itself untracks tuples and dicts that hold only atoms, but never lists; this does
it for them through the public C API (`PyObject_GC_UnTrack`). The list stays an ordinary, mutable list,
freed by reference counting as before; the collector just skips it.

Only for lists of ints, floats and None. A container put into an untracked list later could be part of a
cycle the collector no longer sees (a leak, never a crash); token ids and logprobs never hold one.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T", bound=list[Any])


def _load_untrack() -> Callable[[Any], None] | None:
    """The C API call, or None where this interpreter does not have it or it does not untrack lists."""
    try:
        function = ctypes.pythonapi.PyObject_GC_UnTrack  # PyDLL: called with the GIL held
    except (AttributeError, OSError):
        return None
    function.argtypes = [ctypes.py_object]
    function.restype = None
    probe = [1, 2]
    function(probe)
    return function if not gc.is_tracked(probe) else None


_UNTRACK = _load_untrack()


def untrack(values: T) -> T:
    """`values` itself, no longer walked by the garbage collector (where the interpreter allows it)."""
    if _UNTRACK is not None and type(values) is list and gc.is_tracked(values):
        _UNTRACK(values)
    return values


def available() -> bool:
    """Whether lists can be untracked here (CPython); elsewhere `untrack` leaves them as they are."""
    return _UNTRACK is not None
