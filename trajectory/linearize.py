"""Token-level linearization of one root-to-leaf chain into training samples.

Routing decides which turns belong to one conversation; tokens decide whether they can share a sample.
For each generated turn the held tokens are compared with the turn's prompt_ids (longest common prefix):
CLEAN when the held tokens are a prefix, REALIGN when the divergence lies in the most recent response
and the incoming output is short, FORK otherwise. Only the engine's own output ids are ever trained.

A sample's response region starts, as slime lays it out, right after the prompt of the sample's first turn
(`AFTER_PROMPT`): context inside it (later prompts' new tokens, outputs an earlier sample trains, realigned
spans) is masked with 0.0 logprobs. `FIRST_TRAINED` starts it at the first trained token instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.events import Event
from tito_rl.trajectory.records import Sample
from tito_rl.trajectory.sample_channels import (
    RouteCut,
    RouteOp,
    RouteWrite,
    assemble_kept,
    assemble_routes,
    version_list,
)
from tito_rl.trajectory.tree import Node

_CHUNK = 512
AFTER_PROMPT = "after-prompt"  # slime's layout: the response region follows the first turn's prompt
FIRST_TRAINED = "first-trained"  # the response region starts at the first trained token
RESPONSE_STARTS = (AFTER_PROMPT, FIRST_TRAINED)


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Longest common prefix of two id lists, compared a chunk at a time at C speed."""
    n = min(len(a), len(b))
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):  # no copy of the shorter one
        return n
    lo = 0
    while lo + _CHUNK <= n and a[lo : lo + _CHUNK] == b[lo : lo + _CHUNK]:
        lo += _CHUNK
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


@dataclass
class Span:
    turn_index: int
    start: int
    length: int
    trained: bool


@dataclass
class Builder:
    """Tokens of one sample under construction; loss and logprobs are kept for every token."""

    tokens: list[int]
    loss: list[int]
    logprobs: list[float]
    spans: list[Span] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    prompt_length: int = 0  # the first turn's prompt: where slime's response region starts
    route_ops: list[RouteOp] = field(default_factory=list)  # each turn's routes and each rewrite, in order

    @classmethod
    def start(cls, prompt_ids: list[int], after: Builder | None = None, lcp: int = 0) -> Builder:
        """`after`: the builder this one forks from, sharing its first `lcp` tokens (and so their routes: a row
        depends only on the tokens up to its own)."""
        n = len(prompt_ids)
        ops: list[RouteOp] = [*after.route_ops, RouteCut(lcp)] if after is not None and after.route_ops else []
        return cls(list(prompt_ids), [0] * n, [0.0] * n, prompt_length=n, route_ops=ops)

    def add_context(self, ids: list[int]) -> None:
        self.tokens += ids
        self.loss += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)

    def add_output(self, node: Node, trained: bool) -> None:
        turn = node.turn
        assert turn is not None and node.turn_index is not None
        self.spans.append(Span(node.turn_index, len(self.tokens), len(turn.output_ids), trained))
        self.nodes.append(node)
        self.tokens += turn.output_ids
        self.loss += [int(trained)] * len(turn.output_ids)
        self.logprobs += turn.output_log_probs if trained else [0.0] * len(turn.output_ids)
        self.route_ops.append(RouteWrite(node.turn_index, turn))

    def realign(self, prompt_ids: list[int], lcp: int | None = None) -> int:
        """Replace the last response span by the prompt's tokens, masked; returns trained tokens lost. `lcp`: where
        the prompt parts from the held tokens (default: the span's start); routes from there on are void."""
        span = self.spans[-1]
        lost = span.length if span.trained else 0
        del self.tokens[span.start :], self.loss[span.start :], self.logprobs[span.start :]
        self.route_ops.append(RouteCut(span.start if lcp is None else lcp))
        self.add_context(prompt_ids[span.start :])
        span.trained, span.length = False, 0  # its tokens are context now, not a response
        return lost

    def region_of(self, index: int) -> tuple[str, Span | None]:
        """Which part of the held tokens an index falls in: a response span, or context."""
        for span in reversed(self.spans):
            if span.start <= index < span.start + span.length:
                return "response", span
            if index >= span.start + span.length:
                break
        return "context", None

    def to_sample(self, reward: float, metadata: dict[str, Any], response_start: str = AFTER_PROMPT) -> Sample | None:
        """None when no token is trained. A realign only rewrites tokens after the last response's start,
        never the first prompt, so `prompt_length` always marks the end of the sample's prompt."""
        try:
            first = self.loss.index(1)
        except ValueError:
            return None
        if response_start == AFTER_PROMPT:
            first = self.prompt_length
        length = len(self.tokens) - first
        turns = [(s, n.turn) for s, n in zip(self.spans, self.nodes, strict=True) if n.turn is not None]
        kept = assemble_kept(first, length, [(s.start, s.turn_index, t) for s, t in turns if s.trained], metadata)
        return Sample(
            tokens=list(self.tokens),
            response_length=length,
            loss_mask=self.loss[first:],
            rollout_log_probs=self.logprobs[first:],
            reward=reward,
            metadata=metadata,
            rollout_routed_experts=assemble_routes(len(self.tokens), self.route_ops, metadata),
            rollout_top_p_token_ids=None if kept is None else kept[0],
            rollout_top_p_token_offsets=None if kept is None else kept[1],
            weight_versions=version_list([(s.turn_index, t) for s, t in turns], metadata),
        )


