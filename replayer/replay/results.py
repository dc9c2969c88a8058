"""What a replay found, per session and per cassette, and the one line a session gets in the output."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tito_rl.cassette.format.records import Header
from tito_rl.recorder.targets.registry import same_target
from tito_rl.replayer.comparison.differences import Difference
from tito_rl.trajectory.events import coverage_text
from tito_rl.trajectory.manager import Linearization


@dataclass
class FinishResult:
    """One linearization of the session: at a recorded finish, or at the end for a session never finished."""

    reward: float
    live: list[dict[str, Any]] | None  # the samples the live run stored; None: it stored none
    samples: list[dict[str, Any]]  # the replay's, as `Sample.to_dict()` gives them
    linearization: Linearization
    tree: dict[str, Any]


@dataclass
class SessionResult:
    cassette: str
    session: str
    exchanges: int = 0  # agent exchanges replayed
    generations_not_made: int = 0  # recorded /generate calls the replay's target never made (it answered without)
    finishes: list[FinishResult] = field(default_factory=list)
    drops: int = 0
    unsampled_finishes: int = 0  # finishes where neither the recording nor the target had samples
    wire_events: list[str] = field(default_factory=list)  # failed, retried, aborted exchanges (`replay.wire_event`)
    live_samples: list[dict[str, Any]] = field(default_factory=list)  # every sample the live run stored
    differences: list[Difference] = field(default_factory=list)  # failures: the replay stopped at the first
    accepted: list[Difference] = field(default_factory=list)  # differences noted, not failed (--update-goldens)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None  # why nothing was replayed
    golden: str | None = None  # ok, missing, changed, updated, written; None: not checked
    golden_diff: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences and self.golden not in ("missing", "changed")

    @property
    def has_live_samples(self) -> bool:
        return any(f.live is not None for f in self.finishes)

    def counts(self) -> dict[str, Any]:
        stats = [f.linearization.stats for f in self.finishes]
        forks: Counter[str] = Counter()
        for s in stats:
            forks.update(s.forks)
        return {
            "turns": sum(s.turns for s in stats),
            "side": sum(s.side_turns for s in stats),
            "samples": sum(s.samples for s in stats),
            "forks": dict(sorted(forks.items())),
            "realigns": sum(s.realigns for s in stats),
            "masked": sum(s.masked_tokens for s in stats),
            "trained": sum(s.trained_tokens for s in stats),
            "emitted": sum(s.emitted_tokens for s in stats),
        }

    def status(self) -> str:
        if self.skipped:
            return f"skipped ({self.skipped})"
        if self.differences:
            first = self.differences[0]
            return f"FAIL: {first.kind}" + (f" at {first.where()}" if first.where() else "")
        if self.golden in ("missing", "changed"):
            return f"FAIL: golden {self.golden}"
        words = ["ok"]
        if self.golden in ("updated", "written"):
            words.append(f"golden {self.golden}")
        if self.finishes and not self.has_live_samples:
            words.append("no live samples")
        if self.unsampled_finishes and not self.finishes:
            words.append("no samples on either side: replies and engine calls verified")
        if self.drops:
            words.append("dropped" if self.drops == 1 else f"dropped {self.drops} times")
        return ", ".join(words)

    def line(self) -> str:
        c = self.counts()
        forks = ",".join(f"{k}:{v}" for k, v in c["forks"].items()) or "none"
        return (
            f"{self.session}  turns {c['turns']}  side {c['side']}  samples {c['samples']}  forks {forks}  "
            f"realigns {c['realigns']}  masked {c['masked']}  trained {c['trained']}  "
            f"coverage {coverage_text(c['trained'], c['emitted'])}  {self.status()}"
        )


@dataclass
class CassetteResult:
    path: str
    header: Header
    sessions: list[SessionResult]
    truncated: bool = False
    golden_path: str | None = None
    unused_sections: list[str] = field(default_factory=list)  # golden sections for sessions no longer here
    all_sessions: list[str] = field(default_factory=list)  # every session of the cassette, in order
    tokenizer_dir: str | None = None  # the tokenizer the replay used (None: the embedded one)
    target: str = "tito"  # what the sessions were replayed through (`--target`)
    recorded_target: str = "tito"  # what they were recorded around

    @property
    def goldens_apply(self) -> bool:
        """A golden pins a cassette replayed through the target it was recorded around; through another target
        (a conformance run) the replay is compared with the recording only."""
        return same_target(self.target, self.recorded_target)

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.sessions)
