"""Drift injection: spell one output token as two ids that decode to the same text.

A real model may sample such a non-canonical split; re-encoding the decoded text then gives different
ids. Emitting it on purpose checks that nothing downstream re-tokenises generated text.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=4)
def _vocab(tokenizer: Any) -> tuple[dict[str, int], dict[int, str]]:
    vocab = tokenizer.get_vocab()
    return vocab, {i: s for s, i in vocab.items()}


def split_token(tokenizer: Any, token_id: int) -> tuple[int, int] | None:
    """Two ids whose byte-level pieces concatenate to `token_id`'s piece, or None if it cannot split."""
    vocab, inverse = _vocab(tokenizer)
    piece = inverse.get(token_id)
    special = set(getattr(tokenizer, "all_special_ids", []))
    if piece is None or token_id in special or len(piece) < 2:
        return None
    for cut in range(len(piece) - 1, 0, -1):
        left, right = vocab.get(piece[:cut]), vocab.get(piece[cut:])
        if left is not None and right is not None and left not in special and right not in special:
            return left, right
    return None


def inject_split(tokenizer: Any, output_ids: list[int]) -> tuple[list[int], int] | None:
    """Split the first splittable token; returns the new ids and the split position (or None)."""
    for pos, tid in enumerate(output_ids):
        if tid >= 151643:  # special and template tokens (<think>, <tool_call>, ...) stay whole
            continue
        pair = split_token(tokenizer, tid)
        if pair is not None:
            return output_ids[:pos] + list(pair) + output_ids[pos + 1:], pos
    return None
