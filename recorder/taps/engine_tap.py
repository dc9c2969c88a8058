"""The engine-leg tap: the target's engine URL; forwards to the real engine and records each call.

A call is attributed to the agent exchange it serves (`attribution`), and written with it. What the target
sees is what the engine answered, status and body (a streamed answer chunk by chunk), and the call keeps those
bytes (`tito_rl.cassette.answer_bytes`: a replay serves them again); an engine that does not
answer at all is a 502 for the target and a call with status 0 (no HTTP answer) in the cassette. A target that
gives up on a call (its agent hung up) cancels the forwarded call, so the engine sees the disconnect too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from tito_rl.recorder.taps.agent_tap import HOP_HEADERS, REPLY_DROPPED, SSE, forwarded
from tito_rl.recorder.taps.attribution import NO_SESSION
from tito_rl.recorder.taps.recording import Recording
from tito_rl.trajectory.adapters.engine import fast_json
from tito_rl.trajectory.adapters.tap import EngineExchange
from tito_rl.trajectory.dialects.registry import detect_dialect
from tito_rl.trajectory.dialects.view import SGLANG

# Request headers not worth a byte in the cassette: they describe the target's HTTP client, not the call.
CLIENT_HEADERS = HOP_HEADERS | {"user-agent", "accept"}
# The engine's own routes that act on every request at once, as a trainer calls them beside the sessions: weight
# updates, pauses and aborts (SGLang 0.5.23's `http_server.py`; vLLM's RL routes and `/inference/v1/abort_requests`).
# Called by no session, they are kept as engine-wide events (`cassette.format.records.EngineEvent`).
ENGINE_WIDE_PATHS = (
    "/update_weight_version",
    "/pause_generation",
    "/continue_generation",
    "/update_weights_from_disk",
    "/update_weights_from_distributed",
    "/update_weights_from_tensor",
    "/update_weights_from_ipc",
    "/init_weights_update_group",
    "/destroy_weights_update_group",
    "/release_memory_occupation",
    "/resume_memory_occupation",
    "/flush_cache",
    "/abort_request",
    "/pause",
    "/resume",
    "/abort_requests",
    "/update_weights",
    "/collective_rpc",
    "/sleep",
    "/wake_up",
    "/reset_prefix_cache",
)


def is_engine_wide(method: str, path: str) -> bool:
    """A POST to one of `ENGINE_WIDE_PATHS` (a GET, such as vLLM's `/is_paused`, changes nothing)."""
    return method == "POST" and path.rstrip("/").endswith(ENGINE_WIDE_PATHS)


def event_jsons(text: str) -> list[Any]:
    """A streamed answer's `data:` payloads before `[DONE]`, each parsed where it is JSON."""
    events: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            if data and data != "[DONE]":
                try:
                    events.append(fast_json.loads(data))
                except ValueError:
                    events.append(data)
    return events


def last_event_json(text: str) -> Any:
    """The final body of a streamed answer: its last `data:` JSON before `[DONE]` (SGLang's last chunk)."""
    events = event_jsons(text)
    return events[-1] if events else None


def streamed_response(dialect: str, text: str) -> Any:
    """What a cassette keeps of a streamed answer: SGLang's `/generate` chunks are cumulative, so its last one
    says everything; an OpenAI-style stream is deltas, so every chunk is kept, in order."""
    return last_event_json(text) if dialect == SGLANG else event_jsons(text)


class EngineTap:
    """`dialect`: the engine's dialect when the user named it (`--engine-dialect`); else read from each call."""

    def __init__(self, recording: Recording, engine_url: str, dialect: str | None = None) -> None:
        self.recording = recording
        self.engine_url = engine_url.rstrip("/")
        self.dialect = dialect
        self.http: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024 * 1024)
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
        try:
            data = fast_json.loads(body) if body else None
        except ValueError:
            data = None
        owner = self.recording.attribution.owner(request.path, request.headers, data)
        if owner is None and is_engine_wide(request.method, request.path):  # a trainer's update, pause or abort
            return await self._engine_wide(request, body, data)
        if owner is None or owner.session == NO_SESSION:  # no session's call (health, model info): not recorded
            return await self._relay(request, body, None)
        call = asyncio.get_running_loop().create_future()
        self.recording.engine_started(owner, data, call)
        order = self.recording.next_order()
        started = self.recording.elapsed(owner.session)
        exchange = EngineExchange(
            request.method,
            request.path,
            data if isinstance(data, dict) else None,
            0,
            headers=forwarded(request.headers, CLIENT_HEADERS),
            started_s=started,
            dialect=detect_dialect(request.path, data, hint=self.dialect),
        )
        try:
            return await self._relay(request, body, exchange)
        except asyncio.CancelledError:
            exchange.error = exchange.error or "the target hung up before the engine answered"
            raise
        finally:
            exchange.duration_s = self.recording.elapsed(owner.session) - started
            exchange.order = [order, self.recording.next_order()]
            call.set_result(None)
            self.recording.engine_answered(owner, exchange, call)

    async def _engine_wide(self, request: web.Request, body: bytes, data: Any) -> web.StreamResponse:
        """Relayed as any call, and kept as an engine-wide event with its place among the sessions' calls."""
        order = self.recording.next_order()
        exchange = EngineExchange(
            request.method,
            request.path_qs,
            data if isinstance(data, dict) else None,
            0,
            dialect=detect_dialect(request.path, data, hint=self.dialect),
        )
        try:
            return await self._relay(request, body, exchange)
        finally:
            exchange.order = [order, self.recording.next_order()]
            self.recording.engine_event(exchange)

    def streamed(self, exchange: EngineExchange, text: str) -> Any:
        """What is recorded of a streamed answer's whole text (`streamed_response`); a tap that keeps more of a
        stream (the engine contract keeps every event and the `[DONE]` marker) sees the text here."""
        return streamed_response(exchange.dialect or SGLANG, text)

    async def _relay(self, request: web.Request, body: bytes, exchange: EngineExchange | None) -> web.StreamResponse:
        assert self.http is not None
        try:
            async with self.http.request(
                request.method, self.engine_url + request.path_qs, data=body or None, headers=forwarded(request.headers)
            ) as upstream:
                headers = forwarded(upstream.headers, REPLY_DROPPED)
                if upstream.content_type == SSE:
                    response = web.StreamResponse(status=upstream.status, headers=headers)
                    await response.prepare(request)
                    received = bytearray()
                    try:
                        async for chunk in upstream.content.iter_any():
                            received += chunk
                            await response.write(chunk)
                        await response.write_eof()
                    except aiohttp.ClientError as exc:  # the engine cut its stream: so does the tap
                        response.force_close()
                        if exchange is not None:
                            exchange.error = f"{type(exc).__name__}: {exc}"
                    if exchange is not None:
                        exchange.status = upstream.status
                        exchange.response = self.streamed(exchange, received.decode("utf-8", errors="replace"))
                        exchange.raw, exchange.content_type = bytes(received), upstream.headers.get("Content-Type")
                    return response
                payload = await upstream.read()
                if exchange is not None:
                    exchange.status = upstream.status
                    exchange.response = _parsed(payload, upstream.content_type)
                    exchange.raw, exchange.content_type = payload, upstream.headers.get("Content-Type")
                return web.Response(status=upstream.status, body=payload, headers=headers)
        except aiohttp.ClientError as exc:
            error = f"{type(exc).__name__}: {exc}"
            if exchange is not None:
                exchange.error = error
            return web.json_response({"error": {"message": f"tito: the engine did not answer: {error}"}}, status=502)


def _parsed(payload: bytes, content_type: str) -> Any:
    if not payload:
        return None
    text = payload.decode("utf-8", errors="replace")
    if "json" in content_type or text[:1] in "{[":
        try:
            return fast_json.loads(payload)
        except ValueError:
            pass
    return text
