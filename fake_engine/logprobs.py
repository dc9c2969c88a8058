"""Deterministic fake logprobs: the same (seed, session, turn, position, token) always gives one value.

Replays and golden files can then compare logprobs exactly, while values still vary like real ones.
"""

from __future__ import annotations

import hashlib


def token_logprob(seed: str, session: str, turn: int, position: int, token_id: int) -> float:
    digest = hashlib.blake2b(f"{seed}|{session}|{turn}|{position}|{token_id}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 1) / 2.0**64  # in (0, 1]
    # Mostly confident tokens, a tail of unsure ones down to about -6; never exactly 0.
    return round(-(1e-4 + 6.0 * u**4), 6)


def logprobs_for(seed: str, session: str, turn: int, ids: list[int]) -> list[float]:
    return [token_logprob(seed, session, turn, i, t) for i, t in enumerate(ids)]
