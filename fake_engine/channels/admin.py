"""The admin routes around a weight update: pause, update the version, continue; SGLang's and vLLM's.

SGLang 0.5.23 (`srt/entrypoints/http_server.py`): `POST /pause_generation {"mode": "abort"|"retract"|"in_place"}`
(default abort: every request in flight is aborted, then new ones wait), `POST /continue_generation`, `POST
/update_weight_version {"new_version", "abort_all_requests": true}` (the default aborts every request in flight).
vLLM (its RL routes, `entrypoints/serve/dev/rlhf/api_router.py`): `POST /pause?mode=abort|wait|keep` (abort:
in-flight requests end aborted; wait: they run to their end first; keep: they freeze and resume), `POST /resume`,
`GET /is_paused`, `POST /update_weight_version {"new_version"}` (no abort), `GET /weight_info`. The two engines
share the `/update_weight_version` path: the answer is vLLM's when the engine is told to be vLLM
(`--openai-dialect vllm-openai`), else SGLang's. A paused engine holds every request at its next token; an aborted
one ends with finish reason abort, as each engine answers an abort.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from aiohttp import web

from tito_rl.fake_engine.channels.versions import WeightVersions
from tito_rl.fake_engine.serving import Tracked, json_response
from tito_rl.fake_engine.sglang.validation import parse_failure
from tito_rl.trajectory.dialects.view import VLLM_GENERATE, VLLM_OPENAI

SGLANG_PAUSE_MODES = ("abort", "retract", "in_place")
VLLM_PAUSE_MODES = ("abort", "wait", "keep")


class AdminEngine(Protocol):
    """What the routes need of `app.Engine`."""

    options: Any
    tracked: dict[str, Tracked]
    weights: WeightVersions
    paused: asyncio.Event

    def abort(self, rid: str, abort_all: bool) -> int: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def update_weight_version(self, new_version: str, abort_all: bool) -> None: ...


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise web.HTTPBadRequest(
            text=json.dumps(parse_failure(f"JSON decode error: {e}").body), content_type="application/json"
        ) from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(
            text=json.dumps(parse_failure("Input should be a valid dictionary").body), content_type="application/json"
        )
    return body


class AdminRoutes:
    def __init__(self, engine: AdminEngine) -> None:
        self.engine = engine

    @property
    def vllm(self) -> bool:
        return self.engine.options.openai_dialect in (VLLM_OPENAI, VLLM_GENERATE)

    async def _abort_in_flight(self) -> None:
        """Abort every request and wait until each has answered."""
        hits = list(self.engine.tracked.values())
        self.engine.abort("", True)
        await asyncio.gather(*(t.done.wait() for t in hits))

    # ---- SGLang ------------------------------------------------------------------------------------
    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await _body(request)
        version = body.get("new_version")
        if not isinstance(version, str):
            return json_response(parse_failure("body.new_version: Field required (a string)").body, 400)
        if self.vllm:
            self.engine.update_weight_version(version, abort_all=False)
            return json_response({"success": True, "new_version": version})
        abort_all = body.get("abort_all_requests", True)
        self.engine.update_weight_version(version, abort_all=abort_all is not False)
        return json_response(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    async def pause_generation(self, request: web.Request) -> web.Response:
        mode = (await _body(request)).get("mode", "abort")
        if mode not in SGLANG_PAUSE_MODES:
            return json_response(parse_failure("body.mode: Input should be 'abort', 'retract' or 'in_place'").body, 400)
        if mode == "abort":
            await self._abort_in_flight()
        self.engine.pause()
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        await _body(request)
        self.engine.resume()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    # ---- vLLM --------------------------------------------------------------------------------------
    async def pause(self, request: web.Request) -> web.Response:
        mode = request.query.get("mode", "abort")
        if mode not in VLLM_PAUSE_MODES:
            return json_response({"error": f"Invalid pause mode {mode!r}; expected one of {VLLM_PAUSE_MODES}"}, 400)
        if mode == "abort":
            await self._abort_in_flight()
            self.engine.pause()
        elif mode == "wait":
            in_flight = list(self.engine.tracked.values())
            for t in in_flight:
                t.exempt.set()
            self.engine.pause()
            await asyncio.gather(*(t.done.wait() for t in in_flight))
        else:
            self.engine.pause()
        return json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self.engine.resume()
        return json_response({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return json_response({"is_paused": self.engine.paused.is_set()})

    async def weight_info(self, request: web.Request) -> web.Response:
        return json_response({"weight_version": self.engine.weights.current})


def add_admin_routes(app: web.Application, engine: AdminEngine) -> None:
    admin = AdminRoutes(engine)
    r = app.router
    r.add_post("/update_weight_version", admin.update_weight_version)
    r.add_post("/pause_generation", admin.pause_generation)
    r.add_post("/continue_generation", admin.continue_generation)
    r.add_post("/pause", admin.pause)
    r.add_post("/resume", admin.resume)
    r.add_get("/is_paused", admin.is_paused)
    r.add_get("/weight_info", admin.weight_info)
