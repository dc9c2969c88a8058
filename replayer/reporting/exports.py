"""Samples as JSON Lines, one sample a line, the same shape for the live run's samples and a replay's.

Keys in a fixed order; floats written as Python writes them (shortest text that reads back exactly), so
two exports of the same samples are byte-identical and a diff of two exports shows real differences.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import IO, Any

from tito_rl.replayer.replay.results import CassetteResult

FIELDS = ("tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "metadata")
# Per-token channels (slime's names and layouts), written where a sample has them: a sample without any has the
# same line as before they existed.
CHANNEL_FIELDS = ("rollout_routed_experts", "rollout_top_p_token_ids", "rollout_top_p_token_offsets", "weight_versions")


def sample_line(session: str, index: int, sample: dict[str, Any]) -> str:
    row = {"session": session, "index": index, **{k: sample.get(k) for k in FIELDS}}
    for key in CHANNEL_FIELDS:
        value = sample.get(key)
        if value is not None:
            row[key] = value.tolist() if hasattr(value, "tolist") else value
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def replayed_rows(results: Iterable[CassetteResult]) -> Iterator[str]:
    for cassette in results:
        for session in cassette.sessions:
            samples = [s for f in session.finishes for s in f.samples]
            yield from (sample_line(session.session, i, s) for i, s in enumerate(samples))


def live_rows(results: Iterable[CassetteResult]) -> Iterator[str]:
    for cassette in results:
        for session in cassette.sessions:
            yield from (sample_line(session.session, i, s) for i, s in enumerate(session.live_samples))


def write_rows(rows: Iterable[str], out: IO[str]) -> int:
    count = 0
    for row in rows:
        out.write(row + "\n")
        count += 1
    return count
