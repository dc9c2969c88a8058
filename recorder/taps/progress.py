"""Live progress of a recording: sessions, turns, tokens and errors, on one terminal line.

A tap that counts what passes and forwards everything to the tap that writes; it never changes traffic. Around
a foreign gateway, which says nothing of turns, an agent exchange answered after a generation of its own is a
turn, one answered without a generation a side request; requests that named no session are counted apart.
On a terminal the line is redrawn in place (every 0.5 s at most, and at each finished session); elsewhere
(a CI log, a file) it is a new line at most every 10 s, and a last one when the recording stops.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange, TrafficTap, tell_engine_event
from tito_rl.trajectory.dialects.registry import is_generation, view_of


@dataclass
class Counts:
    sessions: set[str] = field(default_factory=set)
    turns: int = 0
    side: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    errors: int = 0
    finished: int = 0
    sessionless: int = 0  # requests that named no session (health checks, model lists): passed through

    def line(self) -> str:
        apart = f" | {self.sessionless} without a session" if self.sessionless else ""
        return (
            f"sessions {len(self.sessions)} (finished {self.finished}) | turns {self.turns} (+{self.side} side)"
            f" | tokens {self.prompt_tokens} in, {self.output_tokens} out | errors {self.errors}{apart}"
        )


TERMINAL_INTERVAL_S = 0.5
LOG_INTERVAL_S = 10.0


class ProgressTap:
    def __init__(
        self,
        inner: TrafficTap,
        stream: TextIO | None = None,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval_s = (
            interval_s if interval_s is not None else (TERMINAL_INTERVAL_S if self._tty else LOG_INTERVAL_S)
        )
        self.clock = clock
        self.counts = Counts()
        self._last: float | None = None
        self._shown = ""
        self._generated: dict[str, int] = {}  # session -> generations answered since its last agent exchange

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self.counts.sessions.add(session)
        self.inner.agent_request(session, source, headers)

    def without_session(self, what: str) -> None:
        """A request that named no session went through (`Recording.sessionless_arrived`)."""
        self.counts.sessionless += 1
        self.show()

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        self.counts.sessions.add(session)
        generated = self._generated.pop(session, 0)  # its engine calls are written just before it
        if exchange.status >= 400:
            self.counts.errors += 1
        elif exchange.side:
            self.counts.side += 1
        elif exchange.turn_index is not None or generated:
            self.counts.turns += 1
        else:
            self.counts.side += 1
        self.inner.agent_exchange(session, source, exchange)
        self.show()

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        response: Any = exchange.response
        if exchange.path.endswith("/generate") and isinstance(response, dict):
            meta = response.get("meta_info") or {}
            self.counts.prompt_tokens += int(meta.get("prompt_tokens") or 0)
            self.counts.output_tokens += len(response.get("output_ids") or [])
        elif is_generation(exchange.path) and exchange.status == 200:
            view = view_of(exchange.dialect, exchange.path, exchange.request, response)
            self.counts.prompt_tokens += len(view.prompt_ids or ())
            self.counts.output_tokens += len(view.output_ids or ())
        if is_generation(exchange.path) and exchange.status == 200:
            self._generated[session] = self._generated.get(session, 0) + 1
        if exchange.error or exchange.status >= 400 or exchange.status == 0:
            self.counts.errors += 1
        self.inner.engine_exchange(session, source, exchange)
        self.show()

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self.counts.finished += 1
        self.inner.session_finished(session, source, reward, samples)
        self.show(force=True)

    def session_dropped(self, session: str, source: str) -> None:
        self.inner.session_dropped(session, source)

    def engine_event(self, exchange: EngineExchange) -> None:
        tell_engine_event(self.inner, exchange)

    def show(self, force: bool = False) -> None:
        """The line, if `interval_s` has passed since the last one; `force` redraws a terminal's line now (a
        log still waits: its lines are never closer than `interval_s`)."""
        now = self.clock()
        if self._last is not None and now - self._last < self.interval_s and not (force and self._tty):
            return
        self._print(now)

    def flush(self) -> None:
        """The last counts, whatever the interval, unless that line was the last one shown."""
        if self.counts.line() != self._shown:
            self._print(self.clock())

    def _print(self, now: float) -> None:
        self._last = now
        self._shown = self.counts.line()
        end = "\r" if self._tty else "\n"
        print(f"tito record: {self._shown}", end=end, file=self.stream, flush=True)
