"""`make conformance`: one corpus, many gateways. The committed cassettes replayed through another target.

Each cassette goes through the other target in `--engine-match order` mode (every exchange is served its own
recorded generation, so a gateway that renders differently still gets the same model outputs) and, for the
figures beside it, through the target it was recorded around. Per session it reports what a gateway team acts
on: do the engine requests agree with the recording's (the first divergence, decoded), which replies differ in
a way an agent would notice (text, tool calls, stop reason; never ids), and each side's samples, forks by
reason, trained tokens and turns left untrained. `docs/conformance.md` holds the tables between its markers;
the findings written above them are kept.

    python -m replayer.conformance --target slime cassettes/                # rewrite the slime table
    python -m replayer.conformance --target tito cassettes/targets/         # cassettes recorded around slime
    python -m replayer.conformance --target tito cassettes/targets/ --check # exit 1 if the page is out of date
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "conformance.md"
CELL = 90


@dataclass
class Side:
    """One target's training data for a session."""

    samples: int = 0
    forks: Counter[str] = field(default_factory=Counter)
    trained: int = 0
    untrained_turns: int | None = None  # generated turns none of whose output is trained; None: not known

    def forks_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.forks.items())) or "none"


@dataclass
class SessionReport:
    cassette: str
    session: str
    generations: int = 0
    changed_prompts: int = 0
    first_divergence: str = ""
    replies: int = 0
    changed_replies: int = 0
    first_reply: str = ""
    recorded: Side = field(default_factory=Side)
    target: Side = field(default_factory=Side)
    error: str = ""


def side_of(session: Any) -> Side:
    side = Side()
    for finish in session.finishes:
        stats = finish.linearization.stats
        side.samples += stats.samples
        side.forks.update(stats.forks)
        side.trained += stats.trained_tokens
        turns = stats.turns
        if finish.tree.get("target"):  # a foreign target: what its driver said, where it said it
            known = finish.tree.get("untrained_turns")
            side.untrained_turns = None if known is None else (side.untrained_turns or 0) + known
        else:
            trained = {s.turn_index for spans in finish.linearization.spans for s in spans if s.trained}
            side.untrained_turns = (side.untrained_turns or 0) + max(0, turns - len(trained))
    return side


def _first(differences: list[Any], kind: str) -> tuple[int, str]:
    found = [d for d in differences if d.kind == kind]
    if not found:
        return 0, ""
    first = found[0]
    where = f"exchange {first.exchange}" + (f", turn {first.turn}" if first.turn is not None else "")
    detail = next((line for line in first.detail if line.startswith("replayed:")), "") if kind == "engine-request" \
        else "; ".join(first.detail[:3])
    summary = first.summary.replace("engine request differs: ", "")
    return len(found), f"{where}: {summary}" + (f" — {detail}" if detail else "")


async def _replay(path: str, target: str | None, strict: bool) -> Any:
    from replayer.replay import ReplayOptions, replay_cassette_async

    return await replay_cassette_async(path, None, ReplayOptions(strict=strict, target=target))


def compare(path: str, target: str) -> list[SessionReport]:
    """One cassette through `target` (order mode) and through its own target, session by session."""
    from replayer.replay import ReplayInputError

    reports: list[SessionReport] = []
    try:
        through = asyncio.run(_replay(path, target, strict=False))
        own = asyncio.run(_replay(path, None, strict=False))
    except ReplayInputError as exc:
        return [SessionReport(path, "-", error=str(exc))]
    recorded = {s.session: s for s in own.sessions}
    for session in through.sessions:
        report = SessionReport(path, session.session)
        report.error = session.skipped or ""
        plan_calls = [d for d in session.accepted if d.kind == "engine-request"]
        report.changed_prompts, report.first_divergence = _first(plan_calls, "engine-request")
        report.changed_replies, report.first_reply = _first(session.accepted, "reply")
        report.generations = _generations(path, session.session)
        report.replies = session.exchanges
        report.target = side_of(session)
        if session.session in recorded:
            report.recorded = side_of(recorded[session.session])
        reports.append(report)
    return reports


def _generations(path: str, name: str) -> int:
    from replayer.reader import read_cassette

    return sum(e.path.endswith("/generate") for e in read_cassette(path).sessions[name].engine)


def _cell(text: str) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= CELL else text[: CELL - 1] + "…"


