"""The fake engine's per-token channels (issue #46, point 1), seen by a real HTTP client on loopback.

Expert routes in every dialect that has them (SGLang's `/generate`, JSON and SSE, and its OpenAI routes' `sglext`;
vLLM's `/inference/v1/generate`, completions and chat), decoded here as a trainer decodes them (SGLang: base64 of
raw int32; vLLM: `np.load` of a base64 `.npy`) and held to the fake's own router (`channels/moe.routes`): a token's
row depends only on its prefix, so turn 2 routes turn 1's tokens as turn 1 did, and its answer carries the row turn 1
could not (its last sampled token's). Top-p kept sets as slime's SGLang sends them; weight-version spans split by an
update in the middle of a request, and aborted by one that aborts what is in flight (driven by the admin routes and a
`pause_after` fault, never by timing); each known bug's fault gives its wrong shape.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.fake_engine_helpers import BASH, first_prompt, gen_body, serve, sse_events, tokenizer
from tito_rl.fake_engine.app import ENGINE_KEY
from tito_rl.fake_engine.channels.moe import MoeShape, routes
from tito_rl.fake_engine.scenario_model import ScenarioError

SHAPE = MoeShape(3, 2, 8)
ON = {"return_routed_experts": True, "moe": SHAPE}
CHAT, COMPLETIONS, TOKENS = "/v1/chat/completions", "/v1/completions", "/inference/v1/generate"
TWO_TURNS: dict[str, Any] = {"turns": ["Let me look at the files first.", "Done: two files."]}
NEXT_USER = "\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n"


def sglang_rows(encoded: str, shape: MoeShape = SHAPE) -> np.ndarray:
    """What slime does with `meta_info.routed_experts`: raw little-endian int32, reshaped by the model's MoE shape."""
    flat = np.frombuffer(base64.b64decode(encoded), dtype="<i4")
    return flat.reshape(-1, shape.layers, shape.top_k)


def int32s(encoded: str) -> list[int]:
    return np.frombuffer(base64.b64decode(encoded), dtype="<i4").tolist()


def vllm_rows(encoded: str) -> np.ndarray:
    """What verifiers and vime do with vLLM's `routed_experts`: numpy's own loader on the base64 `.npy` bytes."""
    return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)


def routed(body: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**body, "return_routed_experts": True, **extra}


async def generate(s: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with s.post(url + "/generate", json=body) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, Any] = await r.json()
        return answer


def assert_well_formed(rows: np.ndarray, shape: MoeShape = SHAPE) -> None:
    assert rows.shape[1:] == (shape.layers, shape.top_k)
    assert ((rows >= 0) & (rows < shape.experts)).all()
    for row in rows.reshape(-1, shape.top_k):
        assert len(set(row.tolist())) == shape.top_k  # distinct experts per token and layer


# ---- SGLang /generate --------------------------------------------------------------------------------------


async def test_sglang_routes_cover_prompt_and_output_but_the_last_sampled_token():
    prompt = first_prompt()
    async with serve(TWO_TURNS, **ON) as (url, s, _):
        body = await generate(s, url, routed(gen_body(prompt)))
        plain = await generate(s, url, gen_body(prompt))
        async with s.get(url + "/get_server_info") as r:
            info = await r.json()
    ids = prompt + body["output_ids"]
    rows = sglang_rows(body["meta_info"]["routed_experts"])
    assert rows.shape == (len(ids) - 1, SHAPE.layers, SHAPE.top_k)
    assert_well_formed(rows)
    assert (rows == routes(ids, SHAPE)[:-1]).all()
    assert "routed_experts" not in plain["meta_info"]  # not asked: not sent
    assert info["enable_return_routed_experts"] is True
    assert "routed_experts_start_len" not in body["meta_info"]  # 0.5.23 does not echo the start


async def test_sglang_routes_need_the_start_flag():
    async with serve(TWO_TURNS) as (url, s, _):
        body = await generate(s, url, routed(gen_body(first_prompt())))
        async with s.get(url + "/get_server_info") as r:
            info = await r.json()
    assert "routed_experts" not in body["meta_info"] and info["enable_return_routed_experts"] is False


