"""The agent-leg tap: agents talk to it, it forwards to the target and records each exchange as answered.

Requests go through byte for byte (hop-by-hop headers aside); a streamed reply reaches the agent chunk by chunk
as the target sends it, and is recorded as its server-sent events. A client that hangs up mid-request cancels
the forwarded request too, so the target sees the disconnect the agent caused (and may abort its generation);
the exchange is recorded with status 499, as tito's adapter records it. The session API
(`POST /tito/sessions/{sid}/finish`, `DELETE /tito/sessions/{sid}`) is the target's finish and drop.

Which session a request is comes from where the target keeps it (`SessionFrom`, `--session-from`); a request
that names none (a health check, a model list) is forwarded and kept apart: no session's, not recorded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from tito_rl.recorder.taps.recording import Recording, body_digest
from tito_rl.recorder.targets.base import TargetFailure
from tito_rl.trajectory.adapters.session import SessionRef
from tito_rl.trajectory.adapters.session_from import GATEWAY_SESSIONS, SessionFrom
from tito_rl.trajectory.adapters.tap import AgentExchange

# Not forwarded: they describe one hop's connection, or would let the target compress what is recorded.
HOP_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
        "proxy-authenticate",
        "accept-encoding",
        "expect",
    }
)
REPLY_DROPPED = HOP_HEADERS | {"content-encoding", "date", "server"}
SSE = "text/event-stream"
Finish = Callable[[str, float], Awaitable[list[dict[str, Any]] | None]]
Drop = Callable[[str], Awaitable[bool | None]]


def forwarded(headers: Any, dropped: frozenset[str] = HOP_HEADERS) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in dropped}


def split_events(text: str) -> list[str]:
    """An SSE body as its events, each with its blank-line terminator (a cut stream keeps its partial tail)."""
    text = text.replace("\r\n", "\n")
    events, start = [], 0
    while (end := text.find("\n\n", start)) != -1:
        events.append(text[start : end + 2])
        start = end + 2
    if start < len(text):
        events.append(text[start:])
    return events


def gateway_session(path: str) -> SessionRef | None:
    """A gateway's session in the URL (`/sessions/<sid>/v1/...`: rllm's gateway, miles' session server): the
    gateway's own session, so it names the recorded session before any credential (all of a rollout's agents
    may share one API key). Part of the default rule, `session_from.bearer_session`."""
    if not path.startswith(GATEWAY_SESSIONS):
        return None
    ref = SessionFrom().resolve(path, {})
    return ref if ref is not None and ref.source == "path" else None


class AgentTap:
    """`finish(sid, reward)` returns the target's samples, or None when it offers none, and raises
    `TargetFailure` when the target failed; `drop(sid)` says whether the target knew the session (None: a target
    that cannot tell). `session_from`: where requests carry their session (default: the credentials, `bearer`)."""

    def __init__(
        self, recording: Recording, target_url: str, finish: Finish, drop: Drop, session_from: SessionFrom | None = None
    ) -> None:
        self.recording = recording
        self.target_url = target_url.rstrip("/")
        self.finish_session, self.drop_session = finish, drop
        self.session_from = session_from or SessionFrom()
        self.http: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/tito/sessions/{sid}/finish", self.finish)
        app.router.add_delete("/tito/sessions/{sid}", self.drop)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, app: web.Application) -> None:
        self.http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False
        )

    async def _close(self, app: web.Application) -> None:
        if self.http is not None:
            await self.http.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        ref = self.session_from.resolve(request.path, request.headers, request.query, body)
        if ref is None:
            return await self._without_session(request, body)
        headers = dict(request.headers)
        flight = self.recording.agent_arrived(ref.sid, ref.source, headers, body)
        started = self.recording.elapsed(ref.sid)
        exchange = AgentExchange(
            request.method, request.path, request.query_string, headers, body, 0, {}, started_s=started
        )
        digest = body_digest(request.method, request.path, request.query_string, body) if body else None
        try:
            return await self._relay(request, body, exchange)
        except asyncio.CancelledError:  # the agent hung up: the forwarded request was cancelled with it
            exchange.status = 499
            raise
        finally:
            exchange.duration_s = self.recording.elapsed(ref.sid) - started
            # Shielded: a cancelled handler still records what happened.
            asyncio.ensure_future(self.recording.agent_answered(flight, exchange, digest))

    async def _without_session(self, request: web.Request, body: bytes) -> web.StreamResponse:
        """A request that names no session: forwarded as any other, recorded nowhere, counted apart; the engine
        calls it causes are forwarded and not recorded either (`Recording.sessionless_arrived`)."""
        flight = self.recording.sessionless_arrived(request.method, request.path, body)
        try:
            return await self._relay(
                request, body, AgentExchange(request.method, request.path, request.query_string, {}, b"", 0, {})
            )
        finally:
            self.recording.sessionless_answered(flight)

    async def _relay(self, request: web.Request, body: bytes, exchange: AgentExchange) -> web.StreamResponse:
        assert self.http is not None
        url = self.target_url + request.path_qs
        try:
            async with self.http.request(
                request.method, url, data=body or None, headers=forwarded(request.headers)
            ) as upstream:
                exchange.status = upstream.status
                exchange.reply_headers = forwarded(upstream.headers, REPLY_DROPPED)
                if upstream.content_type == SSE:
                    return await self._stream(request, upstream, exchange)
                payload = await upstream.read()
                exchange.reply_body = payload
                response = web.Response(status=upstream.status, body=payload, headers=exchange.reply_headers)
                await response.prepare(request)  # sent here, so the exchange is recorded after its last byte
                await response.write_eof()
                return response
        except aiohttp.ClientError as exc:
            payload = json.dumps(
                {
                    "error": {
                        "type": "target_unreachable",
                        "message": f"tito: the target at {self.target_url} did not answer: {type(exc).__name__}: {exc}",
                    }
                }
            ).encode()
            exchange.status, exchange.reply_body = 502, payload
            exchange.reply_headers = {"Content-Type": "application/json"}
            return web.Response(status=502, body=payload, content_type="application/json")

    async def _stream(
        self, request: web.Request, upstream: aiohttp.ClientResponse, exchange: AgentExchange
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, headers=exchange.reply_headers)
        await response.prepare(request)
        received = bytearray()
        try:
            async for chunk in upstream.content.iter_any():
                received += chunk
                await response.write(chunk)
            await response.write_eof()
        except aiohttp.ClientError:  # the target cut its stream: the agent gets the same cut stream
            response.force_close()
        finally:
            exchange.reply_events = split_events(received.decode("utf-8", errors="replace"))
        return response

    async def finish(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        try:
            data = await request.json() if await request.read() else {}
            reward = float(data.get("reward", 0.0))
        except (ValueError, TypeError, AttributeError):
            return web.json_response({"error": {"message": 'body must be {"reward": <float>}'}}, status=400)
        try:
            samples = await self.finish_session(sid, reward)
        except TargetFailure as exc:  # the gateway failed: not the same as a gateway that has no samples
            return web.json_response({"error": {"type": "target_failed", "message": str(exc)}}, status=502)
        if samples is None:
            return web.json_response(
                {"error": {"type": "no_samples", "message": "the target offers no samples"}}, status=404
            )
        self.recording.finished(sid, reward, samples)
        return web.json_response({"samples": samples})

    async def drop(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        try:
            known = await self.drop_session(sid)
        except TargetFailure as exc:  # the gateway failed the drop: the session is not recorded as dropped
            return web.json_response({"error": {"type": "target_failed", "message": str(exc)}}, status=502)
        self.recording.dropped(sid)
        return web.json_response({"dropped": sid, "known": known})
