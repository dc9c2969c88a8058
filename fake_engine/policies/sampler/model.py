"""The pseudo-model: a cheap, deterministic function from a prefix to a distribution over the real vocabulary.

At each position the model "attends" to a digest of the whole prefix (prompt and output so far, chained token by
token) and from it draws a few dozen candidate tokens out of a fixed pool of ordinary Qwen3 tokens (short words and
punctuation, so the text reads as text and decodes cleanly), each with a logit. Every other token of the vocabulary
sits at a low floor logit (a large positive `logit_bias` can still force one). The end tokens (`<|im_end|>`, and
`<|endoftext|>` more rarely) get a probability that grows with the output's length (`end_hazard`: a sampled answer
runs about 60 tokens; greedy ends once the end token is the argmax, about 100 in), so sessions end. The model's
weights (which candidates, which logits) never depend on the sampler's seed: as with a real model, the same prefix
always gives the same distribution and logprobs; the seed only moves the draws.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from tito_rl.fake_engine.openai.tokens import _byte_decoder

IM_END = 151645  # <|im_end|>, the tokenizer's eos
ENDOFTEXT = 151643  # <|endoftext|>, the other eos of Qwen3's generation config
END_IDS = (IM_END, ENDOFTEXT)
POOL_SIZE = 4096
CANDIDATES = 48
FLOOR_LOGIT = -30.0
MODEL_SEED = b"tito-pseudo-model-1"
ORDINARY = re.compile(r"^ ?[A-Za-z]{1,9}$|^[.,;:!?]$")


def end_hazard(position: int) -> float:
    """P(<|im_end|> or <|endoftext|>) at an output position under the model: rare at first, then more likely."""
    return min(0.95, 0.01 + (position / 150) ** 2)


@lru_cache(maxsize=4)
def _pool(tokenizer: Any, size: int) -> tuple[int, ...]:
    """`size` ordinary tokens (a word, with or without its leading space, or a punctuation mark), drawn from the
    vocabulary in a fixed order (only as much of it is read as it takes)."""
    decoder = _byte_decoder()
    order = np.random.default_rng(int.from_bytes(MODEL_SEED, "big")).permutation(ENDOFTEXT)
    ordinary: list[int] = []
    for lo in range(0, ENDOFTEXT, 8192):
        ids = order[lo : lo + 8192].tolist()
        for tid, piece in zip(ids, tokenizer.convert_ids_to_tokens(ids), strict=True):
            if not isinstance(piece, str) or not all(ch in decoder for ch in piece):
                continue
            try:
                text = bytes(decoder[ch] for ch in piece).decode("utf-8")
            except UnicodeDecodeError:
                continue
            if ORDINARY.match(text):
                ordinary.append(tid)
        if len(ordinary) >= size:
            break
    return tuple(sorted(ordinary[:size]))


@dataclass(frozen=True)
class Distribution:
    """The model's logits at one position: the tokens it names, and `rest` more tokens at `FLOOR_LOGIT`."""

    ids: np.ndarray  # int64, distinct
    logits: np.ndarray  # float64, one per id
    rest: int

    def adjusted(self, bias: Mapping[int, float], banned: frozenset[int]) -> Distribution:
        """The logits a sampler uses: `logit_bias` added (a token it names but the model did not joins at the
        floor), `banned` tokens (and a bias of -100 or less) at minus infinity."""
        named = set(self.ids.tolist())
        extra = [t for t in bias if t not in named]
        ids = np.concatenate([self.ids, np.asarray(extra, dtype=np.int64)])
        logits = np.concatenate([self.logits, np.full(len(extra), FLOOR_LOGIT)])
        for i, tid in enumerate(ids.tolist()):
            b = bias.get(tid)
            if tid in banned or (b is not None and b <= -100.0):
                logits[i] = -math.inf
            elif b is not None:
                logits[i] += b
        return Distribution(ids, logits, max(0, self.rest - len(extra)))

    def log_normalizer(self, temperature: float = 1.0) -> float:
        scaled = self.logits / temperature
        top = max(float(np.max(scaled)), FLOOR_LOGIT / temperature)
        total = float(np.sum(np.exp(scaled - top))) + self.rest * math.exp(FLOOR_LOGIT / temperature - top)
        return top + math.log(total)

    def logprob(self, token: int, temperature: float = 1.0) -> float:
        where = np.flatnonzero(self.ids == token)
        logit = float(self.logits[where[0]]) if len(where) else FLOOR_LOGIT
        return logit / temperature - self.log_normalizer(temperature)


class PseudoModel:
    def __init__(self, tokenizer: Any, vocab_size: int | None = None) -> None:
        self.pool = np.asarray(_pool(tokenizer, POOL_SIZE), dtype=np.int64)
        self.vocab_size = vocab_size or len(tokenizer)

    def prompt_digest(self, ids: list[int]) -> bytes:
        return hashlib.blake2b(np.asarray(ids, dtype=np.int64).tobytes(), key=MODEL_SEED, digest_size=16).digest()

    def next_digest(self, digest: bytes, token: int) -> bytes:
        return hashlib.blake2b(digest + token.to_bytes(4, "big"), key=MODEL_SEED, digest_size=16).digest()

    def distribution(self, digest: bytes, position: int) -> Distribution:
        rng = np.random.default_rng(int.from_bytes(digest, "big"))
        ids = self.pool[rng.choice(len(self.pool), CANDIDATES, replace=False)]
        logits = rng.normal(0.0, 1.5, CANDIDATES)
        logits[int(rng.integers(CANDIDATES))] += 2.5  # a favourite, as a trained model has
        rest = self.vocab_size - CANDIDATES - len(END_IDS)
        base = Distribution(ids, logits, rest)
        hazard = end_hazard(position)
        end = base.log_normalizer() + math.log(hazard / (1 - hazard))
        return Distribution(
            np.concatenate([ids, np.asarray(END_IDS, dtype=np.int64)]),
            np.concatenate([logits, [end, end - 4.0]]),
            rest,
        )
