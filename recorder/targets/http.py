"""A gateway that is already running (`--target http://HOST:PORT`): tito taps both of its legs.

Its engine URL must be tito's `--engine-listen`. Samples come from its own session API where it has one
(tito's: `POST /tito/sessions/{sid}/finish {"reward"}` answering `{"samples": [...]}`, and
`DELETE /tito/sessions/{sid}`); a gateway without it (it answers 404, 405 or 501 there, or a 200 without
samples) offers none, and its recordings hold replies and engine calls only. A gateway that fails there (any
other status, a refused connection, a timeout) is a `TargetFailure`, never taken for one that offers none.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import aiohttp

from tito_rl.recorder.targets.base import ROUTING_HEADER, TargetFailure, TargetFinish, TargetInfo

SESSION_API_TIMEOUT_S = 600.0
NO_SESSION_API = frozenset({404, 405, 501})  # what a gateway without tito's session API answers there


class HttpTarget:
    """`session_from`: where the gateway keeps its sessions on the agent leg (`--session-from`, recorded in the
    header; `trajectory.adapters.session_from`)."""

    def __init__(
        self,
        url: str,
        volatile: tuple[str, ...] = (),
        routing_header: str | None = ROUTING_HEADER,
        name: str = "http",
        version: str | None = None,
        session_from: str = "bearer",
    ) -> None:
        self.url = url.rstrip("/")
        self.info = TargetInfo(
            name, version, tuple(volatile), routing_header, {"url": self.url}, session_from=session_from
        )
        self._http: aiohttp.ClientSession | None = None

    async def start(self, engine_url: str) -> str:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SESSION_API_TIMEOUT_S))
        return self.url

    async def finish(self, session: str, reward: float) -> TargetFinish | None:
        status, data = await self._call(
            "POST", f"/tito/sessions/{quote(session, safe='')}/finish", {"reward": reward}, "finish"
        )
        if status in NO_SESSION_API or not isinstance(data, dict) or not isinstance(data.get("samples"), list):
            return None  # the gateway offers no samples: replies and engine calls are still recorded
        samples, stats = data["samples"], data.get("stats")
        return TargetFinish(samples, stats if isinstance(stats, dict) else {})

    async def drop(self, session: str) -> bool:
        status, data = await self._call("DELETE", f"/tito/sessions/{quote(session, safe='')}", None, "drop")
        if status in NO_SESSION_API:
            return False
        return bool(data.get("known", True)) if isinstance(data, dict) else False

    async def _call(self, method: str, path: str, payload: Any, what: str) -> tuple[int, Any]:
        """The session API's status and JSON body (None where it is not JSON); a failure raises."""
        assert self._http is not None, "not started"
        try:
            async with self._http.request(method, self.url + path, json=payload) as resp:
                status, raw = resp.status, await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise TargetFailure(
                f"the gateway at {self.url} did not answer the {what} ({method} {path}): {type(exc).__name__}: {exc}"
            ) from None
        if status != 200 and status not in NO_SESSION_API:
            text = raw.decode("utf-8", errors="replace").strip().replace("\n", " ")
            raise TargetFailure(
                f"the gateway's {what} ({method} {path}) answered {status}" + (f": {text[:200]}" if text else "")
            )
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, None

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
