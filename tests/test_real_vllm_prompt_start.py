"""vLLM 0.32's `routed_experts_prompt_start` checked against the real vLLM (marked real_engine: `make
test-real-engine`). Its CPU build cannot return routes (Model Runner V2 needs Triton), so what can be held to it is
where the field goes and how a bad one is refused: the same requests to the real engine and to the fake engine as
vLLM 0.32 get the same status, and the same error `param` and message where vLLM's input processor refuses them
(its pydantic refusals are compared by their reason only: the fake does not copy pydantic's error list). The rows the
fake cuts by the start are held to vLLM's source in tests/test_fake_engine_vllm_prompt_start.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from tests.fake_engine_helpers import tokenizer
from tests.test_real_engine import FULL_FLAGS
from tito_rl.fake_engine.app import EngineOptions, create_app
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.recorder.engine_contract.exchange import Answer, send
from tito_rl.recorder.real_engine.paths import SERVED_MODEL_NAME

TOKENS, COMPLETIONS = "/inference/v1/generate", "/v1/completions"


def requests_for(prompt: list[int]) -> list[tuple[str, dict[str, Any]]]:
    n = len(prompt)

    def generate(start: Any) -> dict[str, Any]:
        params = {"max_tokens": 4, "temperature": 0.0, "routed_experts_prompt_start": start}
        return {"token_ids": prompt, "sampling_params": params}

    def completion(start: Any) -> dict[str, Any]:
        return {"model": SERVED_MODEL_NAME, "prompt": prompt, "max_tokens": 4, "routed_experts_prompt_start": start}

    return [
        (TOKENS, generate(0)),
        (TOKENS, generate(n)),
        (TOKENS, generate(n + 1)),
        (TOKENS, generate(-1)),
        (TOKENS, generate("3")),  # taken: pydantic reads "3" as 3
        (TOKENS, generate("three")),
        (COMPLETIONS, completion(n)),
        (COMPLETIONS, completion(n + 1)),
        (COMPLETIONS, completion(-1)),
    ]


def fake_answers(calls: list[tuple[str, dict[str, Any]]]) -> list[Answer]:
    async def main() -> list[Answer]:
        policy = ScriptedPolicy(parse_scenario({"after_last": "repeat", "turns": ["four words of text"]}), tokenizer())
        options = EngineOptions(tokenizer=tokenizer(), openai_dialect="vllm-openai", model_name=SERVED_MODEL_NAME)
        server = TestServer(create_app(policy, options), host="127.0.0.1")
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            return [await asyncio.to_thread(send, url, "POST", path, body) for path, body in calls]
        finally:
            await server.close()

    return asyncio.run(main())


@pytest.mark.real_engine
def test_the_fake_takes_and_refuses_the_prompt_start_as_the_real_vllm_does(real_engines: Any) -> None:
    server = real_engines.get(FULL_FLAGS)
    prompt = list(tokenizer().encode("The capital of France is", add_special_tokens=False))
    calls = requests_for(prompt)
    real = [send(server.url, "POST", path, body) for path, body in calls]
    fake = fake_answers(calls)
    for (path, body), theirs, ours in zip(calls, real, fake, strict=True):
        what = f"{path} {body.get('routed_experts_prompt_start', body.get('sampling_params'))}"
        assert theirs.status == ours.status, f"{what}: real {theirs.status} {theirs.body}, fake {ours.status}"
        if theirs.status == 200:
            # no routes from a CPU vLLM: the key is there, null, on the fake too when started without routes
            assert theirs.body["choices"][0].get("routed_experts") is None, what
            assert ours.body["choices"][0].get("routed_experts") is None, what
            continue
        real_error, fake_error = theirs.body["error"], ours.body["error"]
        if "between 0 and the prompt length" in real_error["message"]:
            assert (fake_error["message"], fake_error["param"]) == (real_error["message"], real_error["param"]), what
        else:  # pydantic's refusal: the same reason
            reason = "greater than or equal to 0" if "greater than" in real_error["message"] else "valid integer"
            assert reason in real_error["message"] and reason in fake_error["message"], (what, real_error)
