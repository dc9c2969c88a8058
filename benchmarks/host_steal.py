"""Host steal for the benchmarks' figures: on a shared VM a core the hypervisor takes away delays whatever
runs on it, so a benchmark prints the steal beside its figure to tell a noisy run from a slow one."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def steal_ticks() -> dict[str, int]:
    """Clock ticks each (virtual) CPU waited for its hypervisor (Linux); empty where unknown."""
    try:
        return {
            f[0]: int(f[8])
            for f in (line.split() for line in Path("/proc/stat").read_text().splitlines())
            if f[0].startswith("cpu") and f[0] != "cpu" and len(f) > 8
        }
    except (OSError, ValueError):
        return {}


@contextmanager
def steal_watch(out: list[float]) -> Iterator[None]:
    """Appends the most any one CPU was stolen during the block, as a percentage of its wall time."""
    before, start = steal_ticks(), time.monotonic()
    yield
    after, wall = steal_ticks(), time.monotonic() - start
    ticks = max((after[c] - before.get(c, after[c]) for c in after), default=0)
    out.append(100 * ticks / os.sysconf("SC_CLK_TCK") / wall)


_BURN = "x = 0\nfor i in range(8_000_000):\n    x += i\n"


def parallel_capacity(python: str, processes: int = 2) -> float:
    """How much `processes` CPU-bound processes get done at once, as a multiple of one alone (2.0 for two: two
    whole cores).

    A VM's two vCPUs may share one physical core, or the host may give the second one out; no steal counter
    says so, and what overlaps across processes (the parser helper of `tito replay`, `-j 2`) depends on it."""
    import subprocess

    def burn(n: int) -> float:
        start = time.monotonic()
        procs = [subprocess.Popen([python, "-c", _BURN]) for _ in range(n)]
        for proc in procs:
            proc.wait()
        return time.monotonic() - start

    one, many = min(burn(1) for _ in range(2)), min(burn(processes) for _ in range(2))
    return processes * one / many
