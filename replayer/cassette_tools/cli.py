"""`tito cassette ACTION`: look at and reshape cassettes without replaying them.

`info PATH [--json]`: the header and per-session counts. `export PATH [--session NAME]... [--out FILE]`: the
records as JSON (`export`). `cut PATH --session NAME... --out FILE`: those sessions in a cassette of their own;
`merge A B... --out FILE`: several recordings in one (`cut_merge`).
Unusable input exits 2 with one line, `tito cassette <action>: ...`; no action overwrites an existing file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tito_rl.cassette.format.errors import CassetteError
from tito_rl.cassette.reader import CassetteSummary, summarize
from tito_rl.cassette.writer import CASSETTE_SUFFIX
from tito_rl.replayer.cassette_tools.cut_merge import (
    CassetteToolError,
    Written,
    cut,
    merge,
    read_summary,
    require_sessions,
)
from tito_rl.replayer.cassette_tools.export import export
from tito_rl.replayer.goldens.files import update_command

EXIT_OK, EXIT_UNUSABLE = 0, 2


UNUSABLE = "2: the input cannot be used (no such file, not a cassette, corrupt)"


def _info_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="cassette file, or a folder of them (a recorded run)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def _export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="cassette file")
    parser.add_argument("--session", action="append", metavar="NAME", help="only this session (repeatable)")
    parser.add_argument("--out", metavar="FILE", help="write here instead of stdout (a new file)")


def _cut_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", help="cassette file")
    parser.add_argument(
        "--session", action="append", required=True, metavar="NAME", help="a session to keep (repeatable)"
    )
    parser.add_argument("--out", required=True, metavar="FILE", help="the new cassette (never overwritten)")


def _merge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="CASSETTE", help="cassette files, merged in this order")
    parser.add_argument("--out", required=True, metavar="FILE", help="the new cassette (never overwritten)")


# Each action: summary, description, exit codes (its --help) and its options (tito_rl.commands.Action).
ACTIONS = {
    "info": (
        "print the header and per-session counts",
        "Prints a cassette's header (format, tito version, tokenizer, parsers, target, agent, engine) and each "
        "session's agent exchanges, engine calls, samples and drops, without replaying it; says whether the file "
        "was cut short (a killed recording). A folder (a run recorded with --rotate-sessions) is read as one "
        "recording: the first cassette's header, then every session with the cassette holding it. --json prints "
        "the same for machines.",
        ("0: printed", UNUSABLE),
        _info_arguments,
    ),
    "export": (
        "print the records as JSON (token ids resolved, bodies parsed)",
        "Prints a cassette's header and records as one JSON document, every delta resolved to its token ids and "
        "every request and reply body parsed (a jq-friendly view); --session keeps some sessions, --out writes a "
        "new file instead of printing.",
        (
            "0: exported",
            "2: the input cannot be used (no such file, not a cassette, corrupt, unknown session), or --out exists",
        ),
        _export_arguments,
    ),
    "cut": (
        "write some sessions into a cassette of their own",
        "Writes the named sessions, with the cassette's header, into a new cassette (a bug report's one session, "
        "say). Never overwrites --out, and writes nowhere else.",
        (
            "0: written",
            "2: the input cannot be used (no such file, not a cassette, corrupt, unknown session), or --out exists",
        ),
        _cut_arguments,
    ),
    "merge": (
        "join cassettes recorded with the same tokenizer and settings",
        "Joins several recordings into a new cassette, their sessions in the order given; they must share the "
        "tokenizer and the settings replay depends on, and no session name. Never overwrites --out, and writes "
        "nowhere else.",
        (
            "0: written",
            "2: an input cannot be used (no such file, not a cassette, corrupt), they differ in "
            "tokenizer or settings or share a session, or --out exists",
        ),
        _merge_arguments,
    ),
}


def target_line(target: dict[str, Any] | None) -> str:
    """Who sat between the two legs: tito's adapter, or a gateway with its name and version."""
    if not target:
        return "tito (tito's own adapter app)"
    version = f" {target.get('version')}" if target.get("version") else ""
    return f"{target.get('ref') or target.get('name')} ({target.get('kind')}: {target.get('name')}{version})"


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
        f"target:          {target_line(h.target)}",
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
    actions: dict[str, Callable[[argparse.Namespace], int]] = {
        "info": run_info,
        "export": run_export,
        "cut": run_cut,
        "merge": run_merge,
    }
    try:
        return actions[args.cassette_command](args)
    except (CassetteToolError, CassetteError, OSError) as exc:
        return _unusable(args.cassette_command, str(exc))