async def test_a_prefix_routes_the_same_in_the_next_turn_which_carries_the_missing_row():
    p1 = first_prompt()
    async with serve(TWO_TURNS, **ON) as (url, s, _):
        turn1 = await generate(s, url, routed(gen_body(p1)))
        o1 = turn1["output_ids"]
        p2 = p1 + o1 + tokenizer().encode(NEXT_USER, add_special_tokens=False)
        turn2 = await generate(s, url, routed(gen_body(p2)))
        start = len(p1) + len(o1) - 1  # the row turn 1 could not send: its last sampled token's
        tail = await generate(s, url, routed(gen_body(p2), routed_experts_start_len=start))
    r1, r2 = sglang_rows(turn1["meta_info"]["routed_experts"]), sglang_rows(turn2["meta_info"]["routed_experts"])
    assert o1[-1] == 151645 and turn2["output_ids"] != o1  # turn 1 stopped on <|im_end|>; turn 2 says its own
    assert len(r1) == start and len(r2) == len(p2) + len(turn2["output_ids"]) - 1
    assert (r2[: len(r1)] == r1).all()  # the shared prefix, routed as turn 1 routed it
    assert (r2[start] == routes(p1 + o1, SHAPE)[start]).all()  # turn 1's last token, routed by turn 2's prefill
    assert (sglang_rows(tail["meta_info"]["routed_experts"]) == r2[start:]).all()  # a reader appends at the start


@pytest.mark.parametrize("start", [0, 3, "prompt"])
async def test_routed_experts_start_len_leaves_out_the_rows_before_it(start: Any):
    prompt = first_prompt()
    start = len(prompt) if start == "prompt" else start
    async with serve(TWO_TURNS, **ON) as (url, s, _):
        body = await generate(s, url, routed(gen_body(prompt), routed_experts_start_len=start))
    ids = prompt + body["output_ids"]
    rows = sglang_rows(body["meta_info"]["routed_experts"])
    assert len(rows) == len(ids) - 1 - start and (rows == routes(ids, SHAPE)[start:-1]).all()


async def test_a_start_outside_the_prompt_is_refused_as_sglang_refuses_it():
    prompt = first_prompt()
    async with serve(TWO_TURNS, **ON) as (url, s, _):
        async with s.post(url + "/generate", json=routed(gen_body(prompt), routed_experts_start_len=-1)) as r:
            low = (r.status, await r.json())
        async with s.post(
            url + "/generate", json=routed(gen_body(prompt), routed_experts_start_len=len(prompt) + 1)
        ) as r:
            high = (r.status, await r.json())
        async with s.post(url + "/generate", json=routed(gen_body(prompt), routed_experts_start_len="3")) as r:
            typed = (r.status, await r.json())
    assert low[0] == 400 and "is lower than 0" in low[1]["error"]["message"]
    assert (
        high[0] == 400
        and f"number of input tokens len(req.origin_input_ids)={len(prompt)}" in high[1]["error"]["message"]
    )
    assert typed == (400, {"error": 'invalid type: string "3", expected i64'})


async def test_sse_meta_is_cumulative_and_the_last_chunk_complete():
    prompt = first_prompt()
    custom = {"return_top_p_token_ids": True}
    body = routed(gen_body(prompt))
    body["sampling_params"] = {**body["sampling_params"], "top_p": 0.9, "custom_params": custom}
    async with serve(TWO_TURNS, **ON) as (url, s, _):
        whole = await generate(s, url, body)
        async with s.post(url + "/generate", json={**body, "stream": True}) as r:
            events = await sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == len(whole["output_ids"])  # one per token (stream_interval 1)
    for chunk in chunks[:-1]:  # SGLang 0.5.23 collects routes when the request finishes: the last chunk only
        meta, n = chunk["meta_info"], len(chunk["output_ids"])
        assert "routed_experts" not in meta
        assert len(int32s(meta["top_p_token_offsets"])) == n + 1
        assert "weight_versions" not in meta  # the spans come with the finished answer (the real 0.5.23's stream)
    last = chunks[-1]["meta_info"]
    for key in ("routed_experts", "top_p_token_ids", "top_p_token_offsets", "weight_versions", "weight_version"):
        assert last[key] == whole["meta_info"][key], key


