"""A session's message tree: routing turns by message identity.

Every root-to-leaf chain is one conversation the agent actually had. A turn's prompt messages are
walked down from the root by canonical equality; what does not match becomes routing-only nodes, and
the reply becomes a *generated* node that owns the TurnRecord. Sub-agents (another system prompt),
compaction (rewritten history) and retried prefixes therefore land on separate chains by construction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.canonical import canonical_message
from tito_rl.trajectory.events import Event
from tito_rl.trajectory.records import TurnRecord


@dataclass(eq=False)
class Node:
    id: int
    role: str
    canon: dict[str, Any]
    raw: dict[str, Any]  # the last wire-translated form seen: a cheap equality fast path for echoes
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    turn: TurnRecord | None = None
    turn_index: int | None = None
    generated: bool = False  # trained from; False for routing-only and demoted (merged) nodes

    def path(self) -> list[Node]:
        out: list[Node] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out


class MessageTree:
    def __init__(self, *, fork_threshold_tokens: int, keep_reasoning: bool = False) -> None:
        self.fork_threshold_tokens = fork_threshold_tokens
        self.keep_reasoning = keep_reasoning
        self.root = Node(id=0, role="root", canon={}, raw={})
        self.nodes: list[Node] = [self.root]
        self.prefix_cache: dict[tuple[int, int], int] = {}  # (previous generated node, node) -> common prefix

    def release(self) -> None:
        """Unlink every node: parent and child links are a cycle, and an ended session's tree (its turns hold
        every prompt's ids) must go by reference counting, not wait for the servers' rare full collection."""
        for node in self.nodes:
            node.parent = None
            node.children = []
            node.turn = None
        self.nodes = []
        self.prefix_cache = {}

    def _canon(self, message: dict[str, Any]) -> dict[str, Any]:
        return canonical_message(message, keep_reasoning=self.keep_reasoning)

    def _new(self, parent: Node, message: dict[str, Any], canon: dict[str, Any] | None = None) -> Node:
        node = Node(
            id=len(self.nodes),
            role=str(message.get("role")),
            canon=self._canon(message) if canon is None else canon,
            raw=message,
            parent=parent,
        )
        parent.children.append(node)
        self.nodes.append(node)
        return node

    def _match(self, parent: Node, message: dict[str, Any]) -> Node | None:
        children = parent.children
        for child in children:  # fast path: the echo is the form we saw last time
            if child.raw == message:
                return child
        if not children:
            return None
        canon = self._canon(message)
        for child in children:
            if child.canon == canon:
                child.raw = message
                return child
        return None

    def route(
        self,
        messages: list[dict[str, Any]],
        reply: dict[str, Any],
        turn: TurnRecord,
        turn_index: int,
        events: list[Event],
    ) -> Node | None:
        """Attach one turn; returns its generated node, or None when it duplicates an existing one."""
        node = self.root
        i = 0
        for i, message in enumerate(messages):  # noqa: B007 - i is the divergence index after the loop
            child = self._match(node, message)
            if child is None:
                break
            node = child
        else:
            i = len(messages)
        rest = messages[i:]
        if rest and rest[0].get("role") == "assistant":
            merged = self._try_merge(node, rest[0], turn_index, i, events)
            if merged is not None:
                node, rest, i = merged, rest[1:], i + 1
        if rest and node.children:
            events.append(Event("branch", f"message {i} ({rest[0].get('role')}) matches no child", turn_index))
        for message in rest:
            node = self._new(node, message)
        canon = self._canon(reply)
        for sibling in node.children:
            if (
                sibling.generated
                and sibling.canon == canon
                and sibling.turn is not None
                and sibling.turn.output_ids == turn.output_ids
                and sibling.turn.prompt_ids == turn.prompt_ids
            ):
                events.append(Event("duplicate", f"same prompt and output as turn {sibling.turn_index}", turn_index))
                return None
        gen = self._new(node, reply, canon)
        gen.generated, gen.turn, gen.turn_index = True, turn, turn_index
        return gen

    def _try_merge(
        self, mount: Node, message: dict[str, Any], turn_index: int, position: int, events: list[Event]
    ) -> Node | None:
        """A short re-rendered assistant leaf replaces its original instead of leaving a dead leaf."""
        assistants = [c for c in mount.children if c.role == "assistant"]
        if len(assistants) > 1:
            events.append(Event("ambiguous", f"message {position}: {len(assistants)} assistant siblings", turn_index))
            return None
        if len(assistants) != 1 or self.fork_threshold_tokens <= 0:
            return None
        old = assistants[0]
        if not old.generated or old.children or old.turn is None:
            return None
        if len(old.turn.output_ids) >= self.fork_threshold_tokens:
            return None
        old.canon, old.raw, old.generated = self._canon(message), message, False
        events.append(
            Event(
                "merge",
                f"rewrite of turn {old.turn_index} replaces it (now routing-only)",
                turn_index,
                tokens=len(old.turn.output_ids),
            )
        )
        return old

    def leaves(self) -> list[Node]:
        return [n for n in self.nodes[1:] if not n.children]

    def export(self, leaf_samples: dict[int, list[int]] | None = None) -> dict[str, Any]:
        leaf_samples = leaf_samples or {}
        return {
            "nodes": [
                {
                    "id": n.id,
                    "parent": n.parent.id if n.parent else None,
                    "role": n.role,
                    "message": n.canon,
                    "generated": n.generated,
                    "turn": n.turn_index,
                    "leaf": not n.children,
                    "samples": leaf_samples.get(n.id, []),
                    # the canonical form leaves reasoning out (harnesses disagree on echoing it): as last seen
                    **({"reasoning": r} if isinstance(r := n.raw.get("reasoning_content"), str) and r else {}),
                    **({"finish": n.turn.finish_reason} if n.turn and n.turn.finish_reason != "stop" else {}),
                }
                for n in self.nodes[1:]
            ],
        }
