"""Giving freed memory back to the system in a server that runs for days (`tito record` beside a training run).

What Python frees above its small-object allocator goes back to glibc's malloc, which keeps it in its arenas for
reuse instead of returning it: a session's prompts, bodies and token lists are hundreds of kilobytes each, and
after rounds of traffic with every session ended the recording proxy's resident memory went 591, 704, 744 MiB
with no session object left; `malloc_trim(0)` took 532 MiB to 240 MiB (benchmarks/README.md, `bench_soak.py`).
So a server trims every `TRIM_EVERY_S` seconds, on a worker thread: ctypes lets go of the GIL for the call, and
the event loop goes on serving meanwhile. Elsewhere than glibc (musl, macOS) there is nothing to call: a no-op.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

TRIM_ENV = "TITO_MALLOC_TRIM_S"  # seconds between trims; 0 turns trimming off (comparisons)
TRIM_EVERY_S = 30.0


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim  # glibc's; musl has none
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def trim() -> bool:
    """Return the free memory malloc holds to the system now; False where there is no glibc."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


def trim_every_s() -> float:
    """The trim period a server uses: `TITO_MALLOC_TRIM_S` when set (0: never), else `TRIM_EVERY_S`."""
    raw = os.environ.get(TRIM_ENV, "").strip()
    if not raw:
        return TRIM_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"tito: {TRIM_ENV}={raw!r} is not a number of seconds") from None
    return max(value, 0.0)


@dataclass
class Trimmer:
    """Trims every `every_s` seconds from a running event loop, one trim at a time, on the loop's default
    executor. `trims` and `seconds` say how many ran and how long they took (benchmarks read them)."""

    every_s: float = field(default_factory=trim_every_s)
    trims: int = 0
    seconds: float = 0.0
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.every_s > 0 and _TRIM is not None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.every_s)
            started = time.perf_counter()
            await loop.run_in_executor(None, trim)
            self.trims += 1
            self.seconds += time.perf_counter() - started
