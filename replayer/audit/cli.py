"""`tito audit CASSETTE|FOLDER... [--json] [--html FILE] [--fail-on RULES]`: check recordings' training data
without replaying them (docs/audit.md).

Exit 0 when no rule of `--fail-on` fired (or each that fired is allowed beside its cassette), 1 when one did,
2 for input the audit cannot use, with one line on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys

from tito_rl.replayer.audit.protocol import DEFAULT_FAIL_ON, RULES

EXIT_OK, EXIT_FIRED, EXIT_UNUSABLE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="CASSETTE|FOLDER",
                        help="cassettes, or folders standing for the *.tito files in them")
    parser.add_argument("--json", action="store_true", help="print the audit as JSON (docs/audit.md, its schema)")
    parser.add_argument("--html", metavar="FILE", help="write the audit as one self-contained HTML page")
    parser.add_argument("--fail-on", default=",".join(DEFAULT_FAIL_ON), metavar="RULES",
                        help=f"comma-separated rule ids that exit 1 when they fire (default: "
                             f"{','.join(DEFAULT_FAIL_ON)}; empty: never); rules: {', '.join(RULES)}")


def run(args: argparse.Namespace) -> int:
    from tito_rl.replayer.audit.report import render_text, to_json
    from tito_rl.replayer.audit.runner import AuditInputError, audit, parse_rules

    try:
        report = audit(args.inputs, parse_rules(args.fail_on))
    except AuditInputError as exc:
        print(f"tito audit: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.html:
        from tito_rl.replayer.audit.html_page import render_html

        try:
            with open(args.html, "w", encoding="utf-8") as out:
                out.write(render_html(report))
        except OSError as exc:
            print(f"tito audit: cannot write {args.html}: {exc.strerror or exc}", file=sys.stderr)
            return EXIT_UNUSABLE
        print(f"wrote {args.html} ({len(report.cassettes)} cassette(s))")
    elif args.json:
        print(json.dumps(to_json(report), indent=1, ensure_ascii=False))
    else:
        sys.stdout.write(render_text(report))
    return EXIT_FIRED if report.failed else EXIT_OK