def run_info(args: argparse.Namespace) -> int:
    if Path(args.path).is_dir():
        return _folder_info(Path(args.path), args.json)
    summary = summarize(args.path, verify=False)  # a cassette's stored index answers without reading records
    if args.json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        print(format_text(summary))
    return EXIT_OK


def _folder_info(folder: Path, as_json: bool) -> int:
    """A run's folder: each cassette summarized from its index, shown as one recording."""
    paths = sorted(folder.glob(f"*{CASSETTE_SUFFIX}"))
    if not paths:
        return _unusable("info", f"{folder}: no cassettes (*{CASSETTE_SUFFIX}) in this folder")
    summaries = [(p, summarize(p, verify=False)) for p in paths]
    if as_json:
        print(
            json.dumps(
                {
                    "path": str(folder),
                    "cassettes": [{"path": p.name, **s.to_dict()} for p, s in summaries],
                    "sessions": sum(len(s.sessions) for _, s in summaries),
                    "truncated": [p.name for p, s in summaries if s.truncated],
                },
                indent=2,
            )
        )
        return EXIT_OK
    first = format_text(summaries[0][1]).split("\n\n", 1)[0]  # the header lines
    rows = [(s.session, p.name, s) for p, summary in summaries for s in summary.sessions]
    width = max([len("session")] + [len(name) for name, _, _ in rows])
    part = max(len(p.name) for p in paths)
    lines = [first, "", f"{'session':<{width}}  {'cassette':<{part}}  agent  engine  samples"]
    lines += [
        f"{name:<{width}}  {where:<{part}}  {s.agent_exchanges:>5}  {s.engine_exchanges:>6}  {s.samples:>7}"
        for name, where, s in rows
    ]
    cut = [p.name for p, s in summaries if s.truncated]
    lines.append(f"{len(rows)} session(s) in {len(paths)} cassette(s)")
    lines.append(f"truncated: {', '.join(cut)} (the last record is incomplete)" if cut else "truncated: no")
    print("\n".join(lines))
    return EXIT_OK


def run_export(args: argparse.Namespace) -> int:
    if args.session:  # checked before anything is printed
        require_sessions(args.path, [s.session for s in read_summary(args.path).sessions], args.session)
    sessions = set(args.session) if args.session else None
    if args.out is None:
        export(args.path, sys.stdout, sessions)
        return EXIT_OK
    try:
        out = open(args.out, "x", encoding="ascii")  # noqa: SIM115 - closed below, removed on failure
    except FileExistsError:
        return _unusable("export", f"{args.out} exists; not overwritten")
    try:
        with out:
            export(args.path, out, sessions)
    except BaseException:
        os.unlink(args.out)
        raise
    return EXIT_OK


def run_cut(args: argparse.Namespace) -> int:
    return _report("cut", cut(args.path, args.out, args.session))


def run_merge(args: argparse.Namespace) -> int:
    return _report("merge", merge(args.paths, args.out))


def _report(action: str, written: Written) -> int:
    for warning in written.warnings:
        print(f"tito cassette {action}: warning: {warning}", file=sys.stderr)
    print(f"wrote {written.path}: {len(written.sessions)} session(s): {', '.join(written.sessions)}")
    print(f"no golden was written; write it with: {update_command(written.path)}")
    return EXIT_OK


def _unusable(action: str, message: str) -> int:
    print(f"tito cassette {action}: {message}", file=sys.stderr)
    return EXIT_UNUSABLE
