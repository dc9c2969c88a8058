"""Weight versions: which policy version produced each output token, as SGLang's `weight_versions` spans say.

The engine holds one current version (`--weight-version`, then each `POST /update_weight_version`); a request notes
the version current when each of its tokens is produced, so an update in the middle of a request splits its spans at
that output position. The spans cover the output (`start` inclusive, `end` exclusive); `weight_version` is the last
span's. A request with no output has one empty span of the version current at its end (SGLang 0.5.23's
`compute_weight_version_spans`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class WeightVersions:
    """The engine's current version and the ones before it (a stale-version fault answers the previous one)."""

    current: str = "default"
    history: list[str] = field(default_factory=list)

    def update(self, new_version: str) -> None:
        self.history.append(self.current)
        self.current = new_version

    @property
    def stale(self) -> str:
        """A version older than the current one: the previous, or a made-up older name before any update."""
        return self.history[-1] if self.history else f"{self.current}-stale"


def spans(per_token: list[str], current: str) -> list[dict[str, Any]]:
    """Runs of one version over the output positions; one empty span of `current` when there is no output."""
    if not per_token:
        return [{"version": current, "start": 0, "end": 0}]
    out: list[dict[str, Any]] = []
    for i, version in enumerate(per_token):
        if out and out[-1]["version"] == version:
            out[-1]["end"] = i + 1
        else:
            out.append({"version": version, "start": i, "end": i + 1})
    return out
