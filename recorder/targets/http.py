"""A gateway that is already running (`--target http://HOST:PORT`): tito taps both of its legs.

Its engine URL must be tito's `--engine-listen`. Samples come from its own session API where it has one
(tito's: `POST /tito/sessions/{sid}/finish {"reward"}` answering `{"samples": [...]}`, and
`DELETE /tito/sessions/{sid}`); a gateway without it records replies and engine calls only.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import aiohttp

from tito_rl.recorder.targets.base import ROUTING_HEADER, TargetFinish, TargetInfo

SESSION_API_TIMEOUT_S = 600.0


class HttpTarget:
    def __init__(self, url: str, volatile: tuple[str, ...] = (), routing_header: str | None = ROUTING_HEADER,
                 name: str = "http", version: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.info = TargetInfo(name, version, tuple(volatile), routing_header, {"url": self.url})
        self._http: aiohttp.ClientSession | None = None

    async def start(self, engine_url: str) -> str:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SESSION_API_TIMEOUT_S))
        return self.url

    async def finish(self, session: str, reward: float) -> TargetFinish | None:
        assert self._http is not None
        try:
            url = f"{self.url}/tito/sessions/{quote(session, safe='')}/finish"
            async with self._http.post(url, json={"reward": reward}) as resp:
                data = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, ValueError, TimeoutError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
            return None  # the gateway offers no samples: replies and engine calls are still recorded
        samples, stats = data["samples"], data.get("stats")
        return TargetFinish(samples, stats if isinstance(stats, dict) else {})

    async def drop(self, session: str) -> bool:
        assert self._http is not None
        try:
            async with self._http.delete(f"{self.url}/tito/sessions/{quote(session, safe='')}") as resp:
                data: Any = await resp.json(content_type=None) if resp.status == 200 else None
        except (aiohttp.ClientError, ValueError, TimeoutError):
            return False
        return bool(data.get("known", True)) if isinstance(data, dict) else False

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
