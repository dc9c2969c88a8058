"""The adapter app's taps: where a recorder listens to both legs of the traffic.

The adapter app calls a `TrafficTap` once an agent request is answered: first with the request's headers,
then with each engine call it made, then with the agent exchange (the request with the reply that was
sent); and when a session finishes or is dropped through the session API. All of it comes after the
reply's last byte, off the agent's wait. The default tap does nothing; the recorder's tap writes a cassette.
Taps receive raw material (secrets included): redaction is the recorder's job, in one place, before
anything reaches disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class AgentExchange:
    """One agent-leg request and the reply the adapter sent back."""

    method: str
    path: str  # as received, path prefix (`/s/<sid>`) included
    query: str
    headers: dict[str, str]
    body: bytes  # request bytes as sent by the agent
    status: int
    reply_headers: dict[str, str]
    reply_body: bytes | None = None  # JSON replies
    reply_events: list[str] | None = None  # SSE replies: each event's raw text, `event:`/`data:` lines
    started_s: float = 0.0  # seconds since the session's first exchange (never wall time)
    duration_s: float = 0.0
    side: bool = False  # title generation, probes: answered but kept out of the agent's tree
    retry_of: int | None = None  # seq of the exchange whose identical body this re-sends
    turn_index: int | None = None  # the manager's turn index when the exchange produced a turn


@dataclass
class EngineExchange:
    """One engine call (`/generate`, `/v1/chat/completions`, `/abort_request`, ...): a streamed OpenAI-style
    answer's `response` is the list of its chunks' JSON, in order (SGLang's `/generate` keeps its last chunk)."""

    method: str
    path: str
    request: dict[str, Any] | None  # JSON body sent
    status: int  # 0 when no HTTP answer came (connection refused, timeout)
    response: Any = None  # parsed JSON body (the final body for a stream), or text
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)  # request headers (routing key)
    started_s: float = 0.0
    duration_s: float = 0.0
    dialect: str | None = None  # `tito_rl.trajectory.dialects.view.DIALECTS`; None: read from the call
    raw: bytes | None = None  # the answer's body as the engine sent it (a stream's whole text); None: not kept
    content_type: str | None = None  # the answer's Content-Type, as the engine sent it
    # `[started, answered]` on the recorder's engine counter (`recorder/taps/recording.py`): where the call sits
    # among every engine call and engine-wide event (a trainer's weight update); None: not counted
    order: list[int] | None = None


class TrafficTap(Protocol):
    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        """An agent request's headers, before any exchange of that request: a recorder learns the secrets
        in them before writing the engine exchanges (whose output may echo them)."""

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        """`source` says where the session id came from: bearer, x-api-key, body, path, or anonymous."""

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None: ...

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None: ...

    def session_dropped(self, session: str, source: str) -> None:
        """The session was forgotten without samples (`DELETE /tito/sessions/<sid>`)."""


class EngineEventTap(Protocol):
    """A tap that also keeps engine calls of no session (`tito_rl.cassette.writer.CassetteWriter.engine_event`):
    a trainer's weight updates, pauses and aborts, as the recorder's engine tap hears them."""

    def engine_event(self, exchange: EngineExchange) -> None: ...


def tell_engine_event(tap: object, exchange: EngineExchange) -> None:
    """Hand `tap` an engine-wide call where it keeps them (`EngineEventTap`); a tap that does not (a replay's,
    tito's own adapter's) never hears of it."""
    keep = getattr(tap, "engine_event", None)
    if callable(keep):
        keep(exchange)


class NullTap:
    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        pass

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        pass

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        pass

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        pass

    def session_dropped(self, session: str, source: str) -> None:
        pass
