"""Noticing agents that hang up mid-generation, with one timer for all requests instead of one per request.

aiohttp does not tell a handler that its client left (unless the server cancels handlers, which would also
cut a reply mid-write). The adapter therefore checks the transports of requests waiting on the engine.
Polled per request, that cost ~40 us every 50 ms of each generation: at 64 agents, about a tenth of the
proxy's CPU, all of it on the loop that serves replies. One shared tick costs a few microseconds per
waiting request and none when nothing waits.
"""

from __future__ import annotations

import asyncio
from typing import Any


class DisconnectWatcher:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._watched: dict[asyncio.Future[None], Any] = {}  # future -> the request's transport owner
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's: an app can outlive a test's loop

    def watch(self, request: Any) -> asyncio.Future[None]:
        """A future that completes when `request`'s client has gone; pass it to `unwatch` when done."""
        loop = asyncio.get_running_loop()
        gone: asyncio.Future[None] = loop.create_future()
        self._watched[gone] = request
        if self._timer is None or self._loop is not loop:
            self._loop, self._timer = loop, loop.call_later(self.interval_s, self._tick)
        return gone

    def unwatch(self, gone: asyncio.Future[None]) -> None:
        self._watched.pop(gone, None)
        if not gone.done():
            gone.cancel()

    def _tick(self) -> None:
        self._timer = None
        for gone, request in list(self._watched.items()):
            transport = request.transport
            if transport is None or transport.is_closing():
                del self._watched[gone]
                if not gone.done():
                    gone.set_result(None)
        if self._watched:
            self._timer = self._loop.call_later(self.interval_s, self._tick)  # type: ignore[union-attr]
