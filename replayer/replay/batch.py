"""`tito replay`'s work over many cassettes: in this process, or spread over worker processes (`-j N`) or the tasks
of a Ray cluster (`--ray`, `replayer/workers.py`).

Outcomes come back in cassette order and, within a cassette, in session order, whichever finishes first: the
output is the same bytes for any N. With `-j N` the sessions are cut into work units (`tito_rl.replayer.units`):
ranges of consecutive sessions of one cassette, each naming its sessions' frames, so a worker reads those and
nothing else of the file (a unit is one adapter app, one event loop), and sends back, per session, only what is
printed, the golden section and the exported rows. The workers are forked once the tokenizer and the parsers are
loaded, so each starts at once; the same units run anywhere `run_unit` does (a Ray task). `--shard I/N` keeps the
sessions whose name (cassette file name and session) hashes to shard I: a stable split, the same on every
machine, for a CI matrix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tito_rl.cassette.format.errors import CassetteError
from tito_rl.cassette.reader import Cassette, StoredSessions, exchange_count
from tito_rl.recorder.targets import gateway_pool
from tito_rl.recorder.targets.registry import TITO, same_target
from tito_rl.replayer import workers
from tito_rl.replayer.goldens.files import GoldenBook, golden_path
from tito_rl.replayer.replay.cassette_replay import replay_each, run_sync
from tito_rl.replayer.replay.loading import (
    adapter_settings,
    load_cassette,
    recorded_engine_model,
    recorded_target,
    replay_routes_layout,
    replay_target,
    select_sessions,
    unreadable,
)
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.replayer.replay.results import SessionResult
from tito_rl.replayer.reporting import exports
from tito_rl.replayer.reporting.terminal import session_details
from tito_rl.replayer.units import Dispatch, FileStamp, WorkUnit, sessions_per_unit, split_cassette
from tito_rl.trajectory.dialects.view import SGLANG

UNIT_MOST = 16  # sessions per work unit at most: an adapter app per unit, a few units per worker


@dataclass
class Job:
    """What every session's replay needs besides its name; given to each worker once."""

    options: ReplayOptions
    update_goldens: bool = False
    export_replayed: bool = False
    export_live: bool = False
    verbosity: int = 0  # -1 quiet, 1 verbose (`session_details`)
    style: Any = None  # the golden diffs' `DiffStyle`


@dataclass
class CassetteWork:
    path: str
    tokenizer: str | None
    sessions: list[str]  # to replay, in cassette order
    all_sessions: list[str]
    truncated: bool
    target: str = "tito"  # replayed through (`--target`, else the recorded one)
    recorded_target: str = "tito"

    @property
    def goldens_apply(self) -> bool:
        """Goldens pin a cassette replayed through the target it was recorded around (`CassetteResult`)."""
        return same_target(self.target, self.recorded_target)


@dataclass
class SessionOutcome:
    """A session's replay as the parent reports it."""

    cassette: str
    session: str
    line: str
    details: list[str]
    ok: bool
    skipped: str | None
    exchanges: int
    section: str | None = None  # its golden section, when updating goldens
    replayed_rows: list[str] = field(default_factory=list)
    live_rows: list[str] = field(default_factory=list)


