"""Encoding line by line, each line's ids kept for the whole process: sessions share what they all send.

Agents of one kind send the same system prompt and tool definitions in every session (Claude Code's are ~50k
characters), and tool results and messages come back in every later turn. Qwen's pre-tokenizer is a regex
whose cost dominates an encode (~0.3 s for 50k characters on the CI VM), so a session's first prompt was the
most expensive step of a replay, paid again by every session.

Cutting is exact where no token can straddle the cut: right after a newline that is followed by a printable
ASCII character other than a space. Every alternative of Qwen's split regex that can hold a newline ends with
newlines or whitespace (`\\s*[\\r\\n]+`, ` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*`, `\\s+(?!\\S)`, `\\s+`), so no match runs
on into that character; letter runs cannot start with a newline; NFC composes nothing onto a newline; and no
added token holds a newline (`LightTokenizer.splits_at_lines` checks it). `tests/test_line_cache.py` holds
the cut against whole-text encoding on generated text.
"""

from __future__ import annotations

import re
import weakref
from array import array
from collections import OrderedDict
from typing import Any

from tito_rl.trajectory.tokens import pieces
from tito_rl.trajectory.tokens.pieces import PieceEncoder

_CUT = re.compile(r"\n(?=[!-~])")
MIN_CACHED_CHARS = 16  # shorter lines are cheap to encode and too many to keep
MAX_CACHED_TOKENS = 4_000_000  # ~16 MB of packed ids
BATCH_LINES = 64  # new lines in one text from which they are encoded in one batch call
MIN_PIECES_CHARS = 4096  # a plain text this long is encoded by pieces whole, rather than line by line


class LineCache:
    """Encodes text as its lines' ids, each line encoded once per process while it stays in the cache."""

    def __init__(
        self,
        backend: Any,
        max_tokens: int = MAX_CACHED_TOKENS,
        batch_lines: int = BATCH_LINES,
        pieces: PieceEncoder | None = None,
    ) -> None:
        """`pieces`: plain ASCII lines not seen before are encoded through it (`tito_rl.trajectory.tokens.pieces`);
        those of a long new text (a tool result, new in every session) are not kept: each would push out a line
        that sessions share."""
        self.backend = backend  # the Rust tokenizer
        self.max_tokens = max_tokens
        self.batch_lines = batch_lines
        self.pieces = pieces
        self._lines: OrderedDict[str, array[int]] = OrderedDict()
        self._tokens = 0
        self.hits = self.misses = 0

    def encode(self, text: str) -> list[int]:
        if self.pieces is not None and len(text) >= MIN_PIECES_CHARS and not self._known_start(text):
            ids = self.pieces.encode(text)  # a long new plain text: by its pieces, no line kept but its first
            if ids is not None:  # (a second time, it is read line by line, and its lines are kept)
                self.misses += 1
                cut = _CUT.search(text)
                if cut is not None:
                    self._line(text[: cut.end()])
                return ids
        lines, start = [], 0
        for cut in _CUT.finditer(text):
            lines.append(text[start : cut.end()])
            start = cut.end()
        lines.append(text[start:])
        fresh = self._encode_new(lines) if len(lines) >= self.batch_lines else {}
        out = array("I")
        for line in lines:
            known = fresh.get(line)
            out.extend(self._line(line) if known is None else known)
        return out.tolist()

    def _known_start(self, text: str) -> bool:
        """Whether the text's first line is cached: a text that sessions share (a system prompt, tool definitions)."""
        cut = _CUT.search(text)
        return cut is not None and text[: cut.end()] in self._lines

    def _encode_new(self, lines: list[str]) -> dict[str, array[int]]:
        """Many lines not seen before (a long tool result) in one call: through the piece encoder where they are
        plain ASCII, the others in one call of the Rust tokenizer, which spreads them over the cores."""
        new = [line for line in dict.fromkeys(lines) if line not in self._lines]
        if len(new) < self.batch_lines:
            return {}
        fresh: dict[str, array[int]] = {}
        if self.pieces is not None:
            for line in new:
                plain = self.pieces.encode(line)
                if plain is not None:
                    fresh[line] = array("I", plain)
            self.misses += len(fresh)
            new = [line for line in new if line not in fresh]
            if len(new) < self.batch_lines:
                return fresh
        encodings = self.backend.encode_batch_fast(new, add_special_tokens=False)  # ids alone: no offsets kept
        batch = {line: array("I", encoding.ids) for line, encoding in zip(new, encodings, strict=True)}
        self.misses += len(batch)
        for line, encoded in batch.items():
            if len(line) >= MIN_CACHED_CHARS:
                self._keep(line, encoded)
        return {**fresh, **batch}

    def _line(self, line: str) -> array[int]:
        ids = self._lines.get(line)
        if ids is not None:
            self._lines.move_to_end(line)
            self.hits += 1
            return ids
        self.misses += 1
        plain = self.pieces.encode(line) if self.pieces is not None else None
        ids = array("I", self.backend.encode(line, add_special_tokens=False).ids if plain is None else plain)
        if len(line) >= MIN_CACHED_CHARS:
            self._keep(line, ids)
        return ids

    def _keep(self, line: str, ids: array[int]) -> None:
        if len(ids) >= self.max_tokens:
            return
        self._lines[line] = ids
        self._tokens += len(ids)
        while self._tokens > self.max_tokens:
            _, dropped = self._lines.popitem(last=False)
            self._tokens -= len(dropped)


_SHARED: weakref.WeakKeyDictionary[Any, LineCache] = weakref.WeakKeyDictionary()


def shared_line_cache(tokenizer: Any) -> LineCache | None:
    """The process's cache for `tokenizer`, or None where cutting at lines is not known to be exact for it."""
    if not getattr(tokenizer, "splits_at_lines", False):
        return None
    cache = _SHARED.get(tokenizer)
    if cache is None:
        backend = tokenizer._tokenizer
        cache = _SHARED[tokenizer] = LineCache(backend, pieces=pieces.for_backend(backend))
    return cache
