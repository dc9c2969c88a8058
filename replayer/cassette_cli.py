"""`tito cassette info PATH [--json]`: what a cassette holds, without replaying it."""

from __future__ import annotations

import argparse
import json
import sys

from recorder.cassette_format import CassetteError
from replayer.reader import CassetteSummary, summarize


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cassette_command", required=True, metavar="ACTION")
    info = sub.add_parser("info", help="print the header and per-session counts")
    info.add_argument("path", help="cassette file")
    info.add_argument("--json", action="store_true", help="machine-readable output")


def format_text(summary: CassetteSummary) -> str:
    h = summary.header
    lines = [
        f"format version:  {h.format_version}",
        f"tito version:    {h.tito_version}",
        f"created:         {h.created}",
        f"tokenizer:       {h.tokenizer_fingerprint}",
        f"parsers:         {json.dumps(h.parsers, sort_keys=True)}",
        f"adapter:         {json.dumps(h.adapter, sort_keys=True)}",
        f"agent:           {json.dumps(h.agent, sort_keys=True)}",
        f"engine:          {json.dumps(h.engine, sort_keys=True)}",
    ]
    if h.extra:
        lines.append(f"extra:           {json.dumps(h.extra, sort_keys=True)}")
    lines.append("")
    width = max([len("session")] + [len(s.session) for s in summary.sessions])
    lines.append(f"{'session':<{width}}  agent  engine  samples")
    for s in summary.sessions:
        lines.append(f"{s.session:<{width}}  {s.agent_exchanges:>5}  {s.engine_exchanges:>6}  {s.samples:>7}")
    lines.append(f"{len(summary.sessions)} session(s)")
    if summary.truncated:
        lines.append("truncated: yes (the last record is incomplete; everything above it is readable)")
    else:
        lines.append("truncated: no")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        summary = summarize(args.path)
    except (CassetteError, OSError) as exc:
        print(f"tito cassette info: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(format_text(summary))
    return 0
