"""A deterministic MoE for channel tests: a token's expert row depends only on the ids up to and including it (as a
real model's router, and the fake engine's `--moe`), so any test can recompute the rows a sample must hold.
Also the wire encodings an engine uses for them (CHANNELS.md)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.adapter_double import EngineDouble, qwen3_output
from tito_rl.trajectory.adapters.app import AdapterSettings, create_app
from tito_rl.trajectory.adapters.tap import TrafficTap
from tito_rl.trajectory.channels import KeptSets, Routes, VersionSpan
from tito_rl.trajectory.manager import TrajectoryManager

LAYERS, TOP_K, EXPERTS = 3, 2, 16


def expert_rows(ids: list[int]) -> np.ndarray:
    """`[len(ids), LAYERS * TOP_K]`: row t from a digest of ids[: t + 1]; TOP_K distinct experts a layer."""
    out = np.empty((len(ids), LAYERS * TOP_K), dtype=np.int32)
    h = hashlib.sha256()
    for t, token in enumerate(ids):
        h.update(int(token).to_bytes(4, "little"))
        d = h.copy().digest()
        row = []
        for layer in range(LAYERS):
            first = d[2 * layer] % EXPERTS
            row += [first, (first + 1 + d[2 * layer + 1] % (EXPERTS - 1)) % EXPERTS]
        out[t] = row
    return out


def routes_for(prompt: list[int], output: list[int], start: int) -> Routes:
    """What an engine answers for one call asked from `start`: rows `[start, prompt + output - 1)`."""
    ids = prompt + output
    rows = expert_rows(ids)[start : max(len(ids) - 1, 0)]
    return Routes(start, rows.astype(np.int16), LAYERS, TOP_K)


def kept_for(output: list[int]) -> KeptSets:
    """Token i keeps itself and i % 3 more ids (1 to 3 a token)."""
    ids: list[int] = []
    offsets = [0]
    for i, token in enumerate(output):
        ids += [token] + [10_000 + 10 * i + j for j in range(i % 3)]
        offsets.append(len(ids))
    return KeptSets(np.asarray(ids, np.int32), np.asarray(offsets, np.int32))


def versions(n_out: int, *names: str) -> tuple[VersionSpan, ...]:
    """Spans of the output split evenly among `names` (one name: the whole output)."""
    names = names or ("v1",)
    cuts = [round(n_out * i / len(names)) for i in range(len(names) + 1)]
    return tuple(VersionSpan(v, a, b) for v, a, b in zip(names, cuts, cuts[1:], strict=False))


def b64_int32(values: Any) -> str:
    """SGLang's encoding: base64 of raw little-endian int32, flat."""
    return base64.b64encode(np.ascontiguousarray(values, dtype="<i4").tobytes()).decode()


def b64_npy(array: np.ndarray) -> str:
    """vLLM's encoding: base64 of the `.npy` bytes."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return base64.b64encode(buffer.getvalue()).decode()


def expected_rows(tokens: list[int], unknown: list[list[int]] | None = None) -> np.ndarray:
    """The rows a sample of `tokens` must hold, -1 over the `[start, end)` ranges named unknown."""
    rows = expert_rows(tokens)[: max(len(tokens) - 1, 0)].copy()
    for a, b in unknown or []:
        rows[a:b] = -1
    return rows


# ---- an SGLang double that serves the channels, and an agent loop through tito's adapter ----------------------

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "run",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


@dataclass
class ChannelEngine(EngineDouble):
    """The scripted `/generate` double, plus what an SGLang started with `--enable-return-routed-experts` (and
    slime's top-p patch) answers: routes from `routed_experts_start_len`, kept sets, weight versions."""

    serves_routes: bool = True
    version: str = "v1"
    info_calls: int = 0
    answers: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/get_server_info", self.server_info)
        return app

    async def server_info(self, request: web.Request) -> web.Response:
        self.info_calls += 1
        return web.json_response({"model_path": "m", "enable_return_routed_experts": self.serves_routes})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        answer = await super().generate(request)
        assert isinstance(answer, web.Response) and answer.status == 200 and answer.text is not None
        body, data = self.requests[-1], json.loads(answer.text)
        meta, prompt, output = data["meta_info"], body["input_ids"], data["output_ids"]
        if body.get("return_routed_experts"):
            start = body.get("routed_experts_start_len", 0)
            meta["routed_experts"] = b64_int32(expert_rows(prompt + output)[start : len(prompt) + len(output) - 1])
        if (body["sampling_params"].get("custom_params") or {}).get("return_top_p_token_ids"):
            ids = [t for token in output for t in (token, token + 1)]
            meta["top_p_token_ids"] = b64_int32(ids)
            meta["top_p_token_offsets"] = b64_int32(list(range(0, 2 * len(output) + 1, 2)))
        meta["weight_version"] = self.version
        meta["weight_versions"] = [{"version": self.version, "start": 0, "end": len(output)}]
        self.answers.append(data)
        return web.json_response(data)


@asynccontextmanager
async def stack(
    engine: ChannelEngine, tap: TrafficTap | None = None, manager: TrajectoryManager | None = None, **settings: Any
) -> AsyncIterator[str]:
    """The adapter app in front of `engine`, both on loopback; yields the adapter's URL."""
    server_engine = TestServer(engine.app(), host="127.0.0.1")
    await server_engine.start_server()
    url = str(server_engine.make_url("")).rstrip("/")
    app = create_app(AdapterSettings(engine_url=url, **settings), manager or TrajectoryManager(), tap)
    adapter = TestServer(app, host="127.0.0.1")
    await adapter.start_server()
    try:
        yield str(adapter.make_url("")).rstrip("/")
    finally:
        await adapter.close()
        await server_engine.close()


async def tool_loop(url: str, sid: str, top_p: float | None = None) -> list[dict[str, Any]]:
    """Three turns (a call, another call, an answer), each echoing the replies as sent; the session's samples."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "List the files, then count them."},
    ]
    headers = {"Authorization": f"Bearer {sid}"}
    async with aiohttp.ClientSession() as http:
        for n in range(3):
            body: dict[str, Any] = {"model": "tito", "messages": messages, "tools": [BASH]}
            if top_p is not None:
                body["top_p"] = top_p
            async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                reply = (await resp.json())["choices"][0]["message"]
            messages = [*messages, reply]
            if n < 2:
                call_id = reply["tool_calls"][0]["id"]
                messages.append({"role": "tool", "tool_call_id": call_id, "content": f"out {n}"})
        async with http.post(url + f"/tito/sessions/{sid}/finish", json={"reward": 1.0}) as resp:
            samples: list[dict[str, Any]] = (await resp.json())["samples"]
    return samples


def script() -> list[str]:
    return [
        qwen3_output("", "list first", [("Bash", {"command": "ls"})]),
        qwen3_output("", "", [("Bash", {"command": "ls | wc -l"})]),
        qwen3_output("There are 3 files."),
    ]
