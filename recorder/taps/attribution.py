"""Which agent exchange an engine call serves, when the taps sit outside the target.

tito's own adapter tells its tap exactly; a foreign gateway only forwards calls. The rule, in order:

1. The routing key. A gateway that forwards the session id in a header (`X-SMG-Routing-Key` for slime and
   SGLang's router; a driver may name another) has its calls attributed to that session. Within the session,
   a `/generate` goes to the oldest agent request in flight that has not had a `/generate` yet, else to the
   newest in flight (a retry inside one request).
2. `/abort_request {"rid"}` goes to the exchange whose `/generate` carried that rid.
3. No routing key: the session whose last engine context (prompt + output) the new prompt extends furthest;
   when no session's context is extended (first turns), the oldest agent request in flight that has not had a
   `/generate` yet, of any session. Concurrent sessions with identical first prompts can then be told apart
   only by arrival order: a gateway that forwards a routing key never depends on it.
Calls of no session (health checks, `/model_info`; without a routing key, anything but `/generate` and its
abort) are forwarded and not recorded.

Each agent exchange's engine calls are written just before it, as tito's adapter writes them, so a replay
finds each call where the live run made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tito_rl.cassette.format.packing import pack_u32, packed_prefix_len
from tito_rl.trajectory.adapters.tap import EngineExchange

MAX_REMEMBERED_RIDS = 4096


@dataclass(eq=False)
class InFlight:
    """One agent request between its arrival at the agent tap and the write of its exchange."""

    number: int
    session: str  # the live id
    source: str
    arrived: float  # monotonic
    generates: int = 0
    engine: list[EngineExchange] = field(default_factory=list)  # answered calls, in answer order
    running: set[asyncio.Future[Any]] = field(default_factory=set)  # calls still waiting on the engine


@dataclass
class Owner:
    """What an engine call was attributed to: an exchange in flight, or only a session (none in flight)."""

    session: str
    source: str
    flight: InFlight | None = None


class Attribution:
    def __init__(self, routing_header: str | None) -> None:
        self.routing_header = routing_header.lower() if routing_header else None
        self._numbers = itertools.count()
        self.flights: dict[str, list[InFlight]] = {}  # live session id -> requests in flight, in arrival order
        self.sources: dict[str, str] = {}
        self._contexts: dict[str, bytes] = {}  # live session id -> packed last prompt + output
        self._rids: OrderedDict[str, Owner] = OrderedDict()

    # the agent tap's side

    def begin(self, session: str, source: str) -> InFlight:
        flight = InFlight(next(self._numbers), session, source, time.monotonic())
        self.flights.setdefault(session, []).append(flight)
        self.sources.setdefault(session, source)
        return flight

    def end(self, flight: InFlight) -> None:
        flights = self.flights.get(flight.session, [])
        if flight in flights:
            flights.remove(flight)
        if not flights:
            self.flights.pop(flight.session, None)

    # the engine tap's side

    def owner(self, path: str, headers: Mapping[str, str], body: Any) -> Owner | None:
        """The exchange (or session) an engine call serves; None for calls of no session."""
        if path.endswith("/abort_request") and isinstance(body, dict):
            found = self._rids.get(str(body.get("rid")))
            if found is not None:
                return found
        session = self._routing_key(headers)
        if session is not None:
            flight = self._pick(self.flights.get(session, []))
            return Owner(session, self.sources.get(session, "bearer"), flight)
        if not path.endswith("/generate"):
            return None  # without a routing key only a generation says whose it is (by its prompt)
        prompt = body.get("input_ids") if isinstance(body, dict) else None
        flight = self._by_context(prompt) if isinstance(prompt, list) else None
        if flight is None:
            flight = self._pick([f for fs in self.flights.values() for f in fs], oldest_only=True)
        if flight is None:
            return None
        return Owner(flight.session, flight.source, flight)

    def generate_started(self, owner: Owner, body: Any) -> None:
        if owner.flight is not None:
            owner.flight.generates += 1
        if isinstance(body, dict) and body.get("rid") is not None:
            self._rids[str(body["rid"])] = owner
            while len(self._rids) > MAX_REMEMBERED_RIDS:
                self._rids.popitem(last=False)

    def generate_answered(self, owner: Owner, body: Any, response: Any) -> None:
        """Remember the session's engine context, for rule 3."""
        prompt = body.get("input_ids") if isinstance(body, dict) else None
        output = response.get("output_ids") if isinstance(response, dict) else None
        if isinstance(prompt, list) and isinstance(output, list):
            with contextlib.suppress(TypeError, OverflowError):
                self._contexts[owner.session] = pack_u32(prompt) + pack_u32(output)

    def forget(self, session: str) -> None:
        """A finished or dropped session: its context can no longer be extended."""
        self._contexts.pop(session, None)

    def _routing_key(self, headers: Mapping[str, str]) -> str | None:
        if self.routing_header is None:
            return None
        for key, value in headers.items():
            if key.lower() == self.routing_header and value.strip():
                return value.strip()
        return None

    @staticmethod
    def _pick(flights: list[InFlight], oldest_only: bool = False) -> InFlight | None:
        waiting = [f for f in flights if f.generates == 0]
        if waiting:
            return min(waiting, key=lambda f: f.number)
        if oldest_only or not flights:
            return None
        return max(flights, key=lambda f: f.number)

    def _by_context(self, prompt: list[int]) -> InFlight | None:
        try:
            packed = pack_u32(prompt)
        except (TypeError, OverflowError):
            return None
        best, best_len = None, 0
        for session, flights in self.flights.items():
            context = self._contexts.get(session)
            if not context or not flights:
                continue
            common = packed_prefix_len(context, packed)
            if common * 4 == len(context) and common > best_len:  # the prompt extends that session's context
                best, best_len = session, common
        if best is None:
            return None
        return self._pick(self.flights[best])
