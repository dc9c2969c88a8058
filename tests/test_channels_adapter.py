"""tito's adapter asks an SGLang engine for the channels and carries them into samples, over real HTTP on loopback:
routes when `/get_server_info` says the engine serves them (no flag), from the spliced prefix's last row on; kept
sets when the client samples with top_p < 1; weight versions always. The engine double here answers per
CHANNELS.md with a deterministic MoE (`channel_support.expert_rows`), so the samples' rows are checked against
their own tokens. (The fake engine gains the same channels in its own change; these tests can move onto it.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from tests.adapter_double import EOS
from tests.channel_support import (
    LAYERS,
    TOP_K,
    ChannelEngine,
    b64_npy,
    expected_rows,
    expert_rows,
    script,
    stack,
    tool_loop,
)
from tito_rl.trajectory.manager import TrajectoryManager


async def test_the_adapter_asks_for_routes_from_the_spliced_prefix_and_samples_hold_them(qwen_tokenizer: Any) -> None:
    engine = ChannelEngine(qwen_tokenizer, script())
    async with stack(engine) as url:
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
    async with stack(engine) as url:
        [sample] = await tool_loop(url, "plain")
    assert engine.info_calls == 1
    assert not any("return_routed_experts" in r or "routed_experts_start_len" in r for r in engine.requests)
    assert not any("custom_params" in r["sampling_params"] for r in engine.requests)
    assert "rollout_routed_experts" not in sample and "rollout_top_p_token_ids" not in sample
    assert sample["weight_versions"] == ["step-3"] * 3


async def test_routes_told_by_the_settings_are_never_learned(qwen_tokenizer: Any) -> None:
    engine = ChannelEngine(qwen_tokenizer, script())
    async with stack(engine, engine_routes=True, engine_kept_sets=False) as url:
        [sample] = await tool_loop(url, "told", top_p=0.5)
    assert engine.info_calls == 0
    assert all(r["return_routed_experts"] for r in engine.requests)
    assert not any("custom_params" in r["sampling_params"] for r in engine.requests)
    assert np.array_equal(
        np.asarray(sample["rollout_routed_experts"]).reshape(len(sample["tokens"]) - 1, -1),
        expected_rows(sample["tokens"]),
    )


@dataclass
class VllmChannelEngine:
    """vLLM's `/inference/v1/generate` started with `--enable-return-routed-experts`: every answer carries the
    routes of all its tokens but the last, as base64 `.npy` (uint8), sent unasked; and its weight versions."""

    tokenizer: Any
    script: list[str]
    requests: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/inference/v1/generate", self.generate)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "m"}]})

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        output = self.tokenizer.encode(self.script.pop(0), add_special_tokens=False) + [EOS]
        ids = body["token_ids"] + output
        routes = expert_rows(ids)[:-1].reshape(-1, LAYERS, TOP_K).astype(np.uint8)
        choice = {
            "index": 0,
            "token_ids": output,
            "logprobs": {"content": [{"token_id": t, "logprob": -0.5, "rank": 1} for t in output]},
            "finish_reason": "stop",
            "routed_experts": b64_npy(routes),
            "weight_versions": [{"version": "3", "start": 0, "end": len(output)}],
        }
        return web.json_response({"request_id": body["request_id"], "choices": [choice]})


async def test_vllm_routes_come_unasked_and_each_turn_keeps_only_the_rows_it_adds(qwen_tokenizer: Any) -> None:
    engine = VllmChannelEngine(qwen_tokenizer, script())
    manager = TrajectoryManager()
    async with stack(engine, None, manager, engine_dialect="vllm-generate", engine_model="m") as url:  # type: ignore[arg-type]
        records = []
        original = manager.record_turn

        def keep(sid: str, messages: Any, reply: Any, turn: Any) -> int:
            records.append(turn)
            return original(sid, messages, reply, turn)

        manager.record_turn = keep  # type: ignore[method-assign, assignment]
        [sample] = await tool_loop(url, "vllm")
    assert not any("return_routed_experts" in r for r in engine.requests)  # vLLM is never asked
    tokens = sample["tokens"]
    routes = np.asarray(sample["rollout_routed_experts"])
    assert routes.shape == (len(tokens) - 1, LAYERS, TOP_K)  # the .npy says layers x top_k
    assert np.array_equal(routes.reshape(len(tokens) - 1, -1), expected_rows(tokens))
    assert sample["weight_versions"] == ["3", "3", "3"]
    # The engine sent every row each turn; a spliced turn keeps only those past the turn it continues.
    for earlier, later in zip(records, records[1:], strict=False):
        assert later.routes.start == len(earlier.prompt_ids) + len(earlier.output_ids) - 1
        assert later.routes.end == len(later.prompt_ids) + len(later.output_ids) - 1
