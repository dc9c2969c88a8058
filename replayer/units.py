"""Work units: a run's cassettes cut into ranges of consecutive sessions that any worker runs on its own, the same
way wherever it runs: `-j N`'s process pool on this machine, or a Ray task (`--ray`) on another one.

A unit names its cassette by path (read where the worker is: a shared path for Ray), the file's size and
modification time when the run was planned (a worker refuses another file at that path), and its sessions with
their frames' byte offsets, from the cassette's index: a worker reads those frames and no other, and never loads
the index or the file whole. `run_unit(job, unit)` is what every dispatcher calls; its result is picklable, and the
results are merged in the units' order (`number`), so the output is the same bytes for any split and any dispatcher.

    units = split_cassette(cassette, path, entries, sessions_per_unit, number=0, cassette=0)
    for result in dispatch(units, job):   # pool_dispatch(processes), in unit order
        merge(result)                     # the job's own merge: replay prints, audit adds findings
"""

from __future__ import annotations

import math
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tito_rl.cassette.format.errors import CassetteError
from tito_rl.cassette.format.index import SessionIndex
from tito_rl.cassette.format.records import Header
from tito_rl.cassette.reader import Cassette, CassetteReader, StoredSessions


class UnitFileChanged(CassetteError):
    """The file at a unit's path is not the one the run was planned on (another size or modification time)."""


@dataclass(frozen=True)
class FileStamp:
    """A cassette's identity when a run is planned: its size and modification time."""

    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | os.PathLike[str]) -> FileStamp:
        stat = os.stat(path)
        return cls(stat.st_size, stat.st_mtime_ns)


@dataclass(frozen=True)
class WorkUnit:
    """Consecutive sessions of one cassette (in its index's order), with where their frames are."""

    number: int  # the unit's place in the run: results are merged in this order
    cassette: int  # the cassette's place among the run's (a job's per-cassette settings)
    path: str
    stamp: FileStamp
    sessions: tuple[SessionIndex, ...]

    @property
    def names(self) -> list[str]:
        return [s.session for s in self.sessions]

    def check(self) -> None:
        """`UnitFileChanged` when the file at `path` is not the one planned on."""
        if FileStamp.of(self.path) != self.stamp:
            raise UnitFileChanged(f"{self.path}: the cassette changed since the run was planned (size or time)")

    def reader(self) -> CassetteReader:
        """The cassette opened for this unit's frames (its header read and checked), after `check`."""
        self.check()
        return CassetteReader(self.path)

    def cassette_view(self, packed_prompts: bool = False) -> Cassette:
        """The cassette as a replay reads it, holding this unit's sessions only: each read from the file when it is
        looked up. Whether the file ends in a cut record is the planner's to say, not the unit's."""
        with self.reader() as reader:
            header: Header = reader.header
        index = {s.session: s for s in self.sessions}
        return Cassette(header, StoredSessions(self.path, index, packed_prompts), truncated=False)


class UnitJob(Protocol):
    """What a run does with each unit (`tito replay`'s, `tito audit`'s): picklable, sent to every worker."""

    def run(self, unit: WorkUnit) -> Any:
        """The unit's result: picklable, everything the parent merges."""
        ...  # pragma: no cover - a protocol

    def reads(self, unit: WorkUnit) -> list[str]:
        """The files and folders the unit reads where it runs (its cassette first): what a remote worker must have
        at the same paths."""
        ...  # pragma: no cover - a protocol


def run_unit(job: UnitJob, unit: WorkUnit) -> Any:
    """One unit's work: the one function every dispatcher calls (the process pool's workers, a Ray task), as
    `function(context, unit)` with the job as the context, sent once."""
    return job.run(unit)


Dispatch = Callable[[Sequence[WorkUnit], UnitJob], Iterator[Any]]
"""Runs `run_unit` on each unit somewhere and yields the results in the units' order."""


def sessions_per_unit(sessions: int, workers: int, most: int) -> int:
    """A unit's size: about four units a worker, so the last ones to finish are short, and at most `most`."""
    return max(1, min(most, math.ceil(sessions / max(1, workers * 4))))


def split_cassette(
    path: str, entries: Sequence[SessionIndex], size: int, number: int, cassette: int, stamp: FileStamp | None = None
) -> list[WorkUnit]:
    """`entries` (a cassette's sessions, in its order) cut into units of `size` sessions, numbered from `number`."""
    stamp = stamp or FileStamp.of(path)
    return [
        WorkUnit(number + i, cassette, path, stamp, tuple(entries[start : start + size]))
        for i, start in enumerate(range(0, len(entries), size))
    ]


def pool_dispatch(processes: int) -> Dispatch:
    """Units run by `processes` worker processes (forked where the platform can: what the caller loaded before,
    e.g. `tito replay`'s `batch.preload`, is theirs at no cost), their results in unit order; 1: in this process."""

    def dispatch(units: Sequence[WorkUnit], job: UnitJob) -> Iterator[Any]:
        if processes <= 1 or len(units) <= 1:
            for unit in units:
                yield run_unit(job, unit)
            return
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        with context.Pool(min(processes, len(units)), initializer=_start_worker, initargs=(job,)) as pool:
            yield from pool.imap(_run_in_worker, units)

    return dispatch


_JOB: UnitJob | None = None  # a pool worker's job, sent once when it starts


def _start_worker(job: UnitJob) -> None:
    global _JOB
    _JOB = job


def _run_in_worker(unit: WorkUnit) -> Any:
    assert _JOB is not None
    return run_unit(_JOB, unit)
