"""Faults the fake engine can inject, per scenario turn or for every request from the command line.

One `FaultSpec` describes everything that can go wrong with one /generate call, so a scenario turn and a
CLI flag use the same vocabulary and the app applies them in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import msgspec

from tito_rl.fake_engine.scenario_model import FrozenStrict, NonNegFloat, NonNegInt, PosInt

# 529 is not an SGLang status, but agent CLIs treat it as "overloaded, retry": tests need it.
FaultStatus = Literal[500, 502, 503, 504, 529]
ALLOWED_STATUSES = frozenset(get_args(FaultStatus))


class FaultSpec(FrozenStrict, frozen=True):
    """What goes wrong with one generation. Every field defaults to "nothing"."""

    latency_ms: NonNegFloat = 0.0  # added before the first byte of the answer
    token_delay_ms: NonNegFloat = 0.0  # paid per generated token, so aborts and stream cuts land mid-generation
    status: FaultStatus | None = None  # answer with this HTTP status instead of generating
    message: str = "Internal server error (injected fault)"
    drop_connection: bool = False  # close the socket without an answer
    cut_stream_after: NonNegInt | None = None  # streaming: close the socket after N data events
    finish_length: NonNegInt | None = None  # keep N output tokens, finish_reason length
    abort_after: NonNegInt | None = None  # keep N output tokens, finish_reason abort
    restart_s: NonNegFloat | None = None  # engine restart: drop in-flight work, unhealthy for this long
    drift: bool = False  # emit one token as a non-canonical two-token split
    drift_splits: PosInt = 1  # with drift: split this many tokens, spread over the output (drift.py)
    # The per-token channels' known bugs (channels/routes.py says each one's wrong shape).
    routes_missing: bool = False  # routes asked of an engine started with them: none sent
    routes_ignore_start: bool = False  # every row from 0, `routed_experts_start_len` ignored
    routes_dummy_row: bool = False  # the last generated token's row of the turn before all 0
    routes_zero_padding: bool = False  # a row for the never-forwarded last token, expert 0 where padding means -1
    routes_extra_rows: PosInt | None = None  # N rows past the answer's tokens: routes not cut with the tokens
    stale_weight_version: bool = False  # the weight version(s) answered one older than the engine's current one
    pause_after: NonNegInt | None = None  # the engine pauses itself (in place) after N output tokens

    def merged(self, other: FaultSpec | None) -> FaultSpec:
        """`other`'s non-default fields win: a turn's faults refine the command-line ones."""
        if other is None:
            return self
        default = FaultSpec()
        changes = {
            f.name: getattr(other, f.name)
            for f in msgspec.structs.fields(other)
            if getattr(other, f.name) != getattr(default, f.name)
        }
        return msgspec.structs.replace(self, **changes)

    @property
    def active(self) -> bool:
        return self != FaultSpec()


@dataclass
class FaultSchedule:
    """Command-line faults, applied to a deterministic subset of /generate calls (never random)."""

    spec: FaultSpec = FaultSpec()
    first: int = 0  # only the first N calls (0: every call)
    every: int = 1  # only every k-th call (1-based count divisible by k)
    _count: int = 0

    def next(self) -> FaultSpec:
        self._count += 1
        if not self.spec.active:
            return self.spec
        if self.first and self._count > self.first:
            return FaultSpec()
        if self.every > 1 and self._count % self.every:
            return FaultSpec()
        return self.spec
