"""tito's adapter asks an SGLang engine for the channels and carries them into samples, over real HTTP on loopback:
routes when `/get_server_info` says the engine serves them (no flag), from the spliced prefix's last row on; kept
sets when the client samples with top_p < 1; weight versions always. The engine double here answers per
CHANNELS.md with a deterministic MoE (`channel_support.expert_rows`), so the samples' rows are checked against
their own tokens. (The fake engine gains the same channels in its own change; these tests can move onto it.)"""

from __future__ import annotations

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
from tests.channel_support import LAYERS, TOP_K, b64_int32, expected_rows, expert_rows
from tito_rl.trajectory.adapters.app import AdapterSettings, create_app
from tito_rl.trajectory.manager import TrajectoryManager

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
async def stack(tokenizer: Any, engine: ChannelEngine, **settings: Any) -> AsyncIterator[str]:
    server_engine = TestServer(engine.app(), host="127.0.0.1")
    await server_engine.start_server()
    url = str(server_engine.make_url("")).rstrip("/")
    adapter = TestServer(create_app(AdapterSettings(engine_url=url, **settings), TrajectoryManager()), host="127.0.0.1")
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


async def test_the_adapter_asks_for_routes_from_the_spliced_prefix_and_samples_hold_them(qwen_tokenizer: Any) -> None:
    engine = ChannelEngine(qwen_tokenizer, script())
    async with stack(qwen_tokenizer, engine) as url:
        [sample] = await tool_loop(url, "routes", top_p=0.9)
    assert engine.info_calls == 1  # learned once, from the engine
    first, second, third = engine.requests
    assert all(r["return_routed_experts"] is True for r in engine.requests)
    # Turn 0 from row 0; each later prompt is spliced onto the turn before, so it asks from that turn's last token
    # (which has no row yet: this prefill computes it) and no row is sent twice.
    assert first["routed_experts_start_len"] == 0
    for earlier, later, answer in ((first, second, engine.answers[0]), (second, third, engine.answers[1])):
        held = earlier["input_ids"] + answer["output_ids"]
        assert later["input_ids"][: len(held)] == held
        assert later["routed_experts_start_len"] == len(held) - 1
    tokens = sample["tokens"]
    routes = np.asarray(sample["rollout_routed_experts"])
    # SGLang sends a flat row: the sample keeps it whole, in one layer of layers x top_k ids, and says so.
    assert routes.shape == (len(tokens) - 1, 1, LAYERS * TOP_K)
    assert np.array_equal(routes.reshape(len(tokens) - 1, -1), expected_rows(tokens))
    assert "routes_unknown_rows" not in sample["metadata"] and "routes_layout" in sample["metadata"]
    # Kept sets: asked because top_p < 1 (slime's custom_params), CSR over the response, empty where untrained.
    assert all(r["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True} for r in engine.requests)
    offsets, ids = sample["rollout_top_p_token_offsets"], sample["rollout_top_p_token_ids"]
    assert len(offsets) == sample["response_length"] + 1
    first_response = len(tokens) - sample["response_length"]
    for i, trained in enumerate(sample["loss_mask"]):
        kept = ids[offsets[i] : offsets[i + 1]]
        token = tokens[first_response + i]
        assert kept == ([token, token + 1] if trained else [])
    assert sample["weight_versions"] == ["v1", "v1", "v1"]


async def test_an_engine_without_routes_is_not_asked_and_top_p_one_asks_no_kept_sets(qwen_tokenizer: Any) -> None:
    engine = ChannelEngine(qwen_tokenizer, script(), serves_routes=False, version="step-3")
    async with stack(qwen_tokenizer, engine) as url:
        [sample] = await tool_loop(url, "plain")
    assert engine.info_calls == 1
    assert not any("return_routed_experts" in r or "routed_experts_start_len" in r for r in engine.requests)
    assert not any("custom_params" in r["sampling_params"] for r in engine.requests)
    assert "rollout_routed_experts" not in sample and "rollout_top_p_token_ids" not in sample
    assert sample["weight_versions"] == ["step-3"] * 3


async def test_routes_told_by_the_settings_are_never_learned(qwen_tokenizer: Any) -> None:
    engine = ChannelEngine(qwen_tokenizer, script())
    async with stack(qwen_tokenizer, engine, engine_routes=True, engine_kept_sets=False) as url:
        [sample] = await tool_loop(url, "told", top_p=0.5)
    assert engine.info_calls == 0
    assert all(r["return_routed_experts"] for r in engine.requests)
    assert not any("custom_params" in r["sampling_params"] for r in engine.requests)
    assert np.array_equal(
        np.asarray(sample["rollout_routed_experts"]).reshape(len(sample["tokens"]) - 1, -1),
        expected_rows(sample["tokens"]),
    )