async def test_kept_sets_hold_the_sampled_token_and_repeat():
    prompt = first_prompt()
    body = gen_body(prompt)
    body["sampling_params"] = {
        **body["sampling_params"],
        "top_p": 0.9,
        "custom_params": {"return_top_p_token_ids": True},
    }
    greedy = gen_body(prompt)
    greedy["sampling_params"] = {
        **greedy["sampling_params"],
        "temperature": 0.0,
        "custom_params": body["sampling_params"]["custom_params"],
    }
    async with serve(TWO_TURNS) as (url, s, _):
        first = await generate(s, url, body)
        again = await generate(s, url, body)
        plain = await generate(s, url, gen_body(prompt))
        argmax = await generate(s, url, greedy)
    meta, out = first["meta_info"], first["output_ids"]
    ids, offsets = int32s(meta["top_p_token_ids"]), int32s(meta["top_p_token_offsets"])
    assert len(offsets) == len(out) + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
    sets = [ids[offsets[i] : offsets[i + 1]] for i in range(len(out))]
    assert all(token in kept and len(set(kept)) == len(kept) for token, kept in zip(out, sets, strict=True))
    assert any(len(kept) > 1 for kept in sets) and all(0 <= t < 151936 for t in ids)
    assert (again["meta_info"]["top_p_token_ids"], again["meta_info"]["top_p_token_offsets"]) == (
        meta["top_p_token_ids"],
        meta["top_p_token_offsets"],
    )
    assert "top_p_token_ids" not in plain["meta_info"]
    assert int32s(argmax["meta_info"]["top_p_token_ids"]) == argmax["output_ids"]  # greedy keeps the sampled one


# ---- SGLang's OpenAI routes ------------------------------------------------------------------------------


async def test_sglang_openai_routes_are_in_the_root_sglext():
    prompt = first_prompt()
    req = {
        "messages": [{"role": "user", "content": "list the files"}],
        "tools": [BASH],
        "input_ids": prompt,
        "return_routed_experts": True,
        "return_token_ids": True,
    }
    completions = {"prompt": prompt, "return_routed_experts": True, "no_stop_trim": True, "return_token_ids": True}
    async with serve(TWO_TURNS, **ON) as (url, s, _):
        async with s.post(url + CHAT, json=req) as r:
            chat = await r.json()
        async with s.post(url + CHAT, json={**req, "return_token_ids": False, "stream": True}) as r:
            chunks = (await sse_events(r))[:-1]
        async with s.post(url + COMPLETIONS, json=completions) as r:
            cmpl = await r.json()
        async with s.post(url + CHAT, json={**req, "return_routed_experts": False}) as r:
            unasked = await r.json()
    out = chat["choices"][0]["response_token_ids"]
    rows = sglang_rows(chat["sglext"]["routed_experts"])
    assert (rows == routes(prompt + out, SHAPE)[:-1]).all()
    assert "sgl_ext" not in chat["choices"][0] and "sglext" not in unasked
    [ext] = [c for c in chunks if "sglext" in c]
    assert ext["choices"] == [] and ext["sglext"] == chat["sglext"]
    assert chunks.index(ext) > max(i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["finish_reason"])
    cmpl_out = cmpl["choices"][0]["token_ids"]
    assert (sglang_rows(cmpl["sglext"]["routed_experts"]) == routes(prompt + cmpl_out, SHAPE)[:-1]).all()


# ---- vLLM ------------------------------------------------------------------------------------------------


def vllm_generate(prompt: list[int], stream: bool = False) -> dict[str, Any]:
    return {"token_ids": prompt, "sampling_params": {"max_tokens": 512, "temperature": 1.0}, "stream": stream}