def linearize_chain(
    leaf: Node,
    trained_turns: set[int],
    fork_threshold_tokens: int,
    events: list[Event],
    prefix_cache: dict[tuple[int, int], int] | None = None,
) -> list[Builder]:
    """Builders for one leaf's chain. `trained_turns` holds turns an earlier leaf already trains.

    After any turn the held tokens are exactly that turn's prompt_ids + output_ids (CLEAN, REALIGN and
    FORK all end there), so the prefix comparison depends only on the pair of consecutive generated
    nodes: `prefix_cache` keeps it across leaves that share a chain prefix.
    """
    prefix_cache = {} if prefix_cache is None else prefix_cache
    builders: list[Builder] = []
    builder: Builder | None = None
    prev: Node | None = None
    for node in leaf.path():
        if not node.generated or node.turn is None or node.turn_index is None:
            continue
        turn, index = node.turn, node.turn_index
        if builder is None or prev is None:
            builder = Builder.start(turn.prompt_ids)
        else:
            held = builder.tokens
            key = (prev.id, node.id)
            lcp = prefix_cache.get(key)
            if lcp is None:
                lcp = prefix_cache[key] = common_prefix_len(held, turn.prompt_ids)
            if lcp == len(held):
                builder.add_context(turn.prompt_ids[lcp:])
            else:
                region, span = builder.region_of(lcp)
                last = builder.spans[-1] if builder.spans else None
                short = fork_threshold_tokens > 0 and len(turn.output_ids) < fork_threshold_tokens
                if span is not None and span is last and short:
                    lost = builder.realign(turn.prompt_ids, lcp)
                    why = f"divergence inside the response of turn {span.turn_index}"
                    if turn.unspliced:
                        why += ", prompt rendered: not spliced"
                    events.append(Event("realign", why, index, lcp, leaf.id, lost))
                else:
                    if span is None:
                        reason = "prompt"
                    elif span is last:
                        reason = "threshold"
                    else:
                        reason = "earlier-response"
                    events.append(Event("fork", reason, index, lcp, leaf.id))
                    builders.append(builder)
                    builder = Builder.start(turn.prompt_ids, builder, lcp)
        trained = index not in trained_turns
        if not trained:
            events.append(
                Event(
                    "dedup", f"turn {index} is trained by an earlier leaf", index, None, leaf.id, len(turn.output_ids)
                )
            )
        builder.add_output(node, trained)
        prev = node
    if builder is not None:
        builders.append(builder)
    return builders
