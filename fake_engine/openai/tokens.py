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


def visible_text(
    tokenizer: Any,
    ids: list[int],
    finish: str | None,
    matched: Any,
    *,
    skip_special_tokens: bool = True,
    sglang: bool = False,
    keep_stop: bool = False,
) -> str:
    """The output's text as each engine shows it once it stopped. A stop id: its token's text left out (kept by
    vLLM's `include_stop_str_in_output`). A stop string: SGLang cuts the text at the string's first occurrence;
    vLLM at the occurrence the last token completed (its detokenizer's window), after it with
    `include_stop_str_in_output`. `keep_stop` is that flag for vLLM, `no_stop_trim` for SGLang (nothing cut). The
    ids always keep every token generated."""

    def decode(part: list[int]) -> str:
        text: str = tokenizer.decode(part, skip_special_tokens=skip_special_tokens)
        return text

    if finish != "stop" or not ids or (keep_stop and sglang):
        return decode(ids)
    if isinstance(matched, str):
        text = decode(ids)
        if sglang:
            at = text.find(matched)
            return text[:at] if at >= 0 else text
        at = text.find(matched, max(0, len(decode(ids[:-1])) - len(matched) + 1))
        if at < 0:
            return text
        return text[: at + len(matched)] if keep_stop else text[:at]
    return decode(ids if keep_stop else ids[:-1])


def clip_pieces(pieces: list[str], keep: int) -> list[str]:
    """Streamed text pieces cut so that they add up to the first `keep` characters (a trimmed stop)."""
    out, used = [], 0
    for piece in pieces:
        out.append(piece[: max(0, keep - used)])
        used += len(piece)
    return out


TEXT_DELTA_KEYS = ("content", "reasoning", "reasoning_content")


def clip_deltas(deltas: list[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """Chat stream deltas cut so that their text adds up to the first `keep` characters; a delta left with no text
    becomes `{}` (the stream's "nothing to show for this token")."""
    out: list[dict[str, Any]] = []
    used = 0
    for delta in deltas:
        text = next((delta[k] for k in TEXT_DELTA_KEYS if isinstance(delta.get(k), str)), None)
        if text is None:
            out.append(delta)
            continue
        piece = text[: max(0, keep - used)]
        used += len(text)
        if piece == text:
            out.append(delta)
        elif piece:
            out.append({k: piece if k in TEXT_DELTA_KEYS and isinstance(v, str) else v for k, v in delta.items()})
        else:
            out.append({})
    return out
