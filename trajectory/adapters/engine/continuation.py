"""Continuing a generation the engine aborted on its own, as an asynchronous-RL gateway must.

A weight update with `abort_all_requests` (SGLang's default), a pause in abort mode or a trainer's `/abort_request`
ends every generation in flight with finish reason `abort` and the output so far. The agent asked for a whole reply
and knows nothing of the update, so the adapter does what slime's partial rollout does (`generate_and_rm` sends an
aborted sample's prompt and partial response again, `max_new_tokens` less what it holds, and appends): it sends the
prompt plus the partial output again, asks only for the rest (and for the routes from the first row it lacks), and
answers the agent once with the whole reply. The tokens before the abort keep their version, those after carry the
new one: the turn's weight-version spans cover both, and its logprobs, kept sets and routes stay aligned with its
output (`joined`). An abort the adapter asked for itself (its agent went away) is never continued.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tito_rl.trajectory.adapters.engine.generation import Generation
from tito_rl.trajectory.channels import KeptSets, Routes, VersionSpan

# How many times one turn's generation is continued after engine aborts before the adapter gives up on it (an
# engine aborting every attempt is failing, not updating): the agent is then answered with an error, and the
# partial output is kept as a side turn, never trained.
MAX_CONTINUATIONS = 8


@dataclass
class Continuing:
    """One turn's generation across its engine calls: `rid` names the call in flight (each continuation has its
    own, which the adapter's abort names); `stopped`: the adapter aborted it itself, so it is not continued;
    `parts`: the calls' answers so far, in order."""

    rid: str
    stopped: bool = False
    parts: list[Generation] = field(default_factory=list)

    @property
    def done(self) -> int:
        return sum(len(p.output_ids) for p in self.parts)

    def output_ids(self) -> list[int]:
        return [t for p in self.parts for t in p.output_ids]


def rest_params(params: dict[str, Any], done: int) -> dict[str, Any] | None:
    """The sampling parameters of the continuation after `done` output tokens: the token budget less what is held
    (slime: `max_new_tokens -= sample.response_length`); None where nothing is left to generate."""
    budget = params.get("max_new_tokens")
    if isinstance(budget, int) and not isinstance(budget, bool):
        if budget - done <= 0:
            return None
        return {**params, "max_new_tokens": budget - done}
    return dict(params)


def routes_end(parts: Sequence[Generation], routes_from: int) -> int:
    """The first position whose route the parts do not hold: where the next call's routes must start."""
    end = routes_from
    for part in parts:
        if part.routes is not None and part.routes.end > end and part.routes.start <= end:
            end = part.routes.end
    return end


def joined(parts: Sequence[Generation], routes_from: int = 0) -> Generation:
    """One generation from a turn's calls (the first aborted, each next one continuing it): ids, logprobs and
    channels concatenated, the version spans shifted to their place in the whole output. The reasons, counts and
    times are the last call's, the prompt's the first's."""
    first, last = parts[0], parts[-1]
    if len(parts) == 1:
        return first
    whole = Generation(
        last.rid,
        [t for p in parts for t in p.output_ids],
        [lp for p in parts for lp in p.output_log_probs],
        last.finish_reason,
        first.prompt_tokens,
        first.cached_tokens,
        last.raw,
        last.created,
    )
    whole.routes = _routes(parts, routes_from)
    whole.kept = _kept(parts)
    whole.weight_versions = _versions(parts)
    return whole


def _routes(parts: Sequence[Generation], routes_from: int) -> Routes | None:
    """The rows of every call, each from where the ones before end (vLLM sends every row each time); None where a
    call with output sent none, or left a gap: a route the trainer would miss is not made up."""
    held: Routes | None = None
    for part in parts:
        if part.routes is None:
            if part.output_ids:
                return None
            continue  # aborted before any forward pass: nothing to keep
        if held is None:
            held = part.routes.from_row(routes_from)
            continue
        rows = part.routes.from_row(held.end)
        if rows.start != held.end or rows.width != held.width:
            return None
        held = Routes(held.start, np.concatenate([held.rows, rows.rows]), held.layers, held.top_k)
    return held


def _kept(parts: Sequence[Generation]) -> KeptSets | None:
    """The kept sets in one CSR over the whole output; None unless every call with output sent them."""
    sets = [p.kept for p in parts if p.output_ids or p.kept is not None]
    if not sets or any(k is None for k in sets):
        return None
    ids: list[Any] = []
    offsets: list[Any] = [np.zeros(1, dtype=np.int64)]
    base = 0
    for kept in sets:
        assert kept is not None
        ids.append(kept.ids)
        offsets.append(np.asarray(kept.offsets[1:], dtype=np.int64) + base)
        base += int(kept.offsets[-1])
    return KeptSets(np.concatenate(ids), np.concatenate(offsets))


def _versions(parts: Sequence[Generation]) -> tuple[VersionSpan, ...]:
    """Each call's spans shifted by the output before it, a span of no tokens left out and equal neighbours
    merged; () unless every call with output named its versions."""
    spans: list[VersionSpan] = []
    at = 0
    for part in parts:
        if part.output_ids and not part.weight_versions:
            return ()
        for span in part.weight_versions:
            if span.end <= span.start:
                continue
            start, end = at + span.start, at + span.end
            if spans and spans[-1].version == span.version and spans[-1].end == start:
                spans[-1] = VersionSpan(span.version, spans[-1].start, end)
            else:
                spans.append(VersionSpan(span.version, start, end))
        at += len(part.output_ids)
    if not spans and parts[-1].weight_versions:  # no output at all: the version still says
        return (parts[-1].weight_versions[-1],)
    return tuple(spans)
