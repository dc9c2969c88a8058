"""Top-p kept sets: the token ids the sampler kept at each output step (slime trains with the rollout's truncation).

SGLang with slime's patch answers them when asked (`sampling_params.custom_params.return_top_p_token_ids`) as CSR:
`meta_info.top_p_token_ids` (flat) and `meta_info.top_p_token_offsets` (`output_len + 1` entries, first 0): output
token i's kept ids are `ids[offsets[i]:offsets[i + 1]]`, the sampled token among them. The fake's sets are
deterministic from the context that sampled each token: the sampled id plus up to three others, spread over the
vocabulary by a hash of the prefix; greedy sampling keeps only the sampled token, as the patch does.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from tito_rl.fake_engine.channels.moe import prefix_digests

MAX_EXTRA = 3
SEED = b"tito-top-p"


@lru_cache(maxsize=64)
def _after(prompt: tuple[int, ...]) -> bytes | None:
    """The chain's digest through the prompt (cached: a stream asks again at every chunk), None for no prompt."""
    digests = prefix_digests(prompt, seed=SEED)
    return digests[-1] if digests else None


def _greedy(sampling: dict[str, Any]) -> bool:
    temperature, top_k = sampling.get("temperature"), sampling.get("top_k")
    return (temperature is not None and float(temperature) < 1e-6) or top_k == 1


def kept_sets(
    prompt: Sequence[int], output: Sequence[int], sampling: dict[str, Any], vocab_size: int
) -> list[list[int]]:
    """One kept set per output token, the sampled token first, ids distinct and in `[0, vocab_size)`."""
    if not output:
        return []
    greedy = _greedy(sampling)
    start = _after(tuple(prompt))
    digests = [start, *prefix_digests(output, seed=SEED, state=start)]  # digests[i]: through the token before i
    sets: list[list[int]] = []
    for i, sampled in enumerate(output):
        kept = [int(sampled)]
        context = digests[i]
        if not greedy and context is not None:
            stream = hashlib.blake2b(context, digest_size=32).digest()  # the context before the token
            extra = stream[0] % (MAX_EXTRA + 1)
            for j in range(extra):
                candidate = int.from_bytes(stream[1 + 4 * j : 5 + 4 * j], "little") % vocab_size
                if candidate not in kept:
                    kept.append(candidate)
        sets.append(kept)
    return sets


def csr(sets: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """The sets as (flat ids, offsets): offsets has one more entry than there are sets."""
    flat: list[int] = []
    offsets = [0]
    for kept in sets:
        flat.extend(kept)
        offsets.append(len(flat))
    return flat, offsets
