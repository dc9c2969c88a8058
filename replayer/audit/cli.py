"""`tito audit CASSETTE|FOLDER... [--json] [--html FILE] [--fail-on RULES] [-j N | --ray ADDRESS]`: check
recordings' training data without replaying them (docs/audit.md).

Exit 0 when no rule of `--fail-on` fired (or each that fired is allowed beside its cassette), 1 when one did,
2 for input the audit cannot use, with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from tito_rl.replayer.audit.protocol import DEFAULT_FAIL_ON, RULES

EXIT_OK, EXIT_FIRED, EXIT_UNUSABLE = 0, 1, 2
RAY_HELP = (
    "audit as tasks on the Ray cluster at ADDRESS (HOST:PORT; auto: the one RAY_ADDRESS names, else one started on "
    "this machine), the report the same as -j's; the workers read the cassettes at the same paths, so they must be "
    "on a file system every node shares (needs pip install 'tito-rl[ray]')"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="CASSETTE|FOLDER",
        help="cassettes, or folders standing for the *.tito files in them",
    )
    parser.add_argument("--json", action="store_true", help="print the audit as JSON (docs/audit.md, its schema)")
    parser.add_argument("--html", metavar="FILE", help="write the audit as one self-contained HTML page")
    spread = parser.add_mutually_exclusive_group()
    spread.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="worker processes auditing in parallel (default 1: this process): each cassette's sessions are "
        "cut into ranges that the workers read from its index, so one large cassette spreads over them as a "
        "run's folder does; the report is the same bytes for any N",
    )
    spread.add_argument("--ray", metavar="ADDRESS", help=RAY_HELP)
    parser.add_argument(
        "--max-staleness",
        type=int,
        default=None,
        metavar="N",
        help="stale-tokens: a sample's tokens may span weight versions at most N apart (integers where they "
        "parse, else by order of first appearance in the session); default: not checked",
    )
    parser.add_argument(
        "--fail-on",
        default=",".join(DEFAULT_FAIL_ON),
        metavar="RULES",
        help=f"comma-separated rule ids that exit 1 when they fire (default: "
        f"{','.join(DEFAULT_FAIL_ON)}; empty: never); rules: {', '.join(RULES)}",
    )


def run(args: argparse.Namespace) -> int:
    from tito_rl.replayer.audit.report import render_text, to_json
    from tito_rl.replayer.audit.runner import AuditInputError, AuditOptions, audit, parse_rules
    from tito_rl.replayer.workers import WorkersError

    if args.jobs < 1:
        print("tito audit: --jobs must be >= 1", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.max_staleness is not None and args.max_staleness < 0:
        print("tito audit: --max-staleness must be >= 0", file=sys.stderr)
        return EXIT_UNUSABLE
    bar = progress_bar(args.inputs)
    try:
        report = audit(
            args.inputs,
            parse_rules(args.fail_on),
            bar.update if bar is not None else None,
            args.jobs,
            args.ray,
            options=AuditOptions(args.max_staleness),
        )
    except (AuditInputError, WorkersError) as exc:
        print(f"tito audit: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    finally:
        if bar is not None:
            bar.close()
    if args.html:
        from tito_rl.replayer.audit.html_page import render_html
        from tito_rl.replayer.reporting.pages import write_page

        if not write_page("tito audit", args.html, render_html(report)):
            return EXIT_UNUSABLE
        print(f"wrote {args.html} ({len(report.cassettes)} cassette(s))")
    elif args.json:
        print(json.dumps(to_json(report), indent=1, ensure_ascii=False))
    else:
        sys.stdout.write(render_text(report))
    return EXIT_FIRED if report.failed else EXIT_OK


def progress_bar(inputs: list[str], stream: Any = None, delay_s: float = 0.5) -> Any:
    """A bar over the bytes of the cassettes to read, on a terminal only (tqdm; nothing when piped), shown once
    an audit has run for `delay_s`: a production cassette takes half a minute, a corpus cassette no time."""
    stream = sys.stderr if stream is None else stream
    if not stream.isatty():
        return None
    from tqdm import tqdm

    from tito_rl.replayer.audit.runner import AuditInputError, cassette_paths

    try:
        total = sum(Path(p).stat().st_size for p in cassette_paths(inputs))
    except (AuditInputError, OSError):
        return None  # the audit itself says what is wrong with its input, in one line
    return tqdm(total=total, unit="B", unit_scale=True, desc="audit", delay=delay_s, leave=False, file=stream)