async def test_vllm_routes_on_every_choice_as_npy():
    prompt = first_prompt()
    chat = {"messages": [{"role": "user", "content": "list the files"}], "return_token_ids": True, "max_tokens": 64}
    async with serve(TWO_TURNS, openai_dialect="vllm-openai", **ON) as (url, s, _):
        async with s.post(url + TOKENS, json=vllm_generate(prompt)) as r:
            body = await r.json()
        async with s.post(url + TOKENS, json=vllm_generate(prompt, stream=True)) as r:
            chunks = (await sse_events(r))[:-1]
        async with s.post(url + COMPLETIONS, json={"prompt": prompt, "return_token_ids": True}) as r:
            cmpl = await r.json()
        async with s.post(url + CHAT, json=chat) as r:
            chat_body = await r.json()
    choice = body["choices"][0]
    rows = vllm_rows(choice["routed_experts"])
    assert rows.dtype == np.uint8  # 8 experts fit a byte
    assert rows.shape == (len(prompt) + len(choice["token_ids"]) - 1, SHAPE.layers, SHAPE.top_k)
    assert (rows == routes(prompt + choice["token_ids"], SHAPE)[:-1]).all()
    assert_well_formed(rows.astype(np.int64))
    assert [c["choices"][0]["routed_experts"] is None for c in chunks] == [True] * (len(chunks) - 1) + [False]
    assert chunks[-1]["choices"][0]["routed_experts"] == choice["routed_experts"]
    c = cmpl["choices"][0]
    assert (vllm_rows(c["routed_experts"]) == routes(prompt + c["token_ids"], SHAPE)[:-1]).all()
    m = chat_body["choices"][0]
    assert (vllm_rows(m["routed_experts"]) == routes(chat_body["prompt_token_ids"] + m["token_ids"], SHAPE)[:-1]).all()
    assert list(m)[-1] == "routed_experts"  # where vLLM 0.32 puts it (the engine contract's recording)


async def test_vllm_routes_off_and_before_0_22_and_wide():
    prompt = first_prompt()
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    async with serve(TWO_TURNS, openai_dialect="vllm-openai") as (url, s, _):
        async with s.post(url + TOKENS, json=vllm_generate(prompt)) as r:
            off = await r.json()
        async with s.post(url + CHAT, json=chat) as r:
            off_chat = await r.json()
    old = serve(TWO_TURNS, openai_dialect="vllm-openai", vllm_version="0.15.1", **ON)
    async with old as (url, s, _), s.post(url + CHAT, json=chat) as r:
        old_chat = await r.json()
    wide = MoeShape(2, 4, 300)
    wide_engine = serve(TWO_TURNS, openai_dialect="vllm-openai", return_routed_experts=True, moe=wide)
    async with wide_engine as (url, s, _), s.post(url + TOKENS, json=vllm_generate(prompt)) as r:
        body = await r.json()
    assert off["choices"][0]["routed_experts"] is None and "routed_experts" not in off_chat["choices"][0]
    assert "routed_experts" not in old_chat["choices"][0]  # vLLM 0.15.1 had no routes
    rows = vllm_rows(body["choices"][0]["routed_experts"])
    assert rows.dtype == np.uint16 and rows.max() < 300 and rows.shape[1:] == (2, 4)
    assert (rows == routes(prompt + body["choices"][0]["token_ids"], wide)[:-1]).all()


# ---- weight versions -----------------------------------------------------------------------------------


async def test_an_update_mid_stream_splits_the_spans():
    """The engine pauses itself after 3 tokens (a fault); seeing the 3rd token's chunk, the test updates the version
    without aborting and continues: tokens 0-2 are `default`'s, the rest `v2`'s."""
    scenario = {"turns": [{"text": "Let me look at the files first.", "faults": {"pause_after": 3}}]}
    async with serve(scenario) as (url, s, app):
        async with s.post(url + "/generate", json=gen_body(first_prompt(), stream=True)) as r:
            seen: list[dict[str, Any]] = []
            async for line in r.content:
                text = line.decode().strip()
                if not text.startswith("data: ") or text == "data: [DONE]":
                    continue
                seen.append(json.loads(text[6:]))
                if len(seen[-1]["output_ids"]) == 3:
                    assert app[ENGINE_KEY].paused.is_set()
                    async with s.get(url + "/is_paused") as p:
                        assert await p.json() == {"is_paused": True}
                    update = {"new_version": "v2", "abort_all_requests": False}
                    async with s.post(url + "/update_weight_version", json=update) as u:
                        assert await u.json() == {
                            "success": True,
                            "message": "Weight version updated to v2",
                            "new_version": "v2",
                        }
                    async with s.post(url + "/continue_generation", json={}) as c:
                        assert await c.json() == {"message": "Generation continued successfully.", "status": "ok"}
        async with s.get(url + "/get_model_info") as r:
            info = await r.json()
    n = len(seen[-1]["output_ids"])
    assert seen[2]["meta_info"]["weight_version"] == "default" and "weight_versions" not in seen[2]["meta_info"]
    meta = seen[-1]["meta_info"]
    assert meta["weight_versions"] == [
        {"version": "default", "start": 0, "end": 3},
        {"version": "v2", "start": 3, "end": n},
    ]
    assert meta["weight_version"] == "v2" and meta["finish_reason"]["type"] == "stop"
    assert info["weight_version"] == "v2"


