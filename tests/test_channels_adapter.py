"""tito's adapter asks an SGLang engine for the channels and carries them into samples, over real HTTP on loopback:
routes when `/get_server_info` says the engine serves them (no flag), from the spliced prefix's last row on; kept
sets when the client samples with top_p < 1; weight versions always. The engine double here answers per
CHANNELS.md with a deterministic MoE (`channel_support.expert_rows`), so the samples' rows are checked against
their own tokens. (The fake engine gains the same channels in its own change; these tests can move onto it.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.channel_support import LAYERS, TOP_K, ChannelEngine, expected_rows, script, stack, tool_loop


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
