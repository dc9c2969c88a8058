"""`tito inspect CASSETTE [--session NAME]... [--html FILE]`: look inside a cassette's sessions.

Replays the cassette (not strict: a difference from the recording is noted, not fatal) and prints per session
the exchanges with their token counts, finish reasons and timings, the manager's stats, the message tree and
every decision; `--html FILE` writes that as one self-contained page with each sample's tokens coloured.
Exit 0; 2 when the input cannot be replayed (no such file, corrupt cassette, another tokenizer, unknown
session, a gateway command or module only the cassette names), with one line on stderr, as `tito replay` does.
"""

from __future__ import annotations

import argparse
import gc
import sys

from tito_rl.recorder.targets.profiles.trust import TRUST_HELP

EXIT_OK, EXIT_UNUSABLE = 0, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cassette", metavar="CASSETTE", help="a cassette file, or a folder of them (a recorded run)")
    parser.add_argument(
        "--session", action="append", default=[], metavar="NAME", help="inspect only this session (repeatable)"
    )
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML page instead of printing")
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the recording's)")
    parser.add_argument(
        "--target",
        metavar="TARGET",
        help="replay through this target, as tito replay's --target (your gateway profile file for a cassette "
        "recorded through one; default: the recorded target where it is tito or a driver installed here)",
    )
    parser.add_argument("--trust-cassette", action="store_true", help=TRUST_HELP)


def run(args: argparse.Namespace) -> int:
    # Named sessions: automatic collection off. Their replay makes little garbage, and each pass walks the ~300k
    # objects of the tokenizer and the modules again (a twentieth of the longest session's inspect). A whole
    # cassette keeps it: its garbage grows with the sessions (5.6 GB instead of 3.6 for 512 of them).
    paused = bool(args.session) and gc.isenabled()
    if paused:
        gc.disable()
    try:
        return _inspect(args)
    finally:
        if paused and not getattr(args, "exits_at_once", False):  # else a pass would walk all made meanwhile
            gc.enable()


def _inspect(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tito_rl.replayer.inspection.gather import inspect_cassette, inspect_folder
    from tito_rl.replayer.inspection.text import render_text
    from tito_rl.replayer.replay.loading import ReplayInputError

    try:
        inspect = inspect_folder if Path(args.cassette).is_dir() else inspect_cassette
        inspection = inspect(args.cassette, args.session or None, args.tokenizer, args.target, args.trust_cassette)
    except ReplayInputError as exc:
        print(f"tito inspect: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.html:
        from tito_rl.replayer.inspection.html_page import render_html
        from tito_rl.replayer.reporting.pages import write_page

        if not write_page("tito inspect", args.html, render_html(inspection)):
            return EXIT_UNUSABLE
        print(f"wrote {args.html} ({len(inspection.sessions)} session(s))")
        return EXIT_OK
    sys.stdout.write(render_text(inspection))
    return EXIT_OK
