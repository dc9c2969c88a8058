"""Drift injection: spell output tokens as two ids each that decode to the same text.

A real model may sample such a non-canonical split; re-encoding the decoded text then gives different
ids. Emitting it on purpose checks that nothing downstream re-tokenises generated text. One split lands on the
first splittable token (in practice the reasoning's first word); several are spread over the whole output,
first and last splittable tokens included, so they also fall inside tool-call JSON, the answer's text and
right before the end of the turn.
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
    split = inject_splits(tokenizer, output_ids, 1)
    return None if split is None else (split[0], split[1][0])


def inject_splits(tokenizer: Any, output_ids: list[int], count: int) -> tuple[list[int], list[int]] | None:
    """Split `count` splittable tokens spread evenly over the output (all of them when there are fewer);
    returns the new ids and, per split, the position of its first piece in them (None: nothing splits)."""
    if count < 1:
        return None
    splittable = []
    for pos, tid in enumerate(output_ids):
        if tid >= 151643:  # special and template tokens (<think>, <tool_call>, ...) stay whole
            continue
        pair = split_token(tokenizer, tid)
        if pair is not None:
            splittable.append((pos, pair))
            if count == 1:
                break  # the first is the one
    if not splittable:
        return None
    n = len(splittable)  # count == 1 stopped at n == 1: below, count >= 2 wherever count < n
    chosen = splittable if count >= n else [splittable[round(i * (n - 1) / (count - 1))] for i in range(count)]
    ids: list[int] = []
    positions: list[int] = []
    last = 0
    for pos, pair in chosen:
        ids += output_ids[last:pos]
        positions.append(len(ids))
        ids += pair
        last = pos + 1
    return ids + output_ids[last:], positions
