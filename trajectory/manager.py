"""TrajectoryManager: folds each session's turns into a message tree and linearizes it into samples.

One manager serves many sessions. Every decision (branch, merge, fork, realign, dedup, drop) is kept as
an Event with its reason, so a replay can explain each sample it produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.events import Event, SessionStats
from tito_rl.trajectory.linearize import AFTER_PROMPT, RESPONSE_STARTS, Builder, Span, linearize_chain
from tito_rl.trajectory.records import Sample, TurnRecord
from tito_rl.trajectory.tree import MessageTree

REWARD_POLICIES = ("full", "split")


@dataclass
class _Session:
    tree: MessageTree
    turns: int = 0
    side: list[tuple[list[dict[str, Any]], dict[str, Any], TurnRecord]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)  # routing events, in arrival order


@dataclass
class Linearization:
    samples: list[Sample]
    events: list[Event]
    leaf_samples: dict[int, list[int]]
    stats: SessionStats
    spans: list[list[Span]] = field(default_factory=list)  # per sample: where each turn's output lies


class TrajectoryManager:
    def __init__(
        self,
        fork_threshold_tokens: int = 1024,
        reward_policy: str = "full",
        keep_reasoning_in_identity: bool = False,
        response_start: str = AFTER_PROMPT,
    ) -> None:
        """`response_start`: where a sample's response region begins, right after its first prompt (slime's
        layout, the default) or at its first trained token (`"first-trained"`)."""
        if reward_policy not in REWARD_POLICIES:
            raise ValueError(f"reward_policy must be one of {REWARD_POLICIES}, got {reward_policy!r}")
        if response_start not in RESPONSE_STARTS:
            raise ValueError(f"response_start must be one of {RESPONSE_STARTS}, got {response_start!r}")
        if fork_threshold_tokens < 0:
            raise ValueError("fork_threshold_tokens must be >= 0")
        self.fork_threshold_tokens = fork_threshold_tokens
        self.reward_policy = reward_policy
        self.keep_reasoning_in_identity = keep_reasoning_in_identity
        self.response_start = response_start
        self._sessions: dict[str, _Session] = {}

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            tree = MessageTree(
                fork_threshold_tokens=self.fork_threshold_tokens, keep_reasoning=self.keep_reasoning_in_identity
            )
            session = self._sessions[session_id] = _Session(tree)
        return session

    def settings(self) -> dict[str, Any]:
        """What shapes samples; a cassette's header keeps it so a replay builds the same manager."""
        return {
            "fork_threshold_tokens": self.fork_threshold_tokens,
            "reward_policy": self.reward_policy,
            "keep_reasoning_in_identity": self.keep_reasoning_in_identity,
            "response_start": self.response_start,
        }

    def sessions(self) -> list[str]:
        return list(self._sessions)

    def record_turn(
        self, session_id: str, messages: list[dict[str, Any]], reply: dict[str, Any], turn: TurnRecord
    ) -> int:
        """Record one agent turn (its prompt messages and the reply sent); returns its turn index.

        A turn needs its prompt messages: without them the reply would hang under the root and be trained
        on no context (slime skips such a turn; here it is refused, so a caller's bug is not silent)."""
        _require_prompt(session_id, messages)
        session = self._session(session_id)
        index = session.turns
        session.turns += 1
        if turn.unspliced:  # the adapter rendered this prompt: the next realign, if any, is why
            session.events.append(Event("unspliced", turn.unspliced, index))
        session.tree.route(messages, reply, turn, index, session.events)
        return index

    def record_side_turn(
        self, session_id: str, messages: list[dict[str, Any]], reply: dict[str, Any], turn: TurnRecord
    ) -> int:
        """Side requests (titles, probes) are answered but never enter the agent's tree."""
        _require_prompt(session_id, messages)
        session = self._session(session_id)
        session.side.append((messages, reply, turn))
        session.events.append(Event("side", "kept out of the tree", None, tokens=len(turn.output_ids)))
        return len(session.side) - 1

    def linearize(self, session_id: str, reward: float = 0.0) -> Linearization:
        session = self._sessions.get(session_id)
        if session is None:
            return Linearization([], [], {}, SessionStats())
        events = list(session.events)
        trained_turns: set[int] = set()
        kept: list[tuple[int, Builder]] = []
        leaves = session.tree.leaves()
        for leaf in leaves:
            for builder in linearize_chain(
                leaf, trained_turns, self.fork_threshold_tokens, events, session.tree.prefix_cache
            ):
                if 1 not in builder.loss:
                    events.append(
                        Event(
                            "drop",
                            "no trained token",
                            builder.spans[-1].turn_index if builder.spans else None,
                            leaf=leaf.id,
                        )
                    )
                    continue
                trained_turns.update(s.turn_index for s in builder.spans if s.trained)
                kept.append((leaf.id, builder))
        share = reward / len(kept) if kept and self.reward_policy == "split" else reward
        samples: list[Sample] = []
        spans: list[list[Span]] = []
        leaf_samples: dict[int, list[int]] = {}
        for leaf_id, builder in kept:
            sample = builder.to_sample(share, self._metadata(session_id, leaf_id, builder), self.response_start)
            assert sample is not None
            leaf_samples.setdefault(leaf_id, []).append(len(samples))
            samples.append(sample)
            spans.append(list(builder.spans))
        trained = sum(sum(s.loss_mask) for s in samples)
        # Every turn the tree holds was sent to the agent and is meant for training (side turns are not; a
        # duplicate is one generation): trained tokens are exactly these outputs' tokens, each trained once.
        emitted = sum(len(n.turn.output_ids) for n in session.tree.nodes if n.turn is not None)
        stats = SessionStats.from_events(
            events,
            turns=session.turns,
            side_turns=len(session.side),
            leaves=len(leaves),
            samples=len(samples),
            trained_tokens=trained,
            masked_tokens=sum(s.response_length for s in samples) - trained,
            emitted_tokens=emitted,
        )
        return Linearization(samples, events, leaf_samples, stats, spans)

    @staticmethod
    def _metadata(session_id: str, leaf_id: int, builder: Builder) -> dict[str, Any]:
        turns = [n.turn for n in builder.nodes if n.turn is not None]
        last = turns[-1]
        return {
            "session": session_id,
            "leaf": leaf_id,
            "turns": [s.turn_index for s in builder.spans],
            "trained_turns": [s.turn_index for s in builder.spans if s.trained],
            "truncated": last.finish_reason == "length",
            "aborted": any(t.aborted for t in turns),
            "ill_formed": any(t.ill_formed for t in turns),
            "use_tool": any(bool(n.raw.get("tool_calls")) for n in builder.nodes),
        }

    def samples(self, session_id: str, reward: float = 0.0) -> list[Sample]:
        return self.linearize(session_id, reward).samples

    def stats(self, session_id: str) -> SessionStats:
        return self.linearize(session_id).stats

    def events(self, session_id: str) -> list[Event]:
        return self.linearize(session_id).events

    def export_tree(self, session_id: str, linearization: Linearization | None = None) -> dict[str, Any]:
        """Nodes of the session's tree; leaves name their samples in `linearization` (default: a fresh one)."""
        session = self._sessions.get(session_id)
        if session is None:
            raise KeyError(f"unknown session {session_id!r}")
        result = linearization or self.linearize(session_id)
        return {"session": session_id, **session.tree.export(result.leaf_samples)}

    def finish(self, session_id: str, reward: float) -> list[Sample]:
        """Drain: linearize with the reward, then forget the session (a later turn starts afresh)."""
        samples = self.linearize(session_id, reward).samples
        self.drop(session_id)
        return samples

    def drop(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.tree.release()


def _require_prompt(session_id: str, messages: list[dict[str, Any]]) -> None:
    if not messages:
        raise ValueError(
            f"session {session_id!r}: a turn needs its prompt messages (got none); "
            "its reply cannot be placed in the session's tree"
        )
