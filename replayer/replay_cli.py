"""`tito replay CASSETTE... [--session NAME]... [--update-goldens] [-j N] [--shard I/N] [--junit-xml FILE]`:
replay, verify, check goldens.

Prints one line per session (turns, side turns, samples, forks by reason, realigns, masked and trained
tokens, result), the first difference of a failing session under it, and a summary. Exit 0 when every
session matches its recording and its golden; 1 on any difference; 2 when the input cannot be replayed
(no such file, corrupt cassette, another tokenizer, unknown session). A folder stands for the cassettes
in it. Nothing printed depends on timing, concurrency or `-j`: two replays print the same bytes. Lines are
printed as sessions finish, in cassette and session order (`replayer.replay_run`).
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from replayer import whatif
from replayer.goldens import CASSETTE_SUFFIX, orphans

EXIT_OK, EXIT_DIFFERENCE, EXIT_UNUSABLE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cassettes", nargs="+", metavar="CASSETTE", help="cassette files, or folders of them")
    parser.add_argument("--session", action="append", default=[], metavar="NAME",
                        help="replay only this session (repeatable)")
    parser.add_argument("--update-goldens", action="store_true",
                        help="write the goldens from this replay; differences from the recording are noted, "
                             "not failed")
    parser.add_argument("--export-samples", metavar="FILE", help="write the replay's samples as JSON Lines")
    parser.add_argument("--export-live-samples", metavar="FILE",
                        help="write the samples the live run stored, in the same shape")
    parser.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                        help="worker processes replaying sessions in parallel (default 1: this process)")
    parser.add_argument("--shard", metavar="I/N",
                        help="replay only the sessions of shard I of N (1 <= I <= N): a stable split by cassette "
                             "file name and session name, for a CI matrix")
    parser.add_argument("--junit-xml", metavar="FILE", help="also write a JUnit XML report, a test case per session")
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the recording's)")
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
    try:
        return _replay(args)
    finally:
        gc.enable()


def _replay(args: argparse.Namespace) -> int:
    cassettes = expand(args.cassettes)
    if not cassettes:
        return _unusable(f"no cassettes in {' '.join(args.cassettes)}")
    from replayer import replay_run
    from replayer.replay import ReplayInputError, ReplayOptions

    try:
        adapter, manager = whatif.overrides(lambda name: getattr(args, name))
        shard = replay_run.parse_shard(args.shard) if args.shard else None
    except ValueError as exc:
        return _unusable(str(exc))
    strict = not (args.update_goldens or whatif.engine_match_order(lambda name: getattr(args, name)))
    options = ReplayOptions(strict=strict, tokenizer=args.tokenizer, adapter=adapter, manager=manager)
    try:
        works = replay_run.plan_work(cassettes, args.session or None, options, shard)
    except ReplayInputError as exc:
        return _unusable(str(exc))
    found = {n for w in works for n in w.all_sessions}
    missing = [n for n in args.session if n not in found]
    if missing:
        return _unusable(f"no session {', '.join(map(repr, missing))} in {', '.join(cassettes)}")

    replay_run.preload(works)
    gc.enable()
    job = replay_run.Job(options, args.update_goldens, bool(args.export_samples), bool(args.export_live_samples))
    report = Report(works, args)
    progress = Progress()
    progress.add_total(replay_run.total_exchanges(works) if progress.bar is not None else 0)
    try:
        replay_run.replay_all(works, job, args.jobs, lambda outcome: (progress.step(outcome.exchanges),
                                                                       report.add(outcome)))
    except ReplayInputError as exc:
        return _unusable(str(exc))
    finally:
        progress.close()
        report.close()
    for golden in orphans([Path(c).parent for c in cassettes]):
        print(f"note: {golden} has no cassette beside it ({golden.with_suffix(CASSETTE_SUFFIX).name} is gone)")
    print(f"{report.total} session(s): {report.total - report.failed} ok, {report.failed} failed")
    if args.junit_xml:
        from replayer.junit import write_junit

        write_junit(args.junit_xml, report.cases)
    return EXIT_DIFFERENCE if report.failed else EXIT_OK


class Report:
    """Prints each outcome as it comes (the cassette's path before its first session, its notes after its last),
    writes the exports, and keeps what the summary and the JUnit report need."""

    def __init__(self, works: list[Any], args: argparse.Namespace) -> None:
        from replayer.goldens import GoldenBook

        self.works = {w.path: w for w in works}
        self.left = {w.path: len(w.sessions) for w in works}
        self.books = {w.path: GoldenBook(w.path, update=True) for w in works} if args.update_goldens else {}
        self.total = self.failed = 0
        self.junit = bool(args.junit_xml)
        self.cases: list[Any] = []  # kept for the JUnit report only
        self.replayed = open(args.export_samples, "w", encoding="utf-8") if args.export_samples else None  # noqa: SIM115
        self.live = open(args.export_live_samples, "w", encoding="utf-8") if args.export_live_samples else None  # noqa: SIM115

    def add(self, outcome: Any) -> None:
        work = self.works[outcome.cassette]
        if self.left[work.path] == len(work.sessions):
            print(work.path)
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
        if work.truncated:
            print("  note: the cassette ends in a cut record (the recorder stopped mid-write); all before it "
                  "was replayed")

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
