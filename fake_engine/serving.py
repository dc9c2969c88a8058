"""What every dialect's handlers share with the app: the request record, the prepared output, dropping a
connection on purpose, and the JSON writer. Kept apart from `app.py` so the OpenAI-dialect package can use them
without importing the app that routes to it (no import cycle)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tito_rl.fake_engine.faults import FaultSpec


class Dropped(Exception):
    """The connection was closed on purpose (fault); nothing more is written."""


@dataclass
class Tracked:
    """One request the engine knows by its rid: `/abort_request` sets `aborted`."""

    rid: str
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    running: bool = False
    request: web.Request | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set when its answer is written
    versions: list[str] = field(default_factory=list)  # the weight version current when each output token was made
    pause_at: int | None = None  # a `pause_after` fault: the engine pauses once this many tokens are made
    exempt: asyncio.Event = field(default_factory=asyncio.Event)  # in flight at vLLM's /pause?mode=wait: runs on

    @property
    def produced(self) -> int:
        return len(self.versions)


@dataclass
class Prepared:
    """A request's output once the policy answered and the faults shaped it, before any of it is sent."""

    ids: list[int]
    logprobs: list[float]
    finish: str  # stop | length | abort
    matched: Any
    cached_tokens: int
    faults: FaultSpec


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


def drop(request: web.Request) -> None:
    """Close the socket without an answer (a fault), then unwind with `Dropped`."""
    transport = request.transport
    if transport is not None:
        transport.abort() if hasattr(transport, "abort") else transport.close()
    raise Dropped
