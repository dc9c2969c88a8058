"""vLLM 0.32's `routed_experts_prompt_start` on the fake engine, seen by a real HTTP client on loopback.

What vLLM 0.32's source does with it (read in the real vLLM venv, `make real-engine`): `SamplingParams` carries it
(`/inference/v1/generate` takes it inside `sampling_params`; chat and completions at the body's root, `Field(ge=0)`);
the input processor refuses a start outside `[0, prompt_len]` for every request, routes served or not, with a 400
naming the parameter (`VLLMValidationError`); the scheduler emits rows from `min(start, prompt_len)`
(`aux_output_connector/connector.py`), so the answer holds rows `[start, prompt + output - 1)` and does not echo the
start. verifiers 0.4.0 asks with it (`clients/train.py`: `max(path_len - 1, 0)` on a bridged turn).
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import pytest

from tests.fake_engine_helpers import first_prompt, serve, sse_events
from tito_rl.fake_engine.channels.moe import MoeShape, routes

SHAPE = MoeShape(3, 2, 8)
ON = {"return_routed_experts": True, "moe": SHAPE}
CHAT, COMPLETIONS, TOKENS = "/v1/chat/completions", "/v1/completions", "/inference/v1/generate"
TWO_TURNS: dict[str, Any] = {"turns": ["Let me look at the files first.", "Done: two files."]}


def vllm_rows(encoded: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)


def generate_body(prompt: list[int], start: Any = None, stream: bool = False) -> dict[str, Any]:
    params: dict[str, Any] = {"max_tokens": 64, "temperature": 1.0}
    if start is not None:
        params["routed_experts_prompt_start"] = start
    return {"token_ids": prompt, "sampling_params": params, "stream": stream}


@pytest.mark.parametrize("where", ["start", "middle", "end"])
async def test_generate_leaves_out_the_rows_before_the_start_json_and_streamed(where: str) -> None:
    prompt = first_prompt()
    start = {"start": 0, "middle": len(prompt) // 2, "end": len(prompt)}[where]
    async with serve(TWO_TURNS, openai_dialect="vllm-openai", **ON) as (url, s, _):
        async with s.post(url + TOKENS, json=generate_body(prompt, start)) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
        async with s.post(url + TOKENS, json=generate_body(prompt, start, stream=True)) as r:
            chunks = (await sse_events(r))[:-1]
    choice = body["choices"][0]
    ids = prompt + choice["token_ids"]
    rows = vllm_rows(choice["routed_experts"])
    assert rows.shape == (len(ids) - 1 - start, SHAPE.layers, SHAPE.top_k)
    assert (rows == routes(ids, SHAPE)[start:-1]).all()
    assert "routed_experts_prompt_start" not in str(body)  # not echoed: the caller keeps it
    assert chunks[-1]["choices"][0]["routed_experts"] == choice["routed_experts"]


async def test_chat_and_completions_take_it_at_the_root() -> None:
    prompt = first_prompt()
    chat = {"messages": [{"role": "user", "content": "list the files"}], "max_tokens": 64}
    async with serve(TWO_TURNS, openai_dialect="vllm-openai", **ON) as (url, s, _):
        body = {"prompt": prompt, "return_token_ids": True, "routed_experts_prompt_start": 5}
        async with s.post(url + COMPLETIONS, json=body) as r:
            cmpl = await r.json()
        async with s.post(url + CHAT, json={**chat, "return_token_ids": True, "routed_experts_prompt_start": 3}) as r:
            chat_body = await r.json()
    c = cmpl["choices"][0]
    assert (vllm_rows(c["routed_experts"]) == routes(prompt + c["token_ids"], SHAPE)[5:-1]).all()
    m = chat_body["choices"][0]
    assert (vllm_rows(m["routed_experts"]) == routes(chat_body["prompt_token_ids"] + m["token_ids"], SHAPE)[3:-1]).all()


async def test_a_start_outside_the_prompt_is_refused_as_vllm_refuses_it_routes_served_or_not() -> None:
    prompt = first_prompt()
    n = len(prompt)
    for engine in (
        serve(TWO_TURNS, openai_dialect="vllm-openai", **ON),
        serve(TWO_TURNS, openai_dialect="vllm-openai"),
    ):
        async with engine as (url, s, _):
            for start in (n + 1, -1):
                async with s.post(url + TOKENS, json=generate_body(prompt, start)) as r:
                    assert r.status == 400
                    error = (await r.json())["error"]
                assert error["param"] == "routed_experts_prompt_start" and error["code"] == 400
                assert error["message"] == (
                    f"routed_experts_prompt_start must be between 0 and the prompt length ({n}), inclusive. "
                    f"(parameter=routed_experts_prompt_start, value={start})"
                )
            # the OpenAI routes' request models refuse a negative start first (pydantic's ge=0), a large one as above
            async with s.post(url + COMPLETIONS, json={"prompt": prompt, "routed_experts_prompt_start": -1}) as r:
                assert r.status == 400
                assert "greater than or equal to 0" in (await r.json())["error"]["message"]
            async with s.post(url + COMPLETIONS, json={"prompt": prompt, "routed_experts_prompt_start": n + 1}) as r:
                assert r.status == 400
                assert f"prompt length ({n})" in (await r.json())["error"]["message"]
            async with s.post(url + TOKENS, json=generate_body(prompt, "three")) as r:
                assert r.status == 400 and "valid integer" in (await r.json())["error"]["message"]
            async with s.post(url + TOKENS, json=generate_body(prompt, "3")) as r:  # read as pydantic reads an int
                assert r.status == 200


async def test_the_start_of_a_bridged_turn_brings_the_previous_turns_last_row() -> None:
    """verifiers' second turn asks from `path_len - 1`: the first row answered is the row turn 1 could not send
    (its last sampled token's), the rest the new tokens' own."""
    prompt = first_prompt()
    async with serve(TWO_TURNS, openai_dialect="vllm-openai", **ON) as (url, s, _):
        async with s.post(url + TOKENS, json=generate_body(prompt)) as r:
            first = (await r.json())["choices"][0]
        history = prompt + first["token_ids"]
        tail = list(range(151_644, 151_650))  # any ids that follow the history
        async with s.post(url + TOKENS, json=generate_body(history + tail, len(history) - 1)) as r:
            second = (await r.json())["choices"][0]
    rows = vllm_rows(second["routed_experts"])
    whole = routes(history + tail + second["token_ids"], SHAPE)
    assert (rows[0] == whole[len(history) - 1]).all()
    assert (np.concatenate([vllm_rows(first["routed_experts"]), rows]) == whole[:-1]).all()


async def test_releases_before_0_32_ignore_the_field() -> None:
    """Only the 0.32 profile reads it (when vLLM added it is not pinned): 0.31.0 answers every row, whatever it says."""
    prompt = first_prompt()
    async with serve(TWO_TURNS, openai_dialect="vllm-openai", vllm_version="0.31.0", **ON) as (url, s, _):
        body = {"prompt": prompt, "return_token_ids": True, "routed_experts_prompt_start": len(prompt) + 5}
        async with s.post(url + COMPLETIONS, json=body) as r:
            assert r.status == 200, await r.text()
            c = (await r.json())["choices"][0]
    assert (vllm_rows(c["routed_experts"]) == routes(prompt + c["token_ids"], SHAPE)[:-1]).all()
