"""`make corpus-table`: the README's corpus table and figures, generated from the committed cassettes.

For each `cassettes/*.tito`: the client(s) from its header, what it pins (its scenario's `description:`, else
the first sentence of the scenario file's header comment), and figures from a replay of it (no GPU, no CLI):
sessions, turns, side turns, samples, forks by reason, the trained-token fraction (tokens with loss 1 over
all tokens of the samples, prompts included: what a trainer spends compute on), and the emitted-token coverage
of its lowest session (trained emitted tokens over emitted tokens: training data lost to realigns or merges shows
below 1.0, in whichever session it is). A
second table sets the reasoning-drop pair side by side (`claude_continue_preserved` vs
`claude_continue_dropped`: the same `--continue` session recorded with and without reasoning preservation); a
missing cassette is said, never guessed. The tables replace the README's lines between its two marker lines
(`START`, `END`).

    python -m tito_rl.replayer.corpus_table            # rewrite README.md's block
    python -m tito_rl.replayer.corpus_table --check    # exit 1 if the README's block is not what the cassettes give
    python -m tito_rl.replayer.corpus_table --print    # the block on stdout, README.md untouched
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tito_rl.trajectory.events import coverage_text

ROOT = Path(__file__).resolve().parent.parent
CASSETTES = ROOT / "cassettes"
README = ROOT / "README.md"
START, END = "<!-- corpus-table:start -->", "<!-- corpus-table:end -->"
PAIR = ("claude_continue_preserved", "claude_continue_dropped")
PINS_WIDTH = 140


class TableError(Exception):
    """The table can not be made or placed; the message is one line."""


@dataclass
class Figures:
    name: str
    clients: str
    pins: str
    sessions: int = 0
    turns: int = 0
    side: int = 0
    samples: int = 0
    forks: Counter[str] = field(default_factory=Counter)
    sample_tokens: int = 0
    trained: int = 0
    emitted: int = 0
    clean: bool = True
    per_session: list[tuple[int, int]] = field(default_factory=list)  # (trained, emitted) of each session

    @property
    def trained_pct(self) -> str:
        return f"{100 * self.trained / self.sample_tokens:.1f}%" if self.sample_tokens else "-"

    @property
    def coverage(self) -> str:
        """The lowest session's emitted-token coverage: a loss in one session of ten is not averaged away."""
        sessions = [(t, e) for t, e in self.per_session if e]
        if not sessions:
            return coverage_text(self.trained, self.emitted)
        over = [s for s in sessions if s[0] > s[1]]  # a token trained twice shows, whichever session it is in
        trained, emitted = max(over, key=_ratio) if over else min(sessions, key=_ratio)
        return coverage_text(trained, emitted)

    @property
    def fork_text(self) -> str:
        return ", ".join(f"{reason} {n}" for reason, n in sorted(self.forks.items())) or "none"


def _ratio(trained_emitted: tuple[int, int]) -> float:
    return trained_emitted[0] / trained_emitted[1]


def clients_of(agent: dict[str, Any] | None) -> str:
    """`claude-code 2.1.330`, `scripted`, or for a mixed recording each CLI and its version."""
    if not agent:
        return "?"
    if agent.get("client") == "mixed":
        return ", ".join(f"{name} {version}" for name, version in sorted(agent.get("agents", {}).items()))
    if agent.get("client") == "scripted":
        return "scripted"
    return f"{agent.get('client')} {agent.get('version', '')}".strip()


def pins_of(scenario: Path) -> str:
    """The scenario's `description:`, else the first sentence of its header comment; one line, bounded."""
    if not scenario.is_file():
        return "(no scenario file)"
    text = scenario.read_text(encoding="utf-8")
    match = re.search(r"^description:\s*(.+)$", text, re.M)
    if match:
        line = match.group(1).strip().strip("'\"")
    else:
        comment = []
        for raw in text.splitlines():
            if not raw.startswith("#"):
                break
            comment.append(raw.lstrip("#").strip())
        line = first_sentence(" ".join(c for c in comment if c))
    line = line.replace("|", "\\|")
    return line if len(line) <= PINS_WIDTH else line[: PINS_WIDTH - 1].rstrip() + "…"


def first_sentence(text: str) -> str:
    """Up to the first . ! or ? that ends a sentence: followed by a space or the end, not inside `code`, not
    an ellipsis or a version's dot."""
    in_code = False
    for i, ch in enumerate(text):
        if ch == "`":
            in_code = not in_code
        elif ch in ".!?" and not in_code and (i + 1 == len(text) or text[i + 1].isspace()) and text[i - 1] != ".":
            return text[: i + 1]
    return text


