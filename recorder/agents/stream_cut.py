"""A relay between one session's CLI and the recording proxy that cuts chosen replies mid-stream.

A reply stream that ends mid-message (a dropped connection, a load balancer's cut) is a network fault: the
adapter wrote the whole reply, so for it the turn was delivered and recorded; the client saw the stream stop
before its end and sends the identical body again, which the adapter must answer from that first reply
(one turn, no second generation). Nothing in the adapter can produce this, so a scenario asks for it in its
`client:` section (`cut_streams:` of a session, see `recorder/agents/cli_script.py`) and the recorder puts this
relay in front of the proxy for that session only. Everything else passes through byte for byte.
"""

from __future__ import annotations

from collections.abc import Sequence

import aiohttp
from aiohttp import web

from tito_rl.fake_engine.scenario_model import FrozenStrict

# Per connection, or set by aiohttp itself from the bytes it sends: never copied across the relay.
HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
        "host",
        "content-length",
    }
)


class StreamCut(FrozenStrict, frozen=True):
    """Cut the session's `request`-th request (0-based, in arrival order, counting every request) after
    `after_events` server-sent events of its reply, by closing the connection (`cut_streams:` entries)."""

    request: int
    after_events: int

    def __post_init__(self) -> None:
        if self.request < 0 or self.after_events < 1:
            raise ValueError("a stream cut needs request >= 0 and after_events >= 1")


def cut_events(payload: bytes, after_events: int) -> bytes | None:
    """The first `after_events` SSE events of `payload`; None when it has no more events than that."""
    events = payload.split(b"\n\n")
    if len(events) - 1 <= after_events:  # the text after the last blank line is not an event
        return None
    return b"\n\n".join(events[:after_events]) + b"\n\n"


class CuttingRelay:
    """An HTTP relay on a free loopback port in the running event loop; `url` once started."""

    def __init__(self, upstream: str, cuts: Sequence[StreamCut]) -> None:
        self.upstream = upstream.rstrip("/")
        self.cuts = {c.request: c for c in cuts}
        self.seen = 0
        self.cut: list[int] = []  # requests whose reply was cut
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self._http = aiohttp.ClientSession(auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        number, self.seen = self.seen, self.seen + 1
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        assert self._http is not None
        async with self._http.request(
            request.method,
            self.upstream + request.path_qs,
            data=body or None,
            headers=headers,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        ) as up:
            payload = await up.read()
            reply_headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
            status = up.status
        cut = self.cuts.get(number)
        partial = cut_events(payload, cut.after_events) if cut is not None else None
        if partial is None:
            return web.Response(status=status, body=payload, headers=reply_headers)
        resp = web.StreamResponse(status=status, headers=reply_headers)
        resp.content_length = len(payload)  # the client expects the whole reply and gets part of it
        await resp.prepare(request)
        await resp.write(partial)
        self.cut.append(number)
        if request.transport is not None:
            request.transport.close()
        return resp
