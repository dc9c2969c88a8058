"""The expert routes an engine answers for one request, and the ways a buggy engine gets them wrong (faults).

Right: rows `[start, len(prompt) + len(output) - 1)` of `moe.routes` (the last sampled token has no row). Each fault
reproduces one bug seen in the trackers (docs/fake-engine.md, "Per-token channels"), so a reader's checks can be
shown to catch it: `routes_missing` (none sent though asked), `routes_ignore_start` (every row from 0 although a
start was asked: a reader appending at the start doubles the prefix), `routes_dummy_row` (the row of the previous
turn's last generated token, or of the last prompt token in a first turn, all expert 0), `routes_zero_padding` (a
padding row for the never-forwarded last token, filled with expert 0 where a padder means -1: a real expert id),
`routes_extra_rows: N` (N rows past the answer's tokens, as an engine that routed tokens a stop then trimmed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tito_rl.fake_engine.channels.moe import MoeShape, routes
from tito_rl.fake_engine.faults import FaultSpec
from tito_rl.fake_engine.sessions import last_assistant_end


def answered_routes(
    prompt: Sequence[int], output: Sequence[int], shape: MoeShape, start: int, faults: FaultSpec
) -> np.ndarray | None:
    """The rows the engine sends (int32 `[rows, layers, top_k]`), or None where a fault sends none."""
    if faults.routes_missing:
        return None
    ids = [*prompt, *output]
    extra = faults.routes_extra_rows or 0
    if extra:
        filler = ids[-1] if ids else 0
        ids = ids + [filler] * extra
    rows = routes(ids, shape)[: max(0, len(ids) - 1)]
    if faults.routes_dummy_row and len(rows):
        at = last_assistant_end(list(prompt))
        rows[min(len(prompt) - 1 if at is None else at, len(rows) - 1)] = 0
    if faults.routes_zero_padding:
        rows = np.concatenate([rows, np.zeros((1, shape.layers, shape.top_k), dtype=np.int32)])
    return rows if faults.routes_ignore_start else rows[start:]
