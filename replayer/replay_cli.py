"""`tito replay CASSETTE... [--session NAME]... [--update-goldens]`: replay, verify, check goldens.

Prints one line per session (turns, side turns, samples, forks by reason, realigns, masked and trained
tokens, result), the first difference of a failing session under it, and a summary (`-q`: failing sessions
and the summary only; `-v`: every difference). Exit 0 when every session matches its recording and its
golden; 1 on any difference or unused golden; 2 when the input cannot be replayed (no such file, corrupt
cassette, another tokenizer, unknown session). A folder stands for the cassettes in it, and a golden in it
whose cassette is gone is unused, as is a golden section for a session its cassette no longer has.
Nothing printed depends on timing or concurrency: two replays print the same bytes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from replayer import whatif
from replayer.golden_diff import DiffStyle, use_color
from replayer.goldens import CASSETTE_SUFFIX, Unused, fix_unused, orphans
from replayer.report import session_details
from replayer.results import CassetteResult

EXIT_OK, EXIT_DIFFERENCE, EXIT_UNUSABLE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cassettes", nargs="+", metavar="CASSETTE", help="cassette files, or folders of them")
    parser.add_argument("--session", action="append", default=[], metavar="NAME",
                        help="replay only this session (repeatable)")
    parser.add_argument("--update-goldens", action="store_true",
                        help="write the goldens from this replay, delete unused ones; differences from the "
                             "recording are noted, not failed")
    parser.add_argument("--allow-unused-goldens", action="store_true",
                        help="a golden whose cassette is gone, or a section for a session no longer there, is a "
                             "warning, not a failure")
    parser.add_argument("--full-diff", action="store_true", help="golden diffs whole, not cut at 80 lines")
    loud = parser.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="failing sessions and the summary only")
    loud.add_argument("-v", "--verbose", action="store_true", help="every difference, each with its detail")
    parser.add_argument("--export-samples", metavar="FILE", help="write the replay's samples as JSON Lines")
    parser.add_argument("--export-live-samples", metavar="FILE",
                        help="write the samples the live run stored, in the same shape")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="sessions replayed at once (default 1)")
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the recording's)")
    parser.add_argument("--target", metavar="TARGET",
                        help="replay through tito (tito's adapter app), a driver (slime, an entry point of "
                             "tito.targets, module:attribute) or a running gateway http://HOST:PORT; default: the "
                             "target the cassette was recorded around. Goldens are checked only through that one")
    parser.add_argument("--engine-listen", metavar="HOST:PORT",
                        help="where replay serves the engine leg for a foreign target (an http:// gateway must have "
                             "been started with it as its engine URL; a driver's gateway gets a free port)")
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
    cassettes = expand(args.cassettes)
    if not cassettes:
        return _unusable(f"no cassettes in {' '.join(args.cassettes)}")
    from replayer import exports, goldens
    from replayer.replay import ReplayInputError, ReplayOptions, replay_cassette_async, run_sync
    from trajectory.golden import TokenizerNames
    from trajectory.tokenizer import load_tokenizer

    try:
        adapter, manager = whatif.overrides(lambda name: getattr(args, name))
    except ValueError as exc:
        return _unusable(str(exc))
    progress = Progress()
    strict = not (args.update_goldens or whatif.engine_match_order(lambda name: getattr(args, name)))
    options = ReplayOptions(strict=strict, tokenizer=args.tokenizer, adapter=adapter, manager=manager,
                            jobs=args.jobs, on_total=progress.add_total, on_exchange=progress.step,
                            target=args.target, engine_listen=args.engine_listen)
    sessions = args.session or None
    results = []
    try:
        for cassette in cassettes:
            result = run_sync(replay_cassette_async(cassette, sessions, options, missing_ok=len(cassettes) > 1))
            if result.sessions:
                if result.goldens_apply:
                    goldens.check(result, result.all_sessions, TokenizerNames(load_tokenizer(result.tokenizer_dir)),
                                  update=args.update_goldens)
                results.append(result)
    except ReplayInputError as exc:
        return _unusable(str(exc))
    finally:
        progress.close()
    found = {s.session for r in results for s in r.sessions}
    missing = [n for n in args.session if n not in found]
    if missing:
        return _unusable(f"no session {', '.join(map(repr, missing))} in {', '.join(cassettes)}")

    verbosity = -1 if args.quiet else 1 if args.verbose else 0
    style = DiffStyle(color=use_color(sys.stdout), full=args.full_diff)
    failed = print_results(results, verbosity, style)
    folders = [Path(p) for p in args.cassettes if Path(p).is_dir()]
    failed_unused = report_unused(unused_goldens(results, folders), args.update_goldens, args.allow_unused_goldens)
    beside = [Path(c).parent for c in cassettes if Path(c).parent not in folders]  # not this run's to judge
    for golden in orphans(beside) if verbosity >= 0 else []:
        print(f"note: {golden} has no cassette beside it ({golden.with_suffix(CASSETTE_SUFFIX).name} is gone)")
    total = sum(len(r.sessions) for r in results)
    print(f"{total} session(s): {total - failed} ok, {failed} failed"
          + (f"; {failed_unused} unused golden(s)" if failed_unused else ""))
    for flag, rows in ((args.export_samples, exports.replayed_rows), (args.export_live_samples, exports.live_rows)):
        if flag:
            with open(flag, "w", encoding="utf-8") as out:
                exports.write_rows(rows(results), out)
    return EXIT_DIFFERENCE if failed or failed_unused else EXIT_OK


def print_results(results: list[CassetteResult], verbosity: int, style: DiffStyle) -> int:
    """Each cassette's sessions, lines and details (verbosity -1: failing sessions only); the failed count."""
    failed = 0
    for result in results:
        shown = result.sessions if verbosity >= 0 else [s for s in result.sessions if not s.ok]
        if shown:
            print(result.path + ("" if result.goldens_apply else
                                 f"  (recorded around {result.recorded_target}, replayed through {result.target}: "
                                 "compared with the recording, goldens not checked)"))
        for session in shown:
            print("  " + session.line())
            for line in session_details(session, verbosity, style):
                print("    " + line)
        failed += sum(not s.ok for s in result.sessions)
        if result.truncated and verbosity >= 0:
            print("  note: the cassette ends in a cut record (the recorder stopped mid-write); all before it "
                  "was replayed")
    return failed


def unused_goldens(results: list[CassetteResult], folders: list[Path]) -> list[Unused]:
    """Goldens nobody checked: sections of the replayed cassettes' goldens for sessions they no longer have,
    and goldens in the folders named whose cassette is gone."""
    found = [Unused(Path(r.golden_path), name) for r in results if r.golden_path for name in r.unused_sections]
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

    def step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
