"""Plain ASCII text encoded piece by piece, each piece's ids kept for the process: the same ids as the Rust tokenizer,
several times faster on text no session shares (an agent's tool results: every replayed prompt's new part).

Qwen2's pre-tokenizer splits the text with one regex (`QWEN2_SPLIT`), then byte-level BPE encodes each piece on its
own: a piece's ids never depend on what is around it. The Rust library runs that regex through Oniguruma at about
1.5 MB/s here; on text made of tab, newline and printable ASCII alone, Python's `re` runs the same split
(`ASCII_SPLIT`: `\\p{L}` is `[A-Za-z]` there, `\\p{N}` is `[0-9]`, `\\s` the same five characters, the NFC
normalizer changes nothing) at ten times that, and the words of code and logs repeat, so a piece is looked up far
more often than it is encoded. A piece encoded alone is one match of the same regex (the one extent an earlier
alternative could newly match at is the whole piece: the lookahead `(?!\\S)` succeeds at the end of the text),
so its ids are the ones it gets in context.

Used only where it is exact: the tokenizer's normalizer and pre-tokenizer are exactly Qwen2's (`for_backend`),
and the added tokens (`<|im_end|>`, `<think>`...), which the tokenizer matches before anything else, are cut out
first, as it cuts them: the longest at the leftmost place, none of them stripping the whitespace beside it.
`tests/test_pieces.py` holds it against the Rust tokenizer on generated text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from itertools import chain
from typing import Any

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ASCII_SPLIT = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    re.ASCII,
)
_NOT_PLAIN = re.compile(r"[^\t\n\x20-\x7e]")
MAX_PIECES = 500_000  # cached pieces (a few tens of MB); the cache starts afresh past it


class PieceEncoder:
    """Encodes plain ASCII text (`encode` returns None for any other) through a cache of its pieces' ids; the added
    tokens in it (`<|im_start|>`, `<tool_response>`...) are cut out first, as the tokenizer cuts them."""

    def __init__(self, backend: Any, max_pieces: int = MAX_PIECES) -> None:
        self.backend = backend
        self.max_pieces = max_pieces
        added = {t.content: i for i, t in backend.get_added_tokens_decoder().items()}
        self._added_ids = added
        # the longest first, as the tokenizer's leftmost-longest match; captured, so that the split keeps them
        self._added = re.compile("(" + "|".join(map(re.escape, sorted(added, key=len, reverse=True))) + ")")
        self._pieces: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text`, or None when it is not plain ASCII (encode it otherwise)."""
        if not text.isascii() or _NOT_PLAIN.search(text):
            return None
        out: list[int] = []
        for i, part in enumerate(self._added.split(text) if self._added_ids else [text]):
            if i % 2:
                out.append(self._added_ids[part])
            elif part:
                out += self._plain(part)
        return out

    def _plain(self, text: str) -> Iterator[int]:
        pieces = self._pieces
        found = ASCII_SPLIT.findall(text)
        missing = set(found).difference(pieces)
        if len(pieces) + len(missing) > self.max_pieces:
            pieces.clear()
            missing = set(found)
        for piece in missing:
            pieces[piece] = self.backend.encode(piece, add_special_tokens=False).ids
        return chain.from_iterable(map(pieces.__getitem__, found))


def for_backend(backend: Any) -> PieceEncoder | None:
    """A piece encoder for the Rust tokenizer `backend`, or None where its pipeline is not exactly Qwen2's (NFC or
    no normalizer, the split above then byte-level with no regex of its own, a BPE model without dropout)."""
    try:
        normalizer = json.loads(backend.normalizer.__getstate__()) if backend.normalizer is not None else None
        pre = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else None
    except (AttributeError, TypeError, ValueError):
        return None
    expected_pre = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ],
    }
    model = backend.model
    added = backend.get_added_tokens_decoder().values()
    if (
        any(t.lstrip or t.rstrip or t.single_word for t in added)
        or normalizer not in (None, {"type": "NFC"})
        or pre != expected_pre
        or type(model).__name__ != "BPE"
        or getattr(model, "dropout", None) is not None
    ):
        return None
    return PieceEncoder(backend)