def table(reports: list[SessionReport], target: str, recorded: str) -> str:
    lines = [f"| cassette | session | engine requests agreeing | first divergence | replies an agent reads "
             f"differently | samples {recorded} → {target} | forks {recorded} → {target} | trained {recorded} → "
             f"{target} | untrained turns {recorded} → {target} |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        name = Path(r.cassette).stem
        if r.error:
            lines.append(f"| {name} | {r.session[:20]} | {_cell(r.error)} | | | | | | |")
            continue
        agree = f"{r.generations - r.changed_prompts}/{r.generations}"
        replies = f"{r.changed_replies}/{r.replies}" + (f": {_cell(r.first_reply)}" if r.first_reply else "")
        untrained_target = "?" if r.target.untrained_turns is None else str(r.target.untrained_turns)
        untrained_recorded = "-" if r.recorded.untrained_turns is None else str(r.recorded.untrained_turns)
        lines.append(
            f"| {name} | {r.session[:20]} | {agree} | {_cell(r.first_divergence) or '-'} | {replies} | "
            f"{r.recorded.samples} → {r.target.samples} | {r.recorded.forks_text()} → {r.target.forks_text()} | "
            f"{r.recorded.trained} → {r.target.trained} | {untrained_recorded} → {untrained_target} |")
    return "\n".join(lines)


def summary(reports: list[SessionReport]) -> str:
    ok = [r for r in reports if not r.error]
    agree = sum(r.generations - r.changed_prompts for r in ok)
    total = sum(r.generations for r in ok)
    replies = sum(r.changed_replies for r in ok)
    same = sum(r.recorded.samples == r.target.samples and r.recorded.trained == r.target.trained for r in ok)
    return (f"{len(reports)} session(s) of {len({r.cassette for r in reports})} cassette(s): engine requests agree "
            f"{agree}/{total}; {replies} repl{'y' if replies == 1 else 'ies'} an agent reads differently; "
            f"samples and trained tokens equal in {same}/{len(ok)} session(s)"
            + (f"; {len(reports) - len(ok)} not replayed" if len(ok) < len(reports) else ""))


def block(paths: list[str], target: str) -> tuple[str, str]:
    """(marker name, the markdown between the markers) for these cassettes through `target`."""
    from replayer.reader import read_header
    from replayer.replay import recorded_target

    cassettes = _expand(paths)
    recorded = sorted({recorded_target(read_header(p)) for p in cassettes}) or ["tito"]
    reports = [r for p in cassettes for r in compare(p, target)]
    marker = f"{'+'.join(recorded)}-through-{target}"
    text = (f"Recorded around **{', '.join(recorded)}**, replayed through **{target}** "
            f"(`tito replay {' '.join(paths)} --target {target} --engine-match order`). {summary(reports)}.\n\n"
            + table(reports, target, "/".join(recorded)))
    return marker, text


def _expand(paths: list[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        path = Path(p)
        out += [str(c) for c in sorted(path.glob("*.tito"))] if path.is_dir() else [p]
    return out


def place(page: str, marker: str, text: str) -> str:
    start, end = f"<!-- conformance:{marker}:start -->", f"<!-- conformance:{marker}:end -->"
    new = f"{start}\n{text}\n{end}"
    if start in page and end in page:
        head, rest = page.split(start, 1)
        _, tail = rest.split(end, 1)
        return head + new + tail
    return page.rstrip("\n") + "\n\n" + new + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replayer.conformance", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="CASSETTE", help="cassettes, or folders of them")
    parser.add_argument("--target", required=True, help="the target to replay through (slime, tito, ...)")
    parser.add_argument("--page", default=str(PAGE), help="the page to write (default docs/conformance.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's table is not what a run gives")
    parser.add_argument("--print", action="store_true", help="print the table, leave the page alone")
    args = parser.parse_args(argv)
    from trajectory.quiet_imports import quiet_transformers

    quiet_transformers()
    marker, text = block(args.paths, args.target)
    if args.print:
        print(text)
        return 0
    page = Path(args.page)
    current = page.read_text(encoding="utf-8") if page.exists() else "# Conformance\n"
    updated = place(current, marker, text)
    if args.check:
        if updated != current:
            print(f"{page}: the {marker} table is out of date; run make conformance", file=sys.stderr)
            return 1
        return 0
    page.write_text(updated, encoding="utf-8")
    print(f"{page}: {marker}: {summary_line(text)}", file=sys.stderr)
    return 0


def summary_line(text: str) -> str:
    return text.split(". ", 1)[1].split("\n", 1)[0] if ". " in text else text[:120]


if __name__ == "__main__":
    sys.exit(main())
