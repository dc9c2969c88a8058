"""Golden rendering: a sample as one reviewable string.

Trained tokens (loss 1) are wrapped in `[...]`, context tokens are bare, and `|` marks where the
response region starts. Token names come from a semantic test vocabulary or from a real tokenizer
(decoded text with whitespace made visible). Long sessions stay reviewable: long context runs collapse
to a count and a digest, long trained spans to their ends and length, so every trained span's
boundaries and length remain visible while the golden stays small.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

from trajectory.records import Sample

TokenNames = Callable[[int], str]
VISIBLE_WS = str.maketrans({" ": "·", "\n": "↵", "\t": "→", "\r": "␍"})


class TokenizerNames:
    """Names for a real tokenizer: each id decoded on its own, whitespace made visible."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        name = self._cache.get(token_id)
        if name is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            name = self._cache[token_id] = (text.translate(VISIBLE_WS) or f"<{token_id}>")
        return name


def digest(ids: Sequence[int]) -> str:
    return hashlib.sha1(",".join(map(str, ids)).encode()).hexdigest()[:8]


def _runs(sample: Sample) -> list[tuple[str, int, int]]:
    """(kind, start, end) runs over the tokens: kind is 'prompt', 'context' or 'trained'."""
    first = sample.prompt_length
    kinds = ["prompt"] * first + ["trained" if m else "context" for m in sample.loss_mask]
    runs: list[tuple[str, int, int]] = []
    for i, kind in enumerate(kinds):
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1], i + 1)
        else:
            runs.append((kind, i, i + 1))
    return runs


def render_sample(sample: Sample, names: TokenNames, *, logprobs: bool = False,
                  collapse_context: int | None = None, collapse_trained: int | None = None) -> str:
    """One line per sample. `collapse_*` = longest run shown in full; None shows everything."""
    first = sample.prompt_length
    out: list[str] = []
    for kind, start, end in _runs(sample):
        if start == first and first > 0:
            out.append("|")
        ids = sample.tokens[start:end]
        if kind == "trained":
            lps = sample.rollout_log_probs[start - first:end - first]
            shown = [f"{names(t)}@{lp:g}" if logprobs else names(t) for t, lp in zip(ids, lps, strict=True)]
            if collapse_trained is not None and len(ids) > collapse_trained:
                out.append(f"[{' '.join(shown[:3])} … {' '.join(shown[-3:])}]({len(ids)})")
            else:
                out.extend(f"[{s}]" for s in shown)
            continue
        if collapse_context is not None and len(ids) > collapse_context:
            out.append(f"{names(ids[0])} «{len(ids) - 2} #{digest(ids[1:-1])}» {names(ids[-1])}")
            continue
        if kind == "context" and logprobs:
            lps = sample.rollout_log_probs[start - first:end - first]
            out.extend(f"{names(t)}@{lp:g}" for t, lp in zip(ids, lps, strict=True))
        else:
            out.extend(names(t) for t in ids)
    return " ".join(out)


def render_samples(samples: Sequence[Sample], names: TokenNames, **options: Any) -> str:
    """All samples of a session, each with a header line naming its reward, sizes and turns."""
    lines: list[str] = []
    for i, s in enumerate(samples):
        trained = sum(s.loss_mask)
        turns = s.metadata.get("trained_turns")
        header = f"#{i} reward={s.reward:g} response={s.response_length} trained={trained}"
        if turns is not None:
            header += f" turns={','.join(map(str, turns))}"
        lines += [header, render_sample(s, names, **options)]
    return "\n".join(lines)
