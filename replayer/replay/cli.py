"""`tito replay CASSETTE... [--session NAME]... [--update-goldens] [-j N | --ray ADDRESS] [--shard I/N]
[--junit-xml FILE] [--target TARGET]`: replay, verify, check goldens.

Prints one line per session (turns, side turns, samples, forks by reason, realigns, masked and trained
tokens, coverage, result), the first difference of a failing session under it, and a summary (`-q`: failing
sessions and the summary only; `-v`: every difference). Exit 0 when every session matches its recording and
its golden; 1 on any difference or unused golden; 2 when the input cannot be replayed (no such file, corrupt
cassette, another tokenizer, unknown session, a target that cannot start, a command or module only the cassette
names: a cassette is data, `tito_rl.recorder.targets.profiles.trust`). A folder stands for the cassettes
in it, and a golden in it whose cassette is gone is unused, as is a golden section for a session its cassette
no longer has. Nothing printed depends on timing, concurrency or `-j`: two replays print the same bytes.
Lines are printed as sessions finish, in cassette and session order (`tito_rl.replayer.replay.batch`).
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from tito_rl.recorder.targets.profiles.trust import TRUST_HELP
from tito_rl.replayer.goldens.diff_view import DiffStyle, use_color
from tito_rl.replayer.goldens.files import CASSETTE_SUFFIX, Unused, fix_unused, orphans
from tito_rl.replayer.replay import whatif
from tito_rl.trajectory.adapters.parsing import parser_process

EXIT_OK, EXIT_DIFFERENCE, EXIT_UNUSABLE = 0, 1, 2
REPLAY_GC_YOUNG = 20_000  # allocations between passes over the young generation (CPython's default: 700)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cassettes", nargs="+", metavar="CASSETTE", help="cassette files, or folders of them")
    parser.add_argument(
        "--session", action="append", default=[], metavar="NAME", help="replay only this session (repeatable)"
    )
    parser.add_argument(
        "--update-goldens",
        action="store_true",
        help="write the goldens from this replay, delete unused ones; differences from the "
        "recording are noted, not failed",
    )
    parser.add_argument(
        "--allow-unused-goldens",
        action="store_true",
        help="a golden whose cassette is gone, or a section for a session no longer there, is a warning, not a failure",
    )
    parser.add_argument("--full-diff", action="store_true", help="golden diffs whole, not cut at 80 lines")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="failing sessions and the summary only")
    loud.add_argument("-v", "--verbose", action="store_true", help="every difference, each with its detail")
    parser.add_argument("--export-samples", metavar="FILE", help="write the replay's samples as JSON Lines")
    parser.add_argument(
        "--export-live-samples", metavar="FILE", help="write the samples the live run stored, in the same shape"
    )
    spread = parser.add_mutually_exclusive_group()
    spread.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="worker processes replaying sessions in parallel (default 1: this process)",
    )
    spread.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="replay as tasks on the Ray cluster at ADDRESS (HOST:PORT; auto: the one RAY_ADDRESS names, else one "
        "started on this machine), the output the same as -j's; the workers read the cassettes and goldens at the "
        "same paths, so they must be on a file system every node shares (needs pip install 'tito-rl[ray]')",
    )
    parser.add_argument(
        "--shard",
        metavar="I/N",
        help="replay only the sessions of shard I of N (1 <= I <= N): a stable split by cassette "
        "file name and session name, for a CI matrix",
    )
    parser.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML report, a test case per session")
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the recording's)")
    parser.add_argument(
        "--target",
        metavar="TARGET",
        help="replay through tito (tito's adapter app), a driver (slime, an entry point of "
        "tito.targets, module:attribute), a gateway profile file (FILE.yaml: yours, checked against the copy the "
        "cassette keeps) or a running gateway http://HOST:PORT; default: the target the cassette was recorded "
        "around, where it is tito or a driver installed here (a profile file or module:attribute only the cassette "
        "names is refused: see --trust-cassette). Goldens are checked only through that one",
    )
    parser.add_argument("--trust-cassette", action="store_true", help=TRUST_HELP)
    parser.add_argument(
        "--engine-listen",
        metavar="HOST:PORT",
        help="where replay serves the engine leg for a foreign target (an http:// gateway must have "
        "been started with it as its engine URL; a driver's gateway gets a free port)",
    )
    whatif.register(parser.add_argument)


def expand(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        path = Path(p)
        out += [str(c) for c in sorted(path.glob(f"*{CASSETTE_SUFFIX}"))] if path.is_dir() else [p]
    return out


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        return _unusable("--jobs must be >= 1")
    # Loading the tokenizer and the parsers makes hundreds of thousands of objects that automatic collections
    # would walk again and again as they grow (a tenth of the start-up); none of them is garbage.
    gc.disable()
    if args.jobs > 1 or args.ray:  # forked workers get the parsers from the parent (batch.preload); Ray's load them
        parser_process.stop()
    # A replay makes many short-lived containers (each exchange's parsed request, messages, replies): a young
    # generation 30 times the default lets most die by their reference counts before a pass walks them.
    thresholds = gc.get_threshold()
    gc.set_threshold(REPLAY_GC_YOUNG, *thresholds[1:])
    try:
        return _replay(args)
    finally:
        gc.set_threshold(*thresholds)
        gc.enable()


def _replay(args: argparse.Namespace) -> int:
    cassettes = expand(args.cassettes)
    if not cassettes:
        return _unusable(f"no cassettes in {' '.join(args.cassettes)}")
    from tito_rl.replayer.replay import batch
    from tito_rl.replayer.replay.loading import ReplayInputError
    from tito_rl.replayer.replay.options import ReplayOptions
    from tito_rl.replayer.workers import Backend, WorkersError

    try:
        adapter, manager = whatif.overrides(lambda name: getattr(args, name))
        shard = batch.parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        return _unusable(str(exc))
    strict = not (args.update_goldens or whatif.engine_match_order(lambda name: getattr(args, name)))
    options = ReplayOptions(
        strict=strict,
        tokenizer=args.tokenizer,
        adapter=adapter,
        manager=manager,
        target=args.target,
        trust_cassette=args.trust_cassette,
        engine_listen=args.engine_listen,
    )
    try:
        works = batch.plan_work(cassettes, args.session or None, options, shard)
    except ReplayInputError as exc:
        return _unusable(str(exc))
    found = {n for w in works for n in w.all_sessions}
    missing = [n for n in args.session if n not in found]
    if missing:
        return _unusable(f"no session {', '.join(map(repr, missing))} in {', '.join(cassettes)}")

    if args.ray is None:  # a Ray driver replays nothing itself
        batch.preload(works)
    if getattr(args, "exits_at_once", False):
        gc.freeze()  # what loading made is no garbage, and outlives the replay: no later pass need walk it
    gc.enable()
    verbosity = -1 if args.quiet else 1 if args.verbose else 0
    style = DiffStyle(color=use_color(sys.stdout), full=args.full_diff)
    job = batch.Job(
        options, args.update_goldens, bool(args.export_samples), bool(args.export_live_samples), verbosity, style
    )
    # A running gateway's engine leg is one port: one process serves it.
    gateway = next((w.target for w in works if w.target.startswith(("http://", "https://"))), None)
    if gateway is not None and args.ray:
        return _unusable(f"--ray cannot replay through the running gateway {gateway}: its engine leg is one port here")
    backend = Backend(1 if gateway is not None else args.jobs, args.ray)
    folders = [Path(p) for p in args.cassettes if Path(p).is_dir()]
    unused = unused_goldens(works, folders)  # before the replay: an update rewrites the goldens it checks
    report = Report(works, args, verbosity)
    progress = Progress()
    progress.add_total(batch.total_exchanges(works) if progress.bar is not None else 0)

    def done(outcome: batch.SessionOutcome) -> None:
        progress.step(outcome.exchanges)
        report.add(outcome)

    try:
        batch.replay_all(works, job, backend, done)
    except (ReplayInputError, WorkersError) as exc:
        return _unusable(str(exc))
    finally:
        progress.close()
        report.close()
    failed_unused = report_unused(unused, args.update_goldens, args.allow_unused_goldens)
    beside = [Path(c).parent for c in cassettes if Path(c).parent not in folders]  # not this run's to judge
    for golden in orphans(beside) if verbosity >= 0 else []:
        print(f"note: {golden} has no cassette beside it ({golden.with_suffix(CASSETTE_SUFFIX).name} is gone)")
    print(
        f"{report.total} session(s): {report.total - report.failed} ok, {report.failed} failed"
        + (f"; {failed_unused} unused golden(s)" if failed_unused else "")
    )
    if args.junit_xml:
        from tito_rl.replayer.reporting.junit import write_junit

        write_junit(args.junit_xml, report.cases)
    return EXIT_DIFFERENCE if report.failed or failed_unused else EXIT_OK


def unused_goldens(works: list[Any], folders: list[Path]) -> list[Unused]:
    """Goldens nobody checked: sections of the replayed cassettes' goldens for sessions they no longer have,
    and goldens in the folders named whose cassette is gone."""
    from tito_rl.replayer.goldens.files import GoldenBook

    found = [
        Unused(book.path, name)
        for w in works
        if w.sessions and w.goldens_apply
        for book in [GoldenBook(w.path)]
        for name in book.unused(w.all_sessions)
    ]
    return found + [Unused(g) for g in orphans(folders)]


def report_unused(unused: list[Unused], update: bool, allow: bool) -> int:
    """Delete (update), warn (allow) or fail each; the count that fails."""
    for item in unused:
        if update:
            item.remove()
            print(f"removed {item.describe()}")
        elif allow:
            print(f"warning: {item.describe()} (--update-goldens removes it)")
        else:
            print(f"FAIL: {item.describe()} ({fix_unused()})")
    return 0 if update or allow else len(unused)


class Report:
    """Prints each outcome as it comes (the cassette's path before its first session, its notes after its last),
    writes the exports, and keeps what the summary and the JUnit report need."""

    def __init__(self, works: list[Any], args: argparse.Namespace, verbosity: int = 0) -> None:
        from tito_rl.replayer.goldens.files import GoldenBook

        self.works = {w.path: w for w in works}
        self.left = {w.path: len(w.sessions) for w in works}
        self.books = (
            {w.path: GoldenBook(w.path, update=True) for w in works if w.goldens_apply} if args.update_goldens else {}
        )
        self.verbosity = verbosity
        self.headed: set[str] = set()
        self.total = self.failed = 0
        self.junit = bool(args.junit_xml)
        self.cases: list[Any] = []  # kept for the JUnit report only
        self.replayed = open(args.export_samples, "w", encoding="utf-8") if args.export_samples else None  # noqa: SIM115
        self.live = open(args.export_live_samples, "w", encoding="utf-8") if args.export_live_samples else None  # noqa: SIM115

    def add(self, outcome: Any) -> None:
        work = self.works[outcome.cassette]
        if self.verbosity >= 0 or not outcome.ok:
            if work.path not in self.headed:  # the cassette's path before its first session shown
                self.headed.add(work.path)
                print(
                    work.path
                    + (
                        ""
                        if work.goldens_apply
                        else f"  (recorded around {work.recorded_target}, replayed through {work.target}: "
                        "compared with the recording, goldens not checked)"
                    )
                )
            print("  " + outcome.line)
            for line in outcome.details:
                print("    " + line)
        self.total += 1
        self.failed += not outcome.ok
        if self.junit:
            self.cases.append(replace(outcome, section=None))
        if outcome.section is not None and work.path in self.books:
            self.books[work.path].rendered[outcome.session] = outcome.section
        for out, rows in ((self.replayed, outcome.replayed_rows), (self.live, outcome.live_rows)):
            if out is not None:
                out.writelines(row + "\n" for row in rows)
        outcome.replayed_rows = outcome.live_rows = []
        self.left[work.path] -= 1
        if self.left[work.path] == 0:
            self._cassette_done(work)

    def _cassette_done(self, work: Any) -> None:
        if work.path in self.books:
            self.books[work.path].write(work.all_sessions)
        if work.truncated and self.verbosity >= 0:
            print(
                "  note: the cassette ends in a cut record (the recorder stopped mid-write); all before it was replayed"
            )

    def close(self) -> None:
        for out in (self.replayed, self.live):
            if out is not None:
                out.close()


def _unusable(message: str) -> int:
    print(f"tito replay: {message}", file=sys.stderr)
    return EXIT_UNUSABLE


class Progress:
    """A progress bar over agent exchanges, on a terminal only (tqdm; nothing at all when piped). It shows
    once a replay has run for `delay_s`: a short replay prints nothing but its result."""

    def __init__(self, stream: Any = None, delay_s: float = 0.5) -> None:
        stream = sys.stderr if stream is None else stream
        self.bar: Any = None
        if stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=0, unit="exchange", desc="replay", delay=delay_s, leave=False, file=stream)

    def add_total(self, n: int) -> None:
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def step(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
