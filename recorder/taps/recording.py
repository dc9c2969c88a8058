"""What both taps around a target share: the cassette's tap, the attribution of engine calls, the write order.

The taps report to a `TrafficTap` (the cassette writer, usually in its own process) in the order tito's own
adapter does: an agent request's headers first (the recorder learns its secrets), then the engine calls it
caused, then the exchange itself, once its reply's last byte is sent. So a cassette recorded around any gateway
has the layout of one recorded through tito's adapter, and replays the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tito_rl.recorder.taps.attribution import NO_SESSION, Attribution, Decode, InFlight, Owner, header_value
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange, TrafficTap, tell_engine_event

ENGINE_GRACE_S = 5.0  # how long an ended exchange waits for its engine calls (an abort after a disconnect)


@dataclass
class _Session:
    t0: float
    attempts: dict[str, int] = field(default_factory=dict)  # body digest -> seq of its latest attempt
    written: int = 0  # agent exchanges written: the next one's seq
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def body_digest(method: str, path: str, query: str, body: bytes) -> str:
    """What makes two requests the same request (a client's retry re-sends the identical bytes)."""
    return hashlib.sha256(f"{method} {path}?{query}".encode() + b"\0" + body).hexdigest()


class Recording:
    def __init__(self, tap: TrafficTap, routing_header: str | None, decode: Decode | None = None) -> None:
        self.tap = tap
        self.attribution = Attribution(routing_header, decode)
        self.sessions: dict[str, _Session] = {}
        self.open: dict[str, str] = {}  # live session id -> source, for sessions neither finished nor dropped
        self.sessionless: Counter[str] = Counter()  # "METHOD /path" -> requests that named no session
        self.on_sessionless: Callable[[str], None] | None = None  # told each one (the live progress line)
        self._order = itertools.count()  # engine calls' and engine-wide events' starts and answers, in turn

    def next_order(self) -> int:
        """The next place on the engine counter: one per engine call's start and answer, a session's or none's,
        in the order the tap sees them (`EngineRecord.order`): what says which update a call ran beside."""
        return next(self._order)

    def session(self, sid: str) -> _Session:
        if sid not in self.sessions:
            self.sessions[sid] = _Session(time.monotonic())
        return self.sessions[sid]

    def elapsed(self, sid: str) -> float:
        return time.monotonic() - self.session(sid).t0

    # agent leg

    def agent_arrived(self, sid: str, source: str, headers: dict[str, str], body: bytes = b"") -> InFlight:
        self.session(sid)
        self.open.setdefault(sid, source)
        self.tap.agent_request(sid, source, headers)
        return self.attribution.begin(sid, source, header_value(headers, "authorization"), body)

    async def agent_answered(self, flight: InFlight, exchange: AgentExchange, digest: str | None) -> None:
        """Write the exchange after the engine calls it caused (waiting briefly for calls still running)."""
        if flight.running:
            await asyncio.wait(set(flight.running), timeout=ENGINE_GRACE_S)
        state = self.session(flight.session)
        async with state.lock:
            self.attribution.end(flight)
            for call in flight.engine:
                self.tap.engine_exchange(flight.session, flight.source, call)
            flight.engine.clear()
            seq = state.written
            state.written += 1
            if digest is not None:
                exchange.retry_of = state.attempts.get(digest)
                state.attempts[digest] = seq
            self.tap.agent_exchange(flight.session, flight.source, exchange)

    def sessionless_arrived(self, method: str, path: str, body: bytes = b"") -> InFlight:
        """A request that names no session (a health check, a model list): counted, recorded nowhere; in flight
        so that an engine call it causes is known as no session's (`Attribution.owner`)."""
        what = f"{method} {path}"
        self.sessionless[what] += 1
        if self.on_sessionless is not None:
            self.on_sessionless(what)
        return self.attribution.begin(NO_SESSION, "none", body=body)

    def sessionless_answered(self, flight: InFlight) -> None:
        self.attribution.end(flight)

    def sessionless_summary(self) -> str | None:
        """One line on the requests that named no session, or None for none; a POST among them may be a turn
        whose session the target keeps somewhere `--session-from` does not say."""
        if not self.sessionless:
            return None
        total = sum(self.sessionless.values())
        counted = sorted(self.sessionless.items(), key=lambda item: (-item[1], item[0]))
        top = ", ".join(f"{what} ({n})" for what, n in counted[:4])
        more = f", {len(self.sessionless) - 4} more" if len(self.sessionless) > 4 else ""
        hint = (
            "; a POST may be a turn: say where the gateway keeps its sessions with --session-from"
            if any(w.startswith("POST ") for w in self.sessionless)
            else ""
        )
        return f"{total} request(s) named no session: passed through, not recorded: {top}{more}{hint}"

    # engine leg

    def engine_started(self, owner: Owner, body: Any, call: asyncio.Future[Any]) -> None:
        if owner.flight is not None:
            owner.flight.running.add(call)
        self.attribution.generate_started(owner, body)

    def engine_answered(self, owner: Owner, exchange: EngineExchange, call: asyncio.Future[Any]) -> None:
        flight = owner.flight
        if flight is not None:
            flight.running.discard(call)
        if isinstance(exchange.request, dict) and exchange.status == 200:
            self.attribution.generate_answered(
                owner, exchange.path, exchange.request, exchange.response, exchange.dialect
            )
        if flight is not None and flight in self.attribution.flights.get(flight.session, []):
            flight.engine.append(exchange)
        else:  # no request of the session in flight (or it was already written): goes before the next one
            self.session(owner.session)
            self.tap.engine_exchange(owner.session, owner.source, exchange)

    def engine_event(self, exchange: EngineExchange) -> None:
        """An engine call of no session (a trainer's update, pause or abort), written as it is answered."""
        tell_engine_event(self.tap, exchange)

    # session API

    def finished(self, sid: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self.open.pop(sid, None)
        self.attribution.forget(sid)
        self.tap.session_finished(sid, "api", reward, samples)

    def dropped(self, sid: str) -> None:
        self.open.pop(sid, None)
        self.attribution.forget(sid)
        self.tap.session_dropped(sid, "api")
