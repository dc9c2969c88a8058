"""`make conformance`: one corpus, many gateways. The committed cassettes replayed through another target.

Each cassette goes through the other target in `--engine-match order` mode (every exchange is served its own
recorded generation, so a gateway that renders differently still gets the same model outputs). Per session it
reports what a gateway team acts on: do the prompts (input_ids) agree with the recording's (the first
divergence, decoded), which sampling params differ, which replies differ in a way an agent would notice (text,
reasoning, tool calls, stop reason, status; never ids), and each side's samples, forks by reason, trained tokens
and turns left untrained. The recorded side comes from a replay through tito's adapter for a cassette recorded
through it, and from the cassette's golden (its target's own figures, pinned by a replay through that target)
for a cassette recorded around another target, so the table is the same whether or not that target is
installed here. `docs/conformance.md` holds the tables between their markers; the findings written above
them are kept.

    python -m tito_rl.replayer.conformance --target slime cassettes/                # rewrite the slime table
    python -m tito_rl.replayer.conformance --target tito cassettes/targets/slime_mixed.tito  # recorded around slime
    python -m tito_rl.replayer.conformance --target tito cassettes/targets/slime_mixed.tito --check  # stale: 1
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import logging
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tito_rl.trajectory.dialects.registry import is_generation

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "conformance.md"
CELL = 130
TITO = "tito"
WIRES = (
    ("/v1/messages", "Anthropic"),
    ("/v1/chat/completions", "Chat"),
    ("/v1/responses", "Responses"),
    ("/v1beta/", "Gemini"),
)


@dataclass
class Side:
    """One target's training data for a session."""

    samples: int = 0
    forks: Counter[str] = field(default_factory=Counter)
    trained: int = 0
    untrained_turns: int | None = None  # generated turns none of whose output is trained; None: not known
    realigns: int = 0
    merges: int = 0
    finishes: int = 0  # none: the session was dropped or never finished, so there is nothing to train

    def forks_text(self) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(self.forks.items())) or "none"

    def untrained_text(self) -> str:
        if not self.finishes:
            return "-"
        return "?" if self.untrained_turns is None else str(self.untrained_turns)

    def why_untrained(self) -> str:
        """The decisions that leave turns untrained, where the target says (realigns, rewrite merges)."""
        reasons = [f"{n} {what}" for n, what in ((self.realigns, "realign"), (self.merges, "merge")) if n]
        return ", ".join(f"{r}{'s' if not r.startswith('1 ') else ''}" for r in reasons)


@dataclass
class SessionReport:
    cassette: str
    session: str
    client: str = ""
    generations: int = 0  # recorded /generate calls
    not_made: int = 0  # recorded generations the target never asked for (it answered without the engine)
    changed_prompts: int = 0  # generations whose input_ids differ
    first_divergence: str = ""
    extra: int = 0  # generations the target asked for where the recording has none to serve
    sampling: dict[tuple[str, str], list[str]] = field(default_factory=dict)  # (param, replayed) -> recorded values
    replies: int = 0
    changed_replies: int = 0
    reply_aspects: Counter[str] = field(default_factory=Counter)  # text, reasoning, tool calls, stop reason, status
    first_reply: str = ""
    not_comparable: int = 0  # replies to exchanges where the target generated what the recording cannot serve
    recorded: Side = field(default_factory=Side)
    target: Side = field(default_factory=Side)
    error: str = ""

    @property
    def agreeing(self) -> int:
        return self.generations - self.not_made - self.changed_prompts


# ---- reading a replay's results -----------------------------------------------------------------------------


def side_of(session: Any) -> Side:
    """A replayed session's training data: a foreign target's from what its driver said, tito's from its spans."""
    side = Side(finishes=len(session.finishes))
    for finish in session.finishes:
        stats = finish.linearization.stats
        side.samples += stats.samples
        side.forks.update(stats.forks)
        side.trained += stats.trained_tokens
        side.realigns += stats.realigns
        side.merges += stats.merges
        if finish.tree.get("target"):
            known = finish.tree.get("untrained_turns")
            side.untrained_turns = None if known is None else (side.untrained_turns or 0) + known
        else:
            trained = {s.turn_index for spans in finish.linearization.spans for s in spans if s.trained}
            side.untrained_turns = (side.untrained_turns or 0) + max(0, stats.turns - len(trained))
    return side


