"""What slime's linearization decided for a session, observed while it runs, for `TargetFinish.stats`.

slime's `TrajectoryManager.get_trajectory` returns samples only. Its decisions (CLEAN / REALIGN / FORK per turn,
which builders emit nothing, which turns a later leaf only carries as context) are made by `_SampleBuilder`'s
`classify_token_drift` and `append_turn`. `observe(trajectory_module)` wraps those two methods once per process:
the wrappers call slime's own and return what it returns, and only while a `DriftLog` is active (a context
variable, set around one finish) do they note what happened. slime's results are unchanged; where a later slime
renames these internals the stats shrink to what the samples and the manager's public counters show.

Fork reasons follow tito's (`trajectory/events.py`): `threshold` (divergence inside the last response, but the
incoming output is not shorter than the fork threshold), `earlier-response` (at a trained token of an earlier
response), `prompt` (anywhere else: a prompt or context token).
"""

from __future__ import annotations

from collections import Counter
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

_active: ContextVar[DriftLog | None] = ContextVar("tito_slime_drift_log", default=None)


@dataclass
class _Entry:
    output_tokens: int
    trained: bool


@dataclass
class DriftLog:
    """One finish's observations."""

    kinds: Counter[str] = field(default_factory=Counter)  # clean / realign / fork, per classified turn
    fork_reasons: Counter[str] = field(default_factory=Counter)
    realigned_tokens: int = 0  # trained tokens of a previous response masked by a realign
    dedup_tokens: int = 0  # generated tokens a later leaf carries as context
    builders: dict[int, tuple[Any, list[_Entry]]] = field(default_factory=dict)

    def __enter__(self) -> DriftLog:
        self._token = _active.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _active.reset(self._token)

    def entries(self, builder: Any) -> list[_Entry]:
        return self.builders.setdefault(id(builder), (builder, []))[1]

    def stats(
        self, turns: int, samples: list[dict[str, Any]], leaves: int | None, merges: int | None
    ) -> dict[str, Any]:
        trained = sum(sum(s["loss_mask"]) for s in samples)
        kept = [entries for builder, entries in self.builders.values() if builder.has_trained_response()]
        trained_turns = sum(1 for entries in kept for e in entries if e.trained and e.output_tokens)
        stats: dict[str, Any] = {
            "turns": turns,
            "samples": len(samples),
            "forks": dict(sorted(self.fork_reasons.items())),
            "realigns": self.kinds["realign"],
            "realigned_tokens": self.realigned_tokens,
            "dedup_tokens": self.dedup_tokens,
            "dropped_builders": len(self.builders) - len(kept),
            "trained_tokens": trained,
            "masked_tokens": sum(s["response_length"] for s in samples) - trained,
            "untrained_turns": max(0, turns - trained_turns),
        }
        if leaves is not None:
            stats["leaves"] = leaves
        if merges is not None:
            stats["merges"] = merges
        return dict(sorted(stats.items()))


def _prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _fork_reason(builder: Any, turn: Any) -> str:
    at = _prefix(builder.tokens, turn.prompt_ids)
    start = builder.last_response_start_idx
    if start is not None and at >= start:
        return "threshold"
    if at < len(builder.loss_mask) and builder.loss_mask[at] == 1:
        return "earlier-response"
    return "prompt"


def observe(trajectory: Any) -> bool:
    """Wrap slime's `_SampleBuilder` methods (once); False where this slime has no such internals."""
    builder_class = getattr(trajectory, "_SampleBuilder", None)
    if (
        builder_class is None
        or not hasattr(builder_class, "classify_token_drift")
        or not hasattr(builder_class, "append_turn")
    ):
        return False
    if getattr(builder_class, "_tito_observed", False):
        return True
    classify, append = builder_class.classify_token_drift, builder_class.append_turn

    def classify_token_drift(self: Any, turn: Any) -> Any:
        kind = classify(self, turn)
        log = _active.get()
        if log is not None:
            name = str(getattr(kind, "value", kind))
            log.kinds[name] += 1
            if name == "fork":
                log.fork_reasons[_fork_reason(self, turn)] += 1
        return kind

    def append_turn(self: Any, turn: Any, kind: Any, *, trained: bool = True) -> Any:
        log = _active.get()
        if log is not None:
            entries = log.entries(self)
            if str(getattr(kind, "value", kind)) == "realign" and entries:
                start = self.last_response_start_idx or 0
                log.realigned_tokens += sum(self.loss_mask[start:])
                entries[-1].trained = False
            if not trained:
                log.dedup_tokens += len(turn.output_ids)
            entries.append(_Entry(len(turn.output_ids), trained))
        return append(self, turn, kind, trained=trained)

    classify_token_drift.__wrapped__ = classify  # type: ignore[attr-defined]
    append_turn.__wrapped__ = append  # type: ignore[attr-defined]
    builder_class.classify_token_drift = classify_token_drift
    builder_class.append_turn = append_turn
    builder_class._tito_observed = True
    return True


def tree_counts(manager: Any, session: str) -> tuple[int | None, int | None]:
    """(leaves, rewrite merges) of the session's routing tree before it is linearized; None where unreadable."""
    root = getattr(manager, "_trees", {}).get(session)
    if root is None or not hasattr(root, "leaves"):
        return None, None
    leaves = sum(1 for leaf in root.leaves() if not leaf.is_root)
    merges, stack = 0, [root]
    while stack:
        node = stack.pop()
        merges += "merged_rewrite" in getattr(node, "metadata", {})
        stack.extend(node.children)
    return leaves, merges
