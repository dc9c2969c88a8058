"""The agent leg of a replay: recorded requests re-sent to the adapter app, and what it answered.

A request goes back as it was recorded (method, path with any `/s/<sid>` prefix, query, headers, body
bytes), with the session's name where the credential was: the cassette redacted the live token, and the
name is what the adapter derives everything from. A session a gateway keeps elsewhere (`--session-from`: the
session's source is `header:NAME`, `cookie:NAME`, `session-cookie:NAME` or `path:PREFIX`) goes back where it was: a
path or a plain header holds it verbatim already; a cookie (redacted with the rest of the `Cookie` header) or a
credential header gets the session's name again, a signed session cookie the name signed again. One
header, `X-Tito-Replay: <exchange> <session>` (the name percent-quoted: any name a cassette holds survives a
header), tells the replay's middleware which exchange a request is, so engine calls and the reply are attributed
exactly.
The adapter's answer is read off its tap (`ReplayTap`): the reply bytes or SSE events it sent, its status,
turn index and flags, exactly as a recorder would have seen them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode

from aiohttp import web

from tito_rl.cassette.format.records import AgentRecord
from tito_rl.cassette.redaction import REDACTED
from tito_rl.replayer.replay.engine_leg import CURRENT_EXCHANGE
from tito_rl.trajectory.adapters.session_from import COOKIE, HEADER, SESSION_COOKIE, from_source
from tito_rl.trajectory.adapters.signed_cookie import sign_session
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange

REPLAY_HEADER = "X-Tito-Replay"
GATEWAY_SESSIONS = "/sessions/"  # a gateway's session in the URL (tito_rl.recorder.taps.agent_tap.gateway_session)
# Set by the HTTP client for the bytes it sends, or meaningless on a fresh connection.
TRANSPORT_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive", "expect"})


def request_headers(record: AgentRecord, source: str, name: str, index: int) -> dict[str, str]:
    """Recorded headers with the session's name as its credential; other redacted values are left out."""
    headers: dict[str, str] = {}
    where = from_source(source)
    for key, value in record.headers.items():
        lower = key.lower()
        if lower in TRANSPORT_HEADERS:
            continue
        if value == REDACTED or REDACTED in value:
            own = where is not None and where.kind == HEADER and where.name == lower  # `header:NAME`'s header
            if lower == "authorization" and (source == "bearer" or own):
                headers[key] = f"Bearer {name}"
            elif lower in ("x-api-key", "x-goog-api-key") and source == lower:
                headers[key] = name
            elif own:
                headers[key] = name  # a credential header the session came in: its name in its place
            elif where is not None and where.kind == COOKIE and lower == "cookie":
                headers[key] = f"{where.name}={name}"  # the session's cookie; the others were redacted
            elif where is not None and where.kind == SESSION_COOKIE and lower == "cookie":
                # a signed session cookie (NeMo Gym's): the session's id signed again, at the replay's time, with
                # the key the gateway signs with (the cookie's name: trajectory/adapters/signed_cookie.py)
                headers[key] = f"{where.name}={sign_session(name, where.name, int(time.time()))}"
            continue
        headers[key] = value
    headers[REPLAY_HEADER] = f"{index} {quote(name, safe='')}"
    return headers


def request_target(record: AgentRecord, source: str = "", name: str = "") -> str:
    """Path and query as recorded; a redacted `key` parameter (the Gemini API's credential) carries the
    session's name when that is where the live id came from, and so does a redacted session in a gateway's
    URL (`/sessions/<sid>/...`, source `path`: the id was also the agent's token, so the cassette redacted it)."""
    query, path = record.query, record.path
    if source == "query-key" and query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, name if k == "key" and REDACTED in v else v) for k, v in pairs])
    redacted_sid = f"{GATEWAY_SESSIONS}{REDACTED}/"
    if source == "path" and path.startswith(redacted_sid):
        path = f"{GATEWAY_SESSIONS}{quote(name, safe='')}/{path[len(redacted_sid) :]}"
    return path + (f"?{query}" if query else "")


def adapter_target(target: str, source: str, name: str) -> str:
    """A request to a gateway's own session URL (`path:` sources: Agent Lightning's `/proxy/rollout/{sid}/.../v1/...`)
    as tito's adapter serves it, under `/sessions/<name>/` (the URL's session before any credential): a recording
    made around such a gateway replays through tito's adapter with its sessions intact."""
    at = target.find("/v1")
    if not source.startswith("path:") or at <= 0:
        return target
    return f"{GATEWAY_SESSIONS}{quote(name, safe='')}{target[at:]}"


def exchange_of(headers: dict[str, str]) -> tuple[str, int] | None:
    for key, value in headers.items():
        if key.lower() == REPLAY_HEADER.lower():
            index, _, name = value.strip().partition(" ")
            if index.isdigit():
                return unquote(name), int(index)
    return None


@web.middleware
async def exchange_context(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Marks the handler's context with the exchange it serves; the tasks it starts inherit it."""
    token = CURRENT_EXCHANGE.set(exchange_of(dict(request.headers)))
    try:
        return await handler(request)
    finally:
        CURRENT_EXCHANGE.reset(token)


class ReplayTap:
    """A `TrafficTap` that keeps what the adapter reported, keyed by the replayed exchange."""

    def __init__(self) -> None:
        self.exchanges: dict[tuple[str, int], AgentExchange] = {}
        self.finished: dict[str, list[tuple[float, list[dict[str, Any]]]]] = {}
        self.dropped: dict[str, int] = {}
        self._waiters: dict[tuple[str, int], asyncio.Event] = {}
        self.on_exchange: Callable[[str, int], None] | None = None

    def event(self, key: tuple[str, int]) -> asyncio.Event:
        return self._waiters.setdefault(key, asyncio.Event())

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        pass

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        pass  # engine calls are checked where they are answered (`engine_leg`)

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        key = exchange_of(exchange.headers)
        if key is None:
            return
        self.exchanges[key] = exchange
        self.event(key).set()
        if self.on_exchange is not None:
            self.on_exchange(*key)

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self.finished.setdefault(session, []).append((reward, samples))

    def forget(self, session: str) -> None:
        """Drop what was kept of a session whose replay is over."""
        for key in [k for k in self.exchanges if k[0] == session]:
            del self.exchanges[key]
        for key in [k for k in self._waiters if k[0] == session]:
            del self._waiters[key]
        self.finished.pop(session, None)
        self.dropped.pop(session, None)

    def session_dropped(self, session: str, source: str) -> None:
        self.dropped[session] = self.dropped.get(session, 0) + 1