def golden_sides(path: str) -> dict[str, Side]:
    """Per session, the recorded target's figures as the cassette's golden pins them (`stats (target ...)`)."""
    from tito_rl.replayer.goldens.files import golden_path, parse
    from tito_rl.trajectory.golden import parse_target_stats

    golden = golden_path(path)
    if not golden.is_file():
        return {}
    _, sections = parse(golden.read_text(encoding="utf-8"))
    sides: dict[str, Side] = {}
    for name, text in sections.items():
        side = sides[name] = Side()
        for line in text.splitlines():
            if not line.startswith("stats (target "):
                continue
            figures = parse_target_stats(line.split("): ", 1)[1])
            side.finishes += 1
            side.samples += figures.get("samples", 0)
            side.forks.update(figures.get("forks", {}))
            side.trained += figures.get("trained", 0)
            side.realigns += figures.get("realigns", 0)
            side.merges += figures.get("merges", 0)
            if "untrained_turns" in figures:
                side.untrained_turns = (side.untrained_turns or 0) + figures["untrained_turns"]
    return sides


def live_side(log: Any) -> Side:
    """The samples the live run stored, where nothing else says more (no golden)."""
    samples = log.samples
    return Side(
        samples=len(samples), trained=sum(sum(s.get("loss_mask") or []) for s in samples), finishes=len(log.finishes)
    )


DIVERGENCE = re.compile(r" \| (?P<after>.*?)  \(ids from")
SAMPLING = re.compile(r"^(?:sampling params also differ: )?(?P<key>\w+): recorded (?P<a>.*), replayed (?P<b>.*)$")


def _short(text: str, limit: int = 28) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _divergence_cell(difference: Any) -> str:
    """`exchange 0, token 17 (message 0, system; 11676 → 11681 tokens): '.\nYou are' → '.\n\nYou are'`."""
    match = re.search(r"input_ids at token (\d+) \(recorded (\d+) tokens, replayed (\d+)\)", difference.summary)
    if match is None:
        return f"exchange {difference.exchange}: {difference.summary}"
    token, recorded, replayed = match.groups()
    sides = [m.group("after") for line in difference.detail[:2] if (m := DIVERGENCE.search(line))]
    where = next((line for line in difference.detail if line.startswith("in rendered message")), "")
    role = re.match(r"in rendered message (\d+) \((\w+)\)", where)
    place = [f"message {role.group(1)}, {role.group(2)}"] if role else []
    place.append(f"{recorded} → {replayed} tokens" if recorded != replayed else f"{recorded} tokens")
    text = f"exchange {difference.exchange}, token {token} ({'; '.join(place)})"
    return text + (f": {_short(sides[0])} → {_short(sides[1])}" if len(sides) == 2 else "")


def _sampling(differences: list[Any]) -> dict[tuple[str, str], list[str]]:
    """(param, replayed value) -> the recorded values, one per generation that differs in it."""
    found: dict[tuple[str, str], list[str]] = {}
    for difference in differences:
        for line in difference.detail:
            match = SAMPLING.match(line)
            if match:
                found.setdefault((match["key"], match["b"]), []).append(match["a"])
    return found


def _sampling_text(found: dict[tuple[str, str], list[str]]) -> str:
    """`max_new_tokens 28813–29302 → 4096 (×7)`: a client that sizes max_tokens per request gives a range."""
    parts = []
    for (key, replayed), recorded in sorted(found.items()):
        values = sorted(
            set(recorded), key=lambda v: (not v.lstrip("-").isdigit(), int(v) if v.lstrip("-").isdigit() else 0, v)
        )
        shown = (
            values[0]
            if len(values) == 1
            else f"{values[0]}–{values[-1]}"
            if all(v.lstrip("-").isdigit() for v in values)
            else "/".join(values)
        )
        parts.append(f"{key} {shown} → {replayed} (×{len(recorded)})")
    return "; ".join(parts)


def _wire_path(path: str) -> str:
    """The path without a gateway's session in the URL (rllm's `/sessions/{sid}`, Agent Lightning's
    `/proxy/rollout/{rid}/attempt/{aid}/mode/{mode}/openai`): the wire is what follows, from its `/v1`."""
    at = path.find("/v1")
    return path[at:] if at > 0 else path


def _client(log: Any, header_agent: dict[str, Any]) -> str:
    """Who sent the session's requests and on which wire: `claude-cli/2.1.330, Anthropic SSE`."""
    first = log.agent[0] if log.agent else None
    if first is None:
        return str(header_agent.get("client") or "?")
    agent = next((v for k, v in first.headers.items() if k.lower() == "user-agent"), "")
    who = agent.split(" ", 1)[0] if agent and not agent.startswith("tito-scripted-client") else "scripted"
    paths = Counter(_wire_path(a.path) for a in log.agent)
    main = paths.most_common(1)[0][0]
    wire = next((name for prefix, name in WIRES if main.startswith(prefix)), main)
    framing = {
        ("SSE" if a.reply_events is not None else "JSON")
        for a in log.agent
        if _wire_path(a.path) == main and a.status == 200
    }
    return f"{who}, {wire} {'+'.join(sorted(framing)) or ''}".rstrip()


