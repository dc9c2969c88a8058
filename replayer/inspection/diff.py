"""`tito diff A B`, or `tito diff A --<what-if option>...`: what two cassettes, or a cassette and a candidate
change, make of the training data.

Both sides are replayed through the current adapter and manager (differences from the recordings noted, not
failed), and each session present on both sides is compared: samples, forks by reason, trained tokens, and
the first divergence between the two sample lists (sample, field, token index, its turn, the decoded text
around it). Sessions are matched by name, after the pairs `--pair A_SESSION=B_SESSION` names; two cassettes of
one session each are paired whatever their names (two recordings of one scenario are two live sessions). A
session on one side only is listed as such. Exit 0 when nothing differs, 1 when something does (as diff(1)),
2 when an input cannot be replayed.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from typing import Any

from tito_rl.recorder.targets.profiles.trust import TRUST_HELP
from tito_rl.replayer.comparison.differences import samples_difference, turn_locator
from tito_rl.replayer.replay import whatif
from tito_rl.replayer.replay.results import CassetteResult, SessionResult
from tito_rl.trajectory.events import coverage_text

EXIT_SAME, EXIT_DIFFERENT, EXIT_UNUSABLE = 0, 1, 2


@dataclass
class SessionDiff:
    session: str  # A's name; `A = B` when paired across names
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


def pairing(a: list[str], b: list[str], pairs: dict[str, str]) -> list[tuple[str | None, str | None]]:
    """(A session, B session) in A's order then B's extras: `pairs` first, then equal names; two one-session
    sides with no name in common are one pair."""
    if not pairs and len(a) == 1 and len(b) == 1 and a != b:
        pairs = {a[0]: b[0]}
    taken = set(pairs.values())
    out: list[tuple[str | None, str | None]] = []
    for name in a:
        other = pairs.get(name, name if name in b and name not in taken else None)
        out.append((name, other))
    matched = {other for _, other in out if other is not None}
    return out + [(None, name) for name in b if name not in matched]


def compare(
    a: CassetteResult, b: CassetteResult, decode: Any, pairs: dict[str, str] | None = None
) -> list[SessionDiff]:
    """Per session pair (`pairing`), in A's order then B's extras."""
    left = {s.session: s for s in a.sessions}
    right = {s.session: s for s in b.sessions}
    out = []
    for name_a, name_b in pairing(list(left), list(right), pairs or {}):
        sa, sb = left.get(name_a or ""), right.get(name_b or "")
        name = name_a if name_b in (None, name_a) else name_b if name_a is None else f"{name_a} = {name_b}"
        diff = SessionDiff(name or "", sa, sb)
        if sa is not None and sb is not None:
            spans = turn_locator([sp for f in sb.finishes for sp in f.linearization.spans])
            diff.divergence = samples_difference(
                _samples(sa), _samples(sb), decode, spans, ("A", "B"), channels_both_ways=True
            )
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
        lines.append(
            f"{d.session}  samples {na} -> {nb}  forks {forks_a} -> {forks_b}  trained {ta} -> {tb}  "
            f"coverage {ca} -> {cb}  {verdict}"
        )
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
    parser.add_argument(
        "--pair",
        action="append",
        default=[],
        metavar="A_SESSION=B_SESSION",
        help="compare A's session with B's of another name (repeatable; two cassettes of one "
        "session each are paired without it)",
    )
    parser.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder (default: the recordings')")
    parser.add_argument(
        "--target",
        metavar="TARGET",
        help="replay both sides through this target, as tito replay's --target (your gateway profile file for "
        "cassettes recorded through one; default: each one's recorded target where it is tito or a driver "
        "installed here)",
    )
    parser.add_argument("--trust-cassette", action="store_true", help=TRUST_HELP)
    whatif.register(parser.add_argument, engine_match=False)  # both sides are served in recorded order


def run(args: argparse.Namespace) -> int:
    from tito_rl.replayer.replay.cassette_replay import replay_cassette_async, run_sync
    from tito_rl.replayer.replay.loading import ReplayInputError
    from tito_rl.replayer.replay.options import ReplayOptions
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

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
    try:
        pairs = parse_pairs(args.pair)
    except ValueError as exc:
        return _unusable(str(exc))
    if pairs and args.b is None:
        return _unusable("--pair pairs the sessions of two cassettes: give B")
    baseline = ReplayOptions(
        strict=False, tokenizer=args.tokenizer, target=args.target, trust_cassette=args.trust_cassette
    )
    candidate = replace(baseline, adapter=adapter, manager=manager)
    wanted_a = args.session and args.session + list(pairs)
    wanted_b = args.session and args.session + list(pairs.values())
    try:
        a = run_sync(replay_cassette_async(args.a, wanted_a, baseline, missing_ok=args.b is not None))
        b = run_sync(
            replay_cassette_async(
                args.b or args.a, wanted_b, baseline if args.b else candidate, missing_ok=args.b is not None
            )
        )
    except ReplayInputError as exc:
        return _unusable(str(exc))
    for side, result, names in (("A", a, list(pairs)), ("B", b, list(pairs.values()))):
        unknown = [n for n in names if n not in result.all_sessions]
        if unknown:
            return _unusable(f"--pair: no session {', '.join(map(repr, unknown))} in {side} ({result.path})")
    tokenizer = load_tokenizer(a.tokenizer_dir)
    diffs = compare(a, b, lambda ids: tokenizer.decode(ids, skip_special_tokens=False), pairs)
    label_b = args.b or f"{args.a} under {' '.join(_flags(args))}"
    for line in render(diffs, args.a, label_b):
        print(line)
    return EXIT_DIFFERENT if any(d.differs for d in diffs) else EXIT_SAME


def parse_pairs(values: list[str]) -> dict[str, str]:
    """`A_SESSION=B_SESSION` strings as {A: B}; ValueError with a one-line reason."""
    pairs: dict[str, str] = {}
    for value in values:
        left, sep, right = value.partition("=")
        if not sep or not left or not right:
            raise ValueError(f"--pair {value!r}: expected A_SESSION=B_SESSION")
        if left in pairs or right in pairs.values():
            raise ValueError(f"--pair {value!r}: a session is in two pairs")
        pairs[left] = right
    return pairs


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
