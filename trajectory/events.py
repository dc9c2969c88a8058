"""Why the manager did what it did: one event per routing or linearization decision."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

# Event kinds. Routing: branch, merge, ambiguous, duplicate, side, unspliced (the adapter rendered a prompt
# that continues an earlier turn, for the reason given). Linearization: fork, realign, dedup, drop.
# Fork reasons: prompt (divergence before any response of the sample, or in the context between responses),
# earlier-response (inside a response older than the last one), threshold (inside the last response, but the
# incoming output is not shorter than fork_threshold_tokens).
ROUTING_KINDS = ("branch", "merge", "ambiguous", "duplicate", "side", "unspliced")
LINEARIZATION_KINDS = ("fork", "realign", "dedup", "drop")


@dataclass(frozen=True)
class Event:
    kind: str
    reason: str
    turn: int | None = None  # the turn index the decision was taken at
    token_index: int | None = None  # first divergent token in the incoming prompt, when tokens decided
    leaf: int | None = None  # leaf node id during linearization
    tokens: int = 0  # tokens affected (masked by a realign, carried as context by a dedup, ...)

    def describe(self) -> str:
        parts = [f"{self.kind}({self.reason})"]
        if self.turn is not None:
            parts.append(f"turn={self.turn}")
        if self.token_index is not None:
            parts.append(f"at={self.token_index}")
        if self.leaf is not None:
            parts.append(f"leaf={self.leaf}")
        if self.tokens:
            parts.append(f"tokens={self.tokens}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SessionStats:
    turns: int = 0
    side_turns: int = 0
    leaves: int = 0
    samples: int = 0
    forks: dict[str, int] = field(default_factory=dict)  # by reason
    branches: int = 0
    merges: int = 0
    realigns: int = 0
    realigned_tokens: int = 0  # previously trained tokens turned into masked context by a realign
    dedup_tokens: int = 0  # shared generated tokens carried as context by a later leaf
    dropped_builders: int = 0
    masked_tokens: int = 0  # response-region tokens with loss 0 across samples
    trained_tokens: int = 0  # response-region tokens with loss 1 across samples
    emitted_tokens: int = 0  # output tokens of the turns in the tree (side turns excluded)

    @property
    def coverage(self) -> float | None:
        """Trained emitted tokens / emitted tokens (each output token is trained at most once); None: none."""
        return self.trained_tokens / self.emitted_tokens if self.emitted_tokens else None

    @classmethod
    def from_events(cls, events: list[Event], **counts: int) -> SessionStats:
        forks = Counter(e.reason for e in events if e.kind == "fork")
        stats = cls(forks=dict(sorted(forks.items())), **counts)
        for e in events:
            if e.kind == "branch":
                stats.branches += 1
            elif e.kind == "merge":
                stats.merges += 1
            elif e.kind == "realign":
                stats.realigns += 1
                stats.realigned_tokens += e.tokens
            elif e.kind == "dedup":
                stats.dedup_tokens += e.tokens
            elif e.kind == "drop":
                stats.dropped_builders += 1
        return stats

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def coverage_text(trained: int, emitted: int) -> str:
    """`1.0` only when every emitted token is trained; otherwise rounded down (0.9996 shows as 0.999). More
    trained than emitted (a token trained twice) is never shown as 1.0: it is rounded up and flagged."""
    if not emitted:
        return "-"
    if trained == emitted:
        return "1.0"
    if trained > emitted:
        return f"{-int(-1000 * trained // emitted) / 1000:.3f} (trained more than emitted)"
    return f"{int(1000 * trained / emitted) / 1000:.3f}"