async def _paused_after(app: Any, pending: asyncio.Task[Any]) -> None:
    """Wait for the engine's own pause (a `pause_after` fault): an event, not a delay."""
    waiter = asyncio.ensure_future(app[ENGINE_KEY].paused.wait())
    await asyncio.wait({pending, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    assert app[ENGINE_KEY].paused.is_set() and not pending.done(), "the engine never paused the request"


async def test_update_weight_version_aborts_what_is_in_flight_by_default():
    turn = {"text": "Let me look at the files first.", "faults": {"pause_after": 2}, "fault_attempts": 1}
    scenario = {"turns": [turn]}  # the fault on the first request only: the one after runs through
    async with serve(scenario) as (url, s, app):
        pending = asyncio.ensure_future(generate(s, url, gen_body(first_prompt())))
        await _paused_after(app, pending)
        async with s.post(url + "/update_weight_version", json={"new_version": "v2"}) as u:
            assert (await u.json())["success"] is True
        body = await asyncio.wait_for(pending, 30)
        async with s.post(url + "/continue_generation", json={}) as c:
            assert c.status == 200
        after = await generate(s, url, gen_body(first_prompt()))
    meta = body["meta_info"]
    assert len(body["output_ids"]) == 2 and meta["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert (
        meta["weight_versions"] == [{"version": "default", "start": 0, "end": 2}]
        and meta["weight_version"] == "default"
    )
    assert after["meta_info"]["weight_version"] == "v2"
    assert after["meta_info"]["weight_versions"] == [{"version": "v2", "start": 0, "end": len(after["output_ids"])}]


async def test_pause_generation_abort_mode_aborts_and_holds_new_requests():
    scenario = {"turns": [{"text": "Let me look at the files first.", "faults": {"pause_after": 1}}]}
    async with serve(scenario) as (url, s, app):
        pending = asyncio.ensure_future(generate(s, url, gen_body(first_prompt())))
        await _paused_after(app, pending)  # held at its 2nd token; the admin's pause (mode abort, the default):
        async with s.post(url + "/pause_generation", json={}) as p:
            assert await p.json() == {"message": "Generation paused successfully.", "status": "ok"}
        body = await asyncio.wait_for(pending, 30)
        async with s.post(url + "/pause_generation", json={"mode": "sideways"}) as bad:
            assert bad.status == 400
    assert body["meta_info"]["finish_reason"]["type"] == "abort" and len(body["output_ids"]) == 1


async def test_vllm_pause_resume_and_weight_versions_per_choice():
    scenario = {"turns": [{"text": "Let me look at the files first.", "faults": {"pause_after": 2}}]}
    async with serve(scenario, openai_dialect="vllm-openai") as (url, s, app):

        async def post() -> dict[str, Any]:
            async with s.post(url + TOKENS, json=vllm_generate(first_prompt())) as r:
                return dict(await r.json())

        pending = asyncio.ensure_future(post())
        await _paused_after(app, pending)
        async with s.post(url + "/update_weight_version", json={"new_version": "step-7"}) as u:
            assert await u.json() == {"success": True, "new_version": "step-7"}  # vLLM's: no message, no abort
        async with s.get(url + "/weight_info") as w:
            assert await w.json() == {"weight_version": "step-7"}
        async with s.post(url + "/resume") as r:
            assert await r.json() == {"status": "resumed"}
        body = await asyncio.wait_for(pending, 30)
        async with s.get(url + "/is_paused") as p:
            assert await p.json() == {"is_paused": False}
        pending = asyncio.ensure_future(post())
        await _paused_after(app, pending)
        async with s.post(url + "/pause?mode=abort") as p:
            assert await p.json() == {"status": "paused"}
        aborted = await asyncio.wait_for(pending, 30)
    choice = body["choices"][0]
    n = len(choice["token_ids"])
    assert choice["weight_versions"] == [
        {"version": "default", "start": 0, "end": 2},
        {"version": "step-7", "start": 2, "end": n},
    ]
    assert aborted["choices"][0]["finish_reason"] == "abort" and len(aborted["choices"][0]["token_ids"]) == 2


async def test_vllm_pause_wait_lets_what_is_in_flight_finish_and_holds_the_rest():
    turn = {"text": "Let me look at the files first.", "faults": {"pause_after": 2}, "fault_attempts": 1}
    async with serve({"turns": [turn]}, openai_dialect="vllm-openai") as (url, s, app):

        async def post() -> dict[str, Any]:
            async with s.post(url + TOKENS, json=vllm_generate(first_prompt())) as r:
                return dict(await r.json())

        in_flight = asyncio.ensure_future(post())
        await _paused_after(app, in_flight)  # held at its 2nd token by the engine's own pause
        async with s.post(url + "/pause?mode=wait") as p:  # answers once the request in flight has finished
            assert await p.json() == {"status": "paused"}
        assert in_flight.done()
        finished = in_flight.result()["choices"][0]
        held = asyncio.ensure_future(post())
        for _ in range(100_000):  # yield until it is admitted (then held at its first token): no clock involved
            if app[ENGINE_KEY].tracked:
                break
            await asyncio.sleep(0)
        assert app[ENGINE_KEY].tracked and not held.done()
        async with s.post(url + "/resume") as r:
            assert r.status == 200
        after = (await asyncio.wait_for(held, 30))["choices"][0]
    assert finished["finish_reason"] == "stop" and after["finish_reason"] == "stop"
    assert after["token_ids"] == finished["token_ids"]


# ---- faults: each known bug's wrong shape ------------------------------------------------------------------


def faulty(**faults: Any) -> dict[str, Any]:
    """Both turns with the faults (scenario files declare them per turn)."""
    return {"turns": [{"text": text, "faults": faults} for text in ("Let me look at the files first.", "Done.")]}


async def test_fault_routes_missing():
    async with serve(faulty(routes_missing=True), **ON) as (url, s, _):
        body = await generate(s, url, routed(gen_body(first_prompt())))
    vllm_engine = serve(faulty(routes_missing=True), openai_dialect="vllm-openai", **ON)
    async with vllm_engine as (url, s, _), s.post(url + TOKENS, json=vllm_generate(first_prompt())) as r:
        vllm = await r.json()
    assert "routed_experts" not in body["meta_info"] and vllm["choices"][0]["routed_experts"] is None


async def test_fault_routes_ignore_start_sends_the_prefix_again():
    prompt = first_prompt()
    async with serve(faulty(routes_ignore_start=True), **ON) as (url, s, _):
        body = await generate(s, url, routed(gen_body(prompt), routed_experts_start_len=10))
    ids = prompt + body["output_ids"]
    rows = sglang_rows(body["meta_info"]["routed_experts"])
    assert len(rows) == len(ids) - 1 != len(ids) - 1 - 10  # a reader appending at 10 holds 10 rows twice


async def test_fault_routes_dummy_row_zeros_the_previous_turns_last_token():
    p1 = first_prompt()
    async with serve(faulty(routes_dummy_row=True), **ON) as (url, s, _):
        o1 = (await generate(s, url, gen_body(p1)))["output_ids"]
        p2 = p1 + o1 + tokenizer().encode(NEXT_USER, add_special_tokens=False)
        body = await generate(s, url, routed(gen_body(p2)))
        first = await generate(s, url, routed(gen_body(p1)))
    ids = p2 + body["output_ids"]
    rows, right = sglang_rows(body["meta_info"]["routed_experts"]), routes(ids, SHAPE)[:-1]
    at = len(p1) + len(o1) - 1
    assert (rows[at] == 0).all() and not (right[at] == 0).all()
    assert [i for i in range(len(rows)) if not (rows[i] == right[i]).all()] == [at]  # that row only
    first_rows = sglang_rows(first["meta_info"]["routed_experts"])
    assert (first_rows[len(p1) - 1] == 0).all()  # a first turn: the last prompt token's row


async def test_fault_routes_zero_padding_and_extra_rows():
    prompt = first_prompt()
    async with serve(faulty(routes_zero_padding=True), **ON) as (url, s, _):
        padded = await generate(s, url, routed(gen_body(prompt)))
    async with serve(faulty(routes_extra_rows=3), **ON) as (url, s, _):
        uncut = await generate(s, url, routed(gen_body(prompt)))
    n = len(prompt) + len(padded["output_ids"])
    rows = sglang_rows(padded["meta_info"]["routed_experts"])
    assert len(rows) == n and (rows[-1] == 0).all()  # a row for the never-forwarded token, expert 0 (not -1)
    assert (rows[:-1] == routes(prompt + padded["output_ids"], SHAPE)[:-1]).all()
    extra = sglang_rows(uncut["meta_info"]["routed_experts"])
    assert len(extra) == len(prompt) + len(uncut["output_ids"]) - 1 + 3  # more rows than the answer has tokens


async def test_fault_stale_weight_version():
    async with serve(faulty(stale_weight_version=True)) as (url, s, _):
        async with s.post(url + "/update_weight_version", json={"new_version": "v3"}) as u:
            assert u.status == 200
        body = await generate(s, url, gen_body(first_prompt()))
    meta = body["meta_info"]
    assert meta["weight_version"] == "default" and {span["version"] for span in meta["weight_versions"]} == {"default"}


# ---- the flags ------------------------------------------------------------------------------------------


def test_moe_shape_from_the_scenario_and_the_command_line():
    import argparse

    from tito_rl.fake_engine.cli import add_arguments, fault_schedule
    from tito_rl.fake_engine.policies.scripted import parse_scenario

    assert parse_scenario({"moe": "4,2,16", "turns": ["hi"]}).moe_shape == MoeShape(4, 2, 16)
    assert parse_scenario({"turns": ["hi"]}).moe_shape is None
    with pytest.raises(ScenarioError, match="LAYERS,TOP_K,EXPERTS"):
        parse_scenario({"moe": "4,2", "turns": ["hi"]})
    with pytest.raises(ScenarioError, match="top_k 9 is more than the 8 experts"):
        parse_scenario({"moe": "2,9,8", "turns": ["hi"]})
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        [
            "--demo",
            "--enable-return-routed-experts",
            "--moe",
            "2,2,8",
            "--fault-routes-extra-rows",
            "2",
            "--fault-stale-weight-version",
        ]
    )
    spec = fault_schedule(args).spec
    assert args.enable_return_routed_experts and MoeShape.parse(args.moe) == MoeShape(2, 2, 8)
    assert spec.routes_extra_rows == 2 and spec.stale_weight_version and not spec.routes_missing


async def test_the_channels_tour_example_plays_each_fault_by_routing_key():
    import yaml

    tour = yaml.safe_load((Path(__file__).parent.parent / "fake_engine/examples/channels_tour.yaml").read_text())
    prompt = first_prompt()
    async with serve(tour, return_routed_experts=True) as (url, s, _):
        answers = {}
        for key in ("routes-missing", "not-cut", None):
            headers = {"X-SMG-Routing-Key": key} if key else {}
            async with s.post(url + "/generate", json=routed(gen_body(prompt)), headers=headers) as r:
                answers[key] = await r.json()
    assert "routed_experts" not in answers["routes-missing"]["meta_info"]
    n = {key: len(prompt) + len(a["output_ids"]) - 1 for key, a in answers.items()}
    assert len(sglang_rows(answers["not-cut"]["meta_info"]["routed_experts"], MoeShape(2, 2, 8))) == n["not-cut"] + 3
    right = sglang_rows(answers[None]["meta_info"]["routed_experts"], MoeShape(2, 2, 8))
    assert (right == routes(prompt + answers[None]["output_ids"], MoeShape(2, 2, 8))[:-1]).all()
