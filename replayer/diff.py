"""`tito diff A B`, or `tito diff A --<what-if option>...`: what two cassettes, or a cassette and a candidate
change, make of the training data.

Both sides are replayed through the current adapter and manager (differences from the recordings noted, not
failed), and each session present on both sides is compared: samples, forks by reason, trained tokens, and
the first divergence between the two sample lists (sample, field, token index, its turn, the decoded text
around it). Sessions are matched by name; a session on one side only is listed as such. Exit 0 when
nothing differs, 1 when something does (as diff(1)), 2 when an input cannot be replayed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from replayer import whatif
from replayer.differences import samples_difference, turn_locator
from replayer.results import CassetteResult, SessionResult
from trajectory.events import coverage_text

EXIT_SAME, EXIT_DIFFERENT, EXIT_UNUSABLE = 0, 1, 2


@dataclass
class SessionDiff:
    session: str
    a: SessionResult | None
    b: SessionResult | None
    divergence: tuple[str, list[str], int | None] | None = None

    @property
    def differs(self) -> bool:
        if self.a is None or self.b is None:
            return True
        return self.divergence is not None or _figures(self.a) != _figures(self.b)


def _figures(result: SessionResult) -> tuple[int, dict[str, int], int, str]:
    counts = result.counts()
    return counts["samples"], counts["forks"], counts["trained"], coverage_text(counts["trained"], counts["emitted"])


def _samples(result: SessionResult) -> list[dict[str, Any]]:
    return [s for f in result.finishes for s in f.samples]


def compare(a: CassetteResult, b: CassetteResult, decode: Any) -> list[SessionDiff]:
    """Per session, in A's order then B's extras."""
    left = {s.session: s for s in a.sessions}
    right = {s.session: s for s in b.sessions}
    out = []
    for name in list(left) + [n for n in right if n not in left]:
        sa, sb = left.get(name), right.get(name)
        diff = SessionDiff(name, sa, sb)
        if sa is not None and sb is not None:
            spans = turn_locator([sp for f in sb.finishes for sp in f.linearization.spans])
            diff.divergence = samples_difference(_samples(sa), _samples(sb), decode, spans, ("A", "B"))
        out.append(diff)
    return out


def render(diffs: list[SessionDiff], label_a: str, label_b: str) -> list[str]:
    lines = [f"A: {label_a}", f"B: {label_b}"]
    for d in diffs:
        if d.a is None or d.b is None:
            lines.append(f"{d.session}  only in {'B' if d.a is None else 'A'}")
            continue
        (na, fa, ta, ca), (nb, fb, tb, cb) = _figures(d.a), _figures(d.b)
        forks_a = ",".join(f"{k}:{v}" for k, v in fa.items()) or "none"
        forks_b = ",".join(f"{k}:{v}" for k, v in fb.items()) or "none"
        verdict = "same" if not d.differs else "differs"
        lines.append(f"{d.session}  samples {na} -> {nb}  forks {forks_a} -> {forks_b}  trained {ta} -> {tb}  "
                     f"coverage {ca} -> {cb}  {verdict}")
        if d.divergence is not None:
            summary, detail, turn = d.divergence
            lines.append(f"    first divergence: {summary}" + (f" (turn {turn})" if turn is not None else ""))
            lines += ["      " + line for line in detail]
    changed = sum(d.differs for d in diffs)
    lines.append(f"{len(diffs)} session(s): {changed} differ")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="a cassette")
    parser.add_argument("b", metavar="B", nargs="?", help="another cassette; without it, A under the what-if options")
    parser.add_argument("--session", action="append", default=None, metavar="NAME", help="compare only this session")
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the recordings')")
    whatif.register(parser.add_argument, engine_match=False)  # both sides are served in recorded order


def run(args: argparse.Namespace) -> int:
    from replayer.replay import ReplayInputError, ReplayOptions, replay_cassette_async, run_sync
    from trajectory.tokenizer import load_tokenizer

    def option(name: str) -> Any:
        return getattr(args, name)

    try:
        adapter, manager = whatif.overrides(option)
    except ValueError as exc:
        return _unusable(str(exc))
    if args.b is None and not (adapter or manager):
        return _unusable("give a second cassette, or a what-if option to compare A with")
    if args.b is not None and (adapter or manager):
        return _unusable("what-if options compare A with a candidate: give them without B")
    baseline = ReplayOptions(strict=False, tokenizer=args.tokenizer)
    candidate = ReplayOptions(strict=False, tokenizer=args.tokenizer, adapter=adapter, manager=manager)
    try:
        a = run_sync(replay_cassette_async(args.a, args.session, baseline, missing_ok=args.b is not None))
        b = run_sync(replay_cassette_async(args.b or args.a, args.session, baseline if args.b else candidate,
                                           missing_ok=args.b is not None))
    except ReplayInputError as exc:
        return _unusable(str(exc))
    tokenizer = load_tokenizer(a.tokenizer_dir)
    diffs = compare(a, b, lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
    label_b = args.b or f"{args.a} under {' '.join(_flags(args))}"
    for line in render(diffs, args.a, label_b):
        print(line)
    return EXIT_DIFFERENT if any(d.differs for d in diffs) else EXIT_SAME


def _flags(args: argparse.Namespace) -> list[str]:
    flags = []
    for name in ("chat_template", "reasoning_parser", "tool_parser", "fork_threshold"):
        if getattr(args, name) is not None:
            flags.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    if args.no_preserve_reasoning:
        flags.append("--no-preserve-reasoning")
    if args.no_splice:
        flags.append("--no-splice")
    return flags


def _unusable(message: str) -> int:
    print(f"tito diff: {message}", file=sys.stderr)
    return EXIT_UNUSABLE