def shard_of(cassette: str, session: str, shards: int) -> int:
    """0-based shard of a session: a digest of the cassette's file name and the session's name (never the
    folder, which differs between machines, and never anything random)."""
    digest = hashlib.sha256(f"{Path(cassette).name}\0{session}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def parse_shard(value: str) -> tuple[int, int]:
    """`I/N` with 1 <= I <= N; ValueError with the reason otherwise."""
    index, sep, total = value.partition("/")
    if not sep or not index.isdigit() or not total.isdigit() or not 1 <= int(index) <= int(total):
        raise ValueError(f"--shard must be I/N with 1 <= I <= N, got {value!r}")
    return int(index), int(total)


def plan_work(
    cassettes: list[str], sessions: list[str] | None, options: ReplayOptions, shard: tuple[int, int] | None = None
) -> list[CassetteWork]:
    """Every cassette read (each frame checked) and its tokenizer checked, before anything is replayed;
    `ReplayInputError` for the first that cannot be. Starts a run: nothing read by an earlier one is reused."""
    _CASSETTES.clear()
    _BOOKS.clear()
    works = []
    for path in cassettes:
        cassette, tokenizer = _cassette(path, options.tokenizer)
        names = select_sessions(cassette, path, sessions, missing_ok=len(cassettes) > 1)
        if shard is not None:
            names = [n for n in names if shard_of(path, n, shard[1]) == shard[0] - 1]
        works.append(
            CassetteWork(
                path,
                tokenizer,
                names,
                list(cassette.sessions),
                cassette.truncated,
                replay_target(cassette.header, options.target, path, options.trust_cassette).text,
                recorded_target(cassette.header),
            )
        )
    return works


def total_exchanges(works: list[CassetteWork]) -> int:
    return sum(exchange_count(_cassette(w.path, w.tokenizer)[0], n) for w in works for n in w.sessions)


def replay_all(
    works: list[CassetteWork],
    job: Job,
    backend: workers.Backend,
    emit: Callable[[SessionOutcome], None],
    dispatch: Dispatch | None = None,
    unit_most: int = UNIT_MOST,
) -> None:
    """Every session replayed and handed to `emit` in order: in this process, or as work units run by `backend`'s
    workers (forked processes, `-j N` > 1; Ray tasks, `--ray`); `dispatch`: run by it instead; `unit_most`:
    sessions per unit at most. `WorkersError` where the workers cannot run."""
    sessions = sum(len(w.sessions) for w in works)
    if dispatch is None and not backend.remote and (backend.jobs <= 1 or sessions <= 1):

        async def every_cassette() -> None:
            async with gateway_pool.pooled():  # a gateway is started once for the run, not once per cassette
                for work in works:
                    if work.sessions:
                        await replay_work(work, work.sessions, job, emit)

        run_sync(every_cassette())
        return
    replaying = ReplayUnits(replace(job, options=replace(job.options, on_total=None, on_exchange=None, on_plan=None)))
    replaying.cassettes = [cassette_settings(w, job.options) for w in works]
    if dispatch is not None:
        _replay_units(plan_units(works, backend.jobs, unit_most), replaying, dispatch, emit)
        return
    with workers.running(backend) as (dispatching, slots):
        _replay_units(plan_units(works, slots, unit_most), replaying, dispatching, emit)


def _replay_units(
    units: list[WorkUnit], replaying: ReplayUnits, dispatch: Dispatch, emit: Callable[[SessionOutcome], None]
) -> None:
    for outcomes in dispatch(units, replaying):
        for outcome in outcomes:
            emit(outcome)


def plan_units(works: list[CassetteWork], workers: int, most: int = UNIT_MOST) -> list[WorkUnit]:
    """Each cassette's sessions to replay (`CassetteWork.sessions`, in order) cut into units, numbered in cassette
    and session order; a unit's sessions carry their frames' offsets from the cassette's index."""
    size = sessions_per_unit(sum(len(w.sessions) for w in works), workers, most)
    units: list[WorkUnit] = []
    for number, work in enumerate(works):
        sessions = _cassette(work.path, work.tokenizer)[0].sessions
        assert isinstance(sessions, StoredSessions)  # `open_cassette` reads every cassette through its index
        entries = [sessions.index[name] for name in work.sessions]
        units += split_cassette(work.path, entries, size, len(units), number)
    return units


@dataclass
class CassetteSettings:
    """What a unit's worker needs of its cassette besides the unit: where its tokenizer is, the target, and the
    served model the recording's calls named where the header does not say it (found by the planner, which reads
    the whole cassette; a unit holds only its own sessions)."""

    path: str
    tokenizer: str | None
    goldens_apply: bool
    engine_model: str | None = None
    routes_layout: tuple[int, int] | None = None  # how SGLang's route rows split (`loading.replay_routes_layout`)
    same_adapter: bool = False  # replayed through tito's adapter: `routes_layout` is given to it


def cassette_settings(work: CassetteWork, options: ReplayOptions) -> CassetteSettings:
    cassette, tokenizer = _cassette(work.path, work.tokenizer)
    model, layout, tito = None, None, False
    if replay_target(cassette.header, options.target, work.path, options.trust_cassette).kind == TITO:
        settings = adapter_settings(cassette.header, tokenizer, options.adapter)
        if settings.engine_dialect != SGLANG and not settings.engine_model:
            model = recorded_engine_model(cassette)
        layout, tito = replay_routes_layout(cassette, settings), True
    return CassetteSettings(work.path, tokenizer, work.goldens_apply, model, layout, tito)


@dataclass
class ReplayUnits:
    """`tito replay`'s work on a unit (`UnitJob`): its sessions replayed through one adapter app (or target
    harness), each outcome as the parent prints it. Sent to every worker once, with each cassette's settings."""

    job: Job
    cassettes: list[CassetteSettings] = field(default_factory=list)

    def reads(self, unit: WorkUnit) -> list[str]:
        settings = self.cassettes[unit.cassette]
        golden = golden_path(unit.path)
        return [unit.path, *([str(golden)] if golden.is_file() else []), *filter(None, [settings.tokenizer])]

    def run(self, unit: WorkUnit) -> list[SessionOutcome]:
        settings = self.cassettes[unit.cassette]
        try:
            cassette = unit.cassette_view(packed_prompts=True)
        except (CassetteError, OSError) as exc:
            raise unreadable(unit.path, exc) from None
        options = self.job.options
        if settings.engine_model is not None:
            options = replace(options, adapter={**options.adapter, "engine_model": settings.engine_model})
        if settings.same_adapter:  # found over the whole cassette: a unit holds only its own sessions
            options = replace(options, adapter={**options.adapter, "engine_routes_layout": settings.routes_layout})
        done: list[SessionOutcome] = []
        run_sync(_replay_unit(cassette, settings, unit.names, replace(self.job, options=options), done.append))
        return done


async def _replay_unit(
    cassette: Cassette, settings: CassetteSettings, names: list[str], job: Job, emit: Callable[[SessionOutcome], None]
) -> None:
    from tito_rl.trajectory.golden import TokenizerNames
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    book = _book_at(settings.path, job.update_goldens) if settings.goldens_apply else None
    token_names = TokenizerNames(load_tokenizer(settings.tokenizer))
    async for result in replay_each(cassette, settings.path, settings.tokenizer, names, job.options):
        emit(outcome_of(result, book, token_names, job))


# ---- in every process ----

_CASSETTES: dict[tuple[str, str | None], tuple[Cassette, str | None]] = {}
_BOOKS: dict[tuple[str, bool, FileStamp | None], GoldenBook] = {}


def _cassette(path: str, tokenizer: str | None) -> tuple[Cassette, str | None]:
    """Read and checked once per process (workers inherit the parent's)."""
    key = (path, tokenizer)
    if key not in _CASSETTES:
        _CASSETTES[key] = load_cassette(path, tokenizer)
    return _CASSETTES[key]


def _book(work: CassetteWork, update: bool) -> GoldenBook:
    return _book_at(work.path, update)


def _book_at(path: str, update: bool) -> GoldenBook:
    """A cassette's goldens, read once per process and run; a worker that serves many runs (a Ray worker) reads
    them again when the golden file changed."""
    golden = golden_path(path)
    stamp = FileStamp.of(golden) if golden.is_file() else None
    key = (path, update, stamp)
    if key not in _BOOKS:
        _BOOKS[key] = GoldenBook(path, update)
    return _BOOKS[key]


def preload(works: list[CassetteWork]) -> None:
    """The tokenizers and the parsers, loaded now: before the workers are forked, so that none loads them again,
    and while the caller keeps automatic garbage collection off. A short run keeps parsing through the parser
    helper, if one was started."""
    from tito_rl.trajectory.adapters.parsing import parser_process
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    for folder in dict.fromkeys(w.tokenizer for w in works):
        load_tokenizer(folder)
    parser_process.settle(total_exchanges(works) if parser_process.active() is not None else 0)


async def replay_work(work: CassetteWork, names: list[str], job: Job, emit: Callable[[SessionOutcome], None]) -> None:
    """Replay `names` of one cassette, handing each session's outcome to `emit` as soon as it is in order."""
    from tito_rl.trajectory.golden import TokenizerNames
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    cassette, tokenizer = _cassette(work.path, work.tokenizer)
    book = _book(work, job.update_goldens)
    token_names = TokenizerNames(load_tokenizer(tokenizer))
    async for result in replay_each(cassette, work.path, tokenizer, names, job.options):
        emit(outcome_of(result, book if work.goldens_apply else None, token_names, job))


def outcome_of(result: SessionResult, book: GoldenBook | None, names: Any, job: Job) -> SessionOutcome:
    """`book`: the cassette's goldens, None when they do not apply (replayed through another target)."""
    section = book.check(result, names) if book is not None else None
    samples = [s for f in result.finishes for s in f.samples]
    details = session_details(result, job.verbosity, job.style) if job.style is not None else session_details(result)
    return SessionOutcome(
        result.cassette,
        result.session,
        result.line(),
        details,
        result.ok,
        result.skipped,
        result.exchanges,
        section if job.update_goldens else None,
        [exports.sample_line(result.session, i, s) for i, s in enumerate(samples)] if job.export_replayed else [],
        [exports.sample_line(result.session, i, s) for i, s in enumerate(result.live_samples)]
        if job.export_live
        else [],
    )
