"""How a golden diff reads: what changed inside a changed line, colour on a terminal, and the cut.

Golden lines are long (a sample's stats, a run of 20 tokens), so a bare `-`/`+` pair leaves the reader to
spot the one changed number. A changed pair gets a `?` line under it in word-diff form, `[-old-]{+new+}`,
with the unchanged text around each change folded to a few tokens, which survives line wrapping and copy
and paste; on a colour terminal the changed tokens are highlighted in place instead. A diff longer than
`limit` lines is cut, naming the flag that shows it whole.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

MAX_DIFF_LINES = 80
CONTEXT_CHARS = 24  # unchanged text kept on each side of a change in a `?` line
PAIR_RATIO = 0.4  # a removed and an added line this similar (tokens) are one changed line
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")

RED, GREEN, CYAN, BOLD, REVERSE, RESET = "\x1b[31m", "\x1b[32m", "\x1b[36m", "\x1b[1m", "\x1b[7m", "\x1b[0m"


@dataclass(frozen=True)
class DiffStyle:
    color: bool = False
    full: bool = False  # no cut
    limit: int = MAX_DIFF_LINES
    more: str = "--full-diff shows it whole"  # how to see what was cut, in this front end's words


PLAIN = DiffStyle()


def use_color(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything (no-color.org)."""
    environ = os.environ if environ is None else environ
    return bool(getattr(stream, "isatty", lambda: False)()) and not environ.get("NO_COLOR")


def render(diff: list[str], style: DiffStyle) -> list[str]:
    """A unified diff (`files.unified_diff`), cut unless `style.full`, with within-line marks."""
    lines, cut = (diff, 0) if style.full or len(diff) <= style.limit else (diff[: style.limit], len(diff) - style.limit)
    out = _colored(lines) if style.color else _marked(lines)
    if cut:
        out.append(f"… {cut} more diff line(s) cut; {style.more}")
    return out


def tokens(line: str) -> list[str]:
    return _TOKEN.findall(line)


def changed_spans(old: str, new: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]] | None:
    """Character spans that differ in `old` and in `new`, by tokens; None when the lines are not alike."""
    a, b = tokens(old), tokens(new)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    if matcher.ratio() < PAIR_RATIO:
        return None
    starts_a, starts_b = _offsets(a), _offsets(b)
    spans_a, spans_b = [], []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if i2 > i1:
            spans_a.append((starts_a[i1], starts_a[i2]))
        if j2 > j1:
            spans_b.append((starts_b[j1], starts_b[j2]))
    return spans_a, spans_b


def word_diff(old: str, new: str, context: int = CONTEXT_CHARS) -> str:
    """`old` to `new` as one line: `[-removed-]{+added+}`, unchanged runs folded to `context` characters."""
    a, b = tokens(old), tokens(new)
    ops = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    parts: list[str] = []
    for k, (tag, i1, i2, j1, j2) in enumerate(ops):
        if tag != "equal":
            parts += [f"[-{''.join(a[i1:i2])}-]" if i2 > i1 else "", f"{{+{''.join(b[j1:j2])}+}}" if j2 > j1 else ""]
            continue
        run = "".join(a[i1:i2])
        head = "" if k == 0 else _keep(a[i1:i2], context)  # after the previous change
        tail = "" if k == len(ops) - 1 else _keep(a[i1:i2][::-1], context, reverse=True)  # before the next
        parts.append(run if len(head) + len(tail) + 1 >= len(run) else f"{head}…{tail}")
    return "".join(parts)


def _keep(run: list[str], chars: int, reverse: bool = False) -> str:
    """Tokens from the start of `run` (from its end: `reverse`, run given reversed): about `chars` characters,
    ending at a space where one comes soon enough."""
    kept: list[str] = []
    size = 0
    for token in run:
        if size >= chars and (token.isspace() or size >= 2 * chars):
            break
        kept.append(token)
        size += len(token)
    return "".join(kept[::-1] if reverse else kept)


def _offsets(toks: list[str]) -> list[int]:
    out, at = [], 0
    for t in toks:
        out.append(at)
        at += len(t)
    return out + [at]


def _blocks(lines: list[str]) -> list[tuple[str, Any]]:
    """('line', text) for headers, hunks and context; ('change', (removed, added)) for each run of -/+ lines."""
    out: list[tuple[str, Any]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("---", "+++")) and i < 2:
            out.append(("line", line))
            i += 1
            continue
        if line.startswith(("-", "+")):
            removed, added = [], []
            while i < len(lines) and lines[i].startswith("-"):
                removed.append(lines[i][1:])
                i += 1
            while i < len(lines) and lines[i].startswith("+"):
                added.append(lines[i][1:])
                i += 1
            out.append(("change", (removed, added)))
            continue
        out.append(("line", line))
        i += 1
    return out


def _marked(lines: list[str]) -> list[str]:
    out: list[str] = []
    for kind, value in _blocks(lines):
        if kind == "line":
            out.append(value)
            continue
        removed, added = value
        out += ["-" + r for r in removed]
        for n, new in enumerate(added):
            out.append("+" + new)
            if n < len(removed) and changed_spans(removed[n], new) is not None:
                out.append("?" + word_diff(removed[n], new))
    return out


def _colored(lines: list[str]) -> list[str]:
    out: list[str] = []
    for kind, value in _blocks(lines):
        if kind == "line":
            color = BOLD if value.startswith(("---", "+++")) else CYAN if value.startswith("@@") else ""
            out.append(f"{color}{value}{RESET}" if color else value)
            continue
        removed, added = value
        pairs = [changed_spans(removed[n], added[n]) if n < len(added) else None for n in range(len(removed))]
        for n, old in enumerate(removed):
            pair = pairs[n]
            out.append(RED + "-" + _highlight(old, pair[0] if pair else [], RED) + RESET)
        for n, new in enumerate(added):
            pair = pairs[n] if n < len(pairs) else None
            out.append(GREEN + "+" + _highlight(new, pair[1] if pair else [], GREEN) + RESET)
    return out


def _highlight(text: str, spans: list[tuple[int, int]], color: str) -> str:
    parts, at = [], 0
    for start, end in spans:
        parts += [text[at:start], BOLD + REVERSE + text[start:end] + RESET + color]
        at = end
    return "".join(parts) + text[at:]