# ---- comparing --------------------------------------------------------------------------------------------


async def _replay(path: str, target: str | None) -> Any:
    from tito_rl.replayer.replay.cassette_replay import replay_cassette_async
    from tito_rl.replayer.replay.options import ReplayOptions

    return await replay_cassette_async(path, None, ReplayOptions(strict=False, target=target))


def compare(path: str, target: str) -> list[SessionReport]:
    """One cassette through `target` (order mode), next to what its recorded target gave, session by session."""
    from tito_rl.cassette.reader import read_cassette
    from tito_rl.replayer.replay.loading import ReplayInputError, TargetUnavailableError, recorded_target

    cassette = read_cassette(path)
    try:
        through = asyncio.run(_replay(path, target))
        if recorded_target(cassette.header) == TITO:
            own = asyncio.run(_replay(path, None))
            recorded = {s.session: side_of(s) for s in own.sessions}
        else:  # the target it was recorded around, as its golden pins it (that target need not be installed)
            recorded = golden_sides(path)
    except TargetUnavailableError:
        raise  # the whole table would be this one line: main says it once
    except ReplayInputError as exc:
        return [SessionReport(path, "-", error=str(exc))]
    reports: list[SessionReport] = []
    for session in through.sessions:
        log = cassette.sessions[session.session]
        report = SessionReport(path, session.session, _client(log, cassette.header.agent or {}))
        report.error = session.skipped or ""
        requests = [d for d in session.accepted if d.kind == "engine-request"]
        prompts = [d for d in requests if "input_ids at token" in d.summary]
        report.changed_prompts = len(prompts)
        report.first_divergence = _divergence_cell(prompts[0]) if prompts else ""
        report.sampling = _sampling(requests)
        report.generations = sum(is_generation(e.path) for e in log.engine)
        report.not_made = session.generations_not_made
        extra = {
            d.exchange
            for d in session.accepted
            if d.kind == "engine-calls" and d.summary.startswith("the target called")
        }
        report.extra = sum(
            d.kind == "engine-calls" and d.summary.startswith("the target called") for d in session.accepted
        )
        replies = [d for d in session.accepted if d.kind == "reply" and d.exchange not in extra]
        report.not_comparable = sum(d.kind == "reply" and d.exchange in extra for d in session.accepted)
        report.replies, report.changed_replies = session.exchanges - report.not_comparable, len(replies)
        for difference in replies:
            report.reply_aspects.update(line.split(":", 1)[0] for line in difference.detail)
        if replies:
            report.first_reply = f"exchange {replies[0].exchange}: " + "; ".join(replies[0].detail)
        report.target = side_of(session)
        report.recorded = recorded.get(session.session) or live_side(log)
        reports.append(report)
    return reports


# ---- the table --------------------------------------------------------------------------------------------