def figures(path: Path) -> Figures:
    """One cassette, replayed (strict: a session stops at its first difference, and the row says so)."""
    from tito_rl.cassette.reader import read_cassette
    from tito_rl.replayer.replay.cassette_replay import replay_cassette

    header = read_cassette(path).header
    fig = Figures(path.stem, clients_of(header.agent), pins_of(path.parent / "scenarios" / f"{path.stem}.yaml"))
    result = replay_cassette(path)
    for session in result.sessions:
        fig.sessions += 1
        fig.clean &= not session.differences
        counts = session.counts()
        fig.per_session.append((counts["trained"], counts["emitted"]))
        for finish in session.finishes:
            stats = finish.linearization.stats
            fig.turns += stats.turns
            fig.side += stats.side_turns
            fig.samples += stats.samples
            fig.forks.update(stats.forks)
            fig.emitted += stats.emitted_tokens
            for sample in finish.samples:
                fig.sample_tokens += len(sample["tokens"])
                fig.trained += sum(sample["loss_mask"])
    return fig


def corpus_table(rows: list[Figures]) -> list[str]:
    lines = [
        "| cassette | client | pins | sessions | turns | side turns | samples | forks by reason | "
        "trained / sample tokens | emitted-token coverage (lowest session) |",
        "|---|---|---|--:|--:|--:|--:|---|--:|--:|",
    ]
    for f in rows:
        name = f"`{f.name}`" + ("" if f.clean else " (does not replay clean)")
        lines.append(
            f"| {name} | {f.clients} | {f.pins} | {f.sessions} | {f.turns} | {f.side} | {f.samples} | "
            f"{f.fork_text} | {f.trained_pct} | {f.coverage} |"
        )
    return lines


def pair_table(by_name: dict[str, Figures]) -> list[str]:
    missing = [n for n in PAIR if n not in by_name]
    if missing:
        return [
            f"Reasoning-drop pair: {', '.join(f'cassettes/{n}.tito' for n in missing)} not recorded yet, "
            "so no figures (nothing is estimated)."
        ]
    lines = [
        "| reasoning-drop pair: one `--continue` session | cassette | samples | forks by reason | sample tokens | "
        "trained tokens | trained / sample tokens |",
        "|---|---|--:|---|--:|--:|--:|",
    ]
    labels = ("earlier reasoning preserved", "dropped (the Qwen3 template's rendering)")
    for label, name in zip(labels, PAIR, strict=True):
        f = by_name[name]
        lines.append(
            f"| {label} | `{name}` | {f.samples} | {f.fork_text} | {f.sample_tokens} | {f.trained} | {f.trained_pct} |"
        )
    return lines


def block(cassettes: Path = CASSETTES) -> list[str]:
    """The generated lines that go between the markers (the markers excluded)."""
    paths = sorted(cassettes.glob("*.tito"))
    if not paths:
        raise TableError(f"no cassettes in {cassettes}")
    rows = [figures(p) for p in paths]
    return [*corpus_table(rows), "", *pair_table({f.name: f for f in rows})]


def split_readme(text: str, readme: Path) -> tuple[str, str, str]:
    """The text before the start marker (included), the block, and the text from the end marker on."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise TableError(f"{readme}: needs one line {START} and, after it, one line {END} around the table")
    head, rest = text.split(START, 1)
    body, tail = rest.split(END, 1)
    return head + START + "\n", body.strip("\n"), END + tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.replayer.corpus_table", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md's table is out of date")
    parser.add_argument("--print", action="store_true", help="print the block; leave README.md alone")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--cassettes", type=Path, default=CASSETTES)
    args = parser.parse_args(argv)
    try:
        text = "" if args.print else args.readme.read_text(encoding="utf-8")
        head, old, tail = ("", "", "") if args.print else split_readme(text, args.readme)
        new = "\n".join(block(args.cassettes))
    except (TableError, OSError) as exc:
        print(f"corpus-table: {exc}", file=sys.stderr)
        return 1
    if args.print:
        print(new)
        return 0
    if args.check:
        if old == new:
            print(f"corpus-table: {args.readme.name} is up to date")
            return 0
        print(
            f"corpus-table: {args.readme.name}'s table differs from the cassettes; run `make corpus-table`",
            file=sys.stderr,
        )
        return 1
    args.readme.write_text(head + new + "\n" + tail, encoding="utf-8")
    print(f"corpus-table: wrote {len(new.splitlines())} lines into {args.readme.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
