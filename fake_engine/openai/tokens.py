"""Token text as the engines report it: per-token strings and bytes for logprob entries, and streamed text pieces.

A streamed piece is what an incremental detokenizer emits: text is held back while it ends in an incomplete UTF-8
sequence, so the pieces always concatenate to the decoded whole.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

REPLACEMENT = "\ufffd"


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the byte-level BPE alphabet back to bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def token_text(tokenizer: Any, token_id: int) -> str:
    text: str = tokenizer.decode([token_id], skip_special_tokens=False)
    return text


def token_bytes(tokenizer: Any, token_id: int) -> list[int]:
    """The token's true bytes (a lone byte of a multi-byte character stays that byte, not U+FFFD's three)."""
    piece = tokenizer.convert_ids_to_tokens(token_id)
    decoder = _byte_decoder()
    if isinstance(piece, str) and piece and all(ch in decoder for ch in piece):
        return [decoder[ch] for ch in piece]
    return list(token_text(tokenizer, token_id).encode("utf-8", errors="replace"))


def text_pieces(tokenizer: Any, ids: list[int], skip_special_tokens: bool = True) -> list[str]:
    """One text piece per token; their concatenation is `decode(ids)`."""
    pieces: list[str] = []
    emitted = ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1], skip_special_tokens=skip_special_tokens)
        if text.endswith(REPLACEMENT) and i + 1 < len(ids):
            pieces.append("")
            continue
        pieces.append(text[len(emitted) :] if text.startswith(emitted) else text)
        emitted = text
    return pieces