def _cell(text: str, limit: int = CELL) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _counted(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def row(r: SessionReport) -> str:
    name = Path(r.cassette).stem
    if r.error:
        return f"| {name} | {r.session[:20]} | {r.client} | {_cell(r.error)} | | | |"
    prompts = f"{r.agreeing}/{r.generations}" + (f" ({r.not_made} not sent)" if r.not_made else "")
    if r.extra:
        prompts += f"; {r.extra} more the recording has no generation for"
    sampling = _sampling_text(r.sampling) or "same"
    replies = f"{r.changed_replies}/{r.replies}"
    if r.changed_replies:
        replies += f" ({_counted(r.reply_aspects)}); first: {r.first_reply}"
    if r.not_comparable:
        replies += f"; {r.not_comparable} not comparable (its generation is not in the recording)"
    return (
        f"| {name} | {r.session[:20]} | {r.client} | {prompts} | {_cell(r.first_divergence) or '-'} | "
        f"{_cell(sampling)} | {_cell(replies, 2 * CELL)} |"
    )


def table(reports: list[SessionReport], target: str, recorded: str) -> str:
    """Prompts and replies only: what a replay measures exactly. A replay through another gateway re-sends the
    agent requests recorded against the first one (their histories echo its replies), so what the second gateway
    would train from its own replies is the live table's (`replayer/live_conformance.py`), not this one's."""
    lines = [
        f"| cassette | session | client, wire | prompts agreeing | first prompt divergence ({recorded} → "
        f"{target}) | sampling params that differ | replies an agent reads differently |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [row(r) for r in reports]
    return "\n".join(lines)


def summary(reports: list[SessionReport]) -> str:
    ok = [r for r in reports if not r.error]
    agree = sum(r.agreeing for r in ok)
    total = sum(r.generations for r in ok)
    not_made = sum(r.not_made for r in ok)
    sampling = sum(bool(r.sampling) for r in ok)
    extra = sum(r.extra for r in ok)
    replies = sum(r.changed_replies for r in ok)
    exchanges = sum(r.replies for r in ok)
    return (
        f"{len(reports)} session(s) of {len({r.cassette for r in reports})} cassette(s): prompts agree in "
        f"{agree}/{total} generations"
        + (f" ({not_made} never sent)" if not_made else "")
        + (f", {extra} more generation(s) the recordings cannot serve" if extra else "")
        + f"; sampling params differ in {sampling} session(s); {replies}/{exchanges} replies an agent reads "
        "differently" + (f"; {len(reports) - len(ok)} not replayed" if len(ok) < len(reports) else "")
    )


def block(paths: list[str], target: str) -> tuple[str, str]:
    """(marker name, the markdown between the markers) for these cassettes through `target`."""
    from tito_rl.cassette.reader import read_header
    from tito_rl.replayer.replay.loading import recorded_target

    cassettes = expand(paths)
    recorded = sorted({recorded_target(read_header(p)) for p in cassettes}) or [TITO]
    reports = [r for p in cassettes for r in compare(p, target)]
    marker = f"{'+'.join(recorded)}-through-{target}"
    shown = " ".join(_relative(p) for p in paths)
    text = (
        f"Recorded around **{', '.join(recorded)}**, replayed through **{target}** "
        f"(`tito replay {shown} --target {target} --engine-match order`). {summary(reports)}.\n\n"
        + table(reports, target, "/".join(recorded))
    )
    return marker, text


def _relative(path: str) -> str:
    resolved = Path(path).resolve()
    text = str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else path
    return text + "/" if Path(path).is_dir() else text


def expand(paths: list[str]) -> list[str]:
    """Cassettes, and the cassettes directly in folders (as `tito replay FOLDER` takes them: not recursive)."""
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
    parser = argparse.ArgumentParser(prog="python -m tito_rl.replayer.conformance", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", metavar="CASSETTE", help="cassettes, or folders of them")
    parser.add_argument("--target", required=True, help="the target to replay through (slime, tito, ...)")
    parser.add_argument("--page", default=str(PAGE), help="the page to write (default docs/conformance.md)")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's table is not what a run gives")
    parser.add_argument("--print", action="store_true", help="print the table, leave the page alone")
    args = parser.parse_args(argv)
    from tito_rl.recorder.targets.base import TargetError
    from tito_rl.replayer.replay.loading import TargetUnavailableError
    from tito_rl.trajectory.runtime.quiet_imports import quiet_transformers

    quiet_transformers()
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        print(f"conformance: no such cassette or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    logging.disable(logging.ERROR)  # the gateway's own log of the failures the table reports
    try:
        check_target(args.target)
        marker, text = block(args.paths, args.target)
    except (TargetError, TargetUnavailableError) as exc:
        print(f"conformance: {exc}", file=sys.stderr)
        return 2
    finally:
        logging.disable(logging.NOTSET)
    if args.print:
        print(text)
        return 0
    page = Path(args.page)
    current = page.read_text(encoding="utf-8") if page.exists() else "# Conformance\n"
    updated = place(current, marker, text)
    if args.check:
        if updated != current:
            diff = difflib.unified_diff(current.splitlines(), updated.splitlines(), lineterm="", n=0)
            changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
            print(
                f"{page}: the {marker} table is out of date; run make conformance\n" + "\n".join(changed[:6]),
                file=sys.stderr,
            )
            return 1
        return 0
    page.write_text(updated, encoding="utf-8")
    print(f"{page}: {marker}: {summary_line(text)}", file=sys.stderr)
    return 0


def check_target(target: str) -> None:
    """A target this module can replay through, loadable here: `TargetError` (one line) otherwise, once."""
    from tito_rl.recorder.targets.base import TargetError, TargetOptions
    from tito_rl.recorder.targets.registry import create_driver, parse_target

    spec = parse_target(target)
    if spec.kind == "http":
        raise TargetError(
            f"{target}: a running gateway needs its engine leg served at a fixed address; use "
            "tito replay CASSETTES --target URL --engine-listen HOST:PORT --engine-match order"
        )
    if spec.kind == "driver":
        create_driver(target, TargetOptions())  # imports the gateway's code; starts nothing


def summary_line(text: str) -> str:
    return text.split(". ", 1)[1].split("\n", 1)[0] if ". " in text else text[:120]


if __name__ == "__main__":
    sys.exit(main())
