"""`tito record --sample-rate R`: whole sessions, chosen from their id alone, so a rerun of the same run picks the
same sessions again and a higher rate picks a superset of a lower one's.

A session is sampled when the first 8 bytes of the SHA-256 of its live id, read as a fraction of 2**64, fall
below R. The choice is made in the proxy, before anything is sent to the writer process: a session not sampled
costs the proxy's serving and one hash per tap call, nothing more.
"""

from __future__ import annotations

import hashlib
from typing import Any

from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange, TrafficTap, tell_engine_event

SCALE = 1 << 64


def sampled(session: str, rate: float) -> bool:
    """Whether the session with this live id is recorded at `rate` (0 < rate <= 1)."""
    if rate >= 1.0:
        return True
    digest = hashlib.sha256(session.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") < rate * SCALE


class SamplingTap:
    """Passes the calls of sampled sessions to `inner` and drops the rest; it keeps no state, so days of sessions
    cost it no memory."""

    def __init__(self, inner: TrafficTap, rate: float) -> None:
        self.inner, self.rate = inner, rate

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        if sampled(session, self.rate):
            self.inner.agent_request(session, source, headers)

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        if sampled(session, self.rate):
            self.inner.agent_exchange(session, source, exchange)

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        if sampled(session, self.rate):
            self.inner.engine_exchange(session, source, exchange)

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        if sampled(session, self.rate):
            self.inner.session_finished(session, source, reward, samples)

    def session_dropped(self, session: str, source: str) -> None:
        if sampled(session, self.rate):
            self.inner.session_dropped(session, source)

    def engine_event(self, exchange: EngineExchange) -> None:
        """Always kept: an update belongs to no session, and any sampled one may have run beside it."""
        tell_engine_event(self.inner, exchange)

    def close(self) -> None:
        self.inner.close()  # type: ignore[attr-defined]
