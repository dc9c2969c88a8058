"""How an engine call's bytes travel: HTTP to a live engine (`HttpTransport`), or whatever a replay plugs in
to answer from a cassette. Everything above it (rids, aborts, the router fallback, error mapping, output
parsing) runs the same either way."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from tito_rl.trajectory.adapters.engine import fast_json

_JSON = {"Content-Type": "application/json"}


class EngineUnreachable(Exception):
    """No HTTP answer: `text` says why (as recorded in the exchange), `timed_out` picks 504 over 502."""

    def __init__(self, text: str, timed_out: bool = False) -> None:
        super().__init__(text)
        self.text = text
        self.timed_out = timed_out


@dataclass
class EngineAnswer:
    status: int
    body: Any  # parsed JSON, or text
    # A replay's answer: how to write `body` again as the recorded engine's bytes (`tito_rl.cassette.answer_bytes`);
    # a replay answering over HTTP serves those. None: re-encoded.
    wire: dict[str, Any] | None = None


class EngineTransport(Protocol):
    async def send(self, method: str, url: str, body: dict[str, Any] | None, headers: dict[str, str]) -> EngineAnswer:
        """One engine call; raises `EngineUnreachable` when no HTTP answer comes."""

    async def close(self) -> None: ...


class HttpTransport:
    """The live engine leg: one aiohttp session, JSON bytes both ways."""

    def __init__(
        self, session_factory: Callable[[], Awaitable[aiohttp.ClientSession]] | None = None, timeout_s: float = 600.0
    ) -> None:
        self._factory = session_factory
        self._session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = await self._factory() if self._factory else aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, method: str, url: str, body: dict[str, Any] | None, headers: dict[str, str]) -> EngineAnswer:
        try:
            session = await self.session()
            # Bytes both ways: aiohttp's JSON payload and text() add ~10% to a call's client-side CPU.
            data = None if body is None else fast_json.dumps(body)
            async with session.request(
                method, url, data=data, headers={**headers, **_JSON} if data else headers, timeout=self.timeout
            ) as resp:
                status = resp.status
                raw = await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise EngineUnreachable(f"{type(exc).__name__}: {exc}", isinstance(exc, asyncio.TimeoutError)) from exc
        try:
            return EngineAnswer(status, fast_json.loads(raw) if raw else None)
        except ValueError:
            return EngineAnswer(status, raw.decode("utf-8", errors="replace"))
