"""Validation errors: same status and envelope as SGLang 0.5.23, with its schema as the oracle."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import NoReturn

import pytest

from tests.fake_engine_helpers import first_prompt, gen_body, serve
from tito_rl.fake_engine.sglang.contract import ContractError, check_generate_body
from tito_rl.trajectory.adapters.parsing.sglang_loader import sglang_module

api_types = sglang_module("api.v1.api_types")


class _TorchStandIn(ModuleType):
    """Lets `sglang.srt.sampling.sampling_params` import without torch: it imports torch only for watermarking,
    which verify() never reaches. Any use of torch fails the test instead of passing on a stand-in."""

    def __getattr__(self, name: str) -> NoReturn:
        raise AssertionError(f"SamplingParams used torch.{name}: this oracle now needs torch installed")


def sampling_params_module() -> ModuleType:
    """sglang's SamplingParams module, in an install with no torch (tito's) as well as with it."""
    if importlib.util.find_spec("torch") is not None:
        return sglang_module("srt.sampling.sampling_params")
    sys.modules["torch"] = _TorchStandIn("torch")
    try:
        return sglang_module("srt.sampling.sampling_params")
    finally:
        del sys.modules["torch"]


CONTRACT_CASES = [
    {"input_ids": [1, 2], "sampling_params": {"max_tokens": 5}},
    {"input_ids": [1, 2], "sampling_params": {"temperature": "hot"}},
    {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1.5}},
    {"input_ids": [1, 2], "sampling_params": {"stop": 5}},
    {"input_ids": [1, 2], "sampling_params": {"stop": ["a", 3]}},
    {"input_ids": [1, 2], "sampling_params": {"skip_special_tokens": "no"}},
    {"input_ids": [1, 2], "sampling_params": {"logit_bias": {"5": "x"}}},
    {"input_ids": [1, 2.0]},
    {"input_ids": [1, "2"]},
    {"input_ids": [1, 2], "stream": "yes"},
    {"input_ids": [1, 2], "return_logprob": 1},
    {"input_ids": [1, 2], "rid": ["a", 1]},
    {"input_ids": [1, 2], "max_thinking_tokens": -1},
    {"input_ids": [1, 2], "unknown_top_level_key": {"x": 1}},
    {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": None, "top_k": -1, "stop": ["</s>"]}},
]


def oracle(body):
    try:
        api_types.GenerateRequest.from_json_value(body)
    except api_types.JsonContractError as e:
        return str(e)
    return None


def ours(body):
    try:
        check_generate_body(body)
    except ContractError as e:
        return str(e)
    return None


@pytest.mark.parametrize("body", CONTRACT_CASES)
def test_contract_text_matches_sglang_schema(body):
    assert ours(body) == oracle(body)


async def test_contract_violations_over_http():
    async with serve() as (url, s, _):
        async with s.post(
            url + "/generate", json={"input_ids": first_prompt(), "sampling_params": {"max_tokens": 8}}
        ) as r:
            assert r.status == 400
            assert await r.json() == {"error": oracle({"input_ids": [1], "sampling_params": {"max_tokens": 8}})}
        # Integral floats pass pydantic and are refused by the contract; fractional ones fail parsing first.
        async with s.post(url + "/generate", json={"input_ids": [1.0, 2]}) as r:
            assert r.status == 400 and await r.json() == {"error": oracle({"input_ids": [1.0, 2]})}
        async with s.post(url + "/generate", json={"input_ids": [1.5, 2]}) as r:
            body = await r.json()
            assert r.status == 400
            assert list(body) == ["object", "message", "type", "param", "code"]
            assert body["object"] == "error" and body["type"] == "Bad Request" and body["code"] == 400
        async with s.post(url + "/generate", data=b"{not json", headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400 and (await r.json())["object"] == "error"


VALUE_CASES = [
    ({"input_ids": []}, "input_ids cannot be empty."),
    ({"sampling_params": {}}, "Either text, input_ids or input_embeds should be provided."),
    ({"input_ids": [1] * 100}, "The input (100 tokens) is longer than the model's context length (100 tokens)."),
    (
        {"input_ids": [1] * 90, "sampling_params": {"max_new_tokens": 20}},
        "Requested token count exceeds the model's maximum context length of 100 tokens. You requested a total "
        "of 110 tokens: 90 tokens from the input messages and 20 tokens for the completion. Please reduce the "
        "number of tokens in the input messages or the completion to fit within the limit.",
    ),
    (
        {"input_ids": [1], "sampling_params": {"temperature": -1}},
        "temperature must be a non-negative finite number, got -1.0.",
    ),
    ({"input_ids": [1], "sampling_params": {"top_p": 0}}, "top_p must be in (0, 1], got 0.0."),
    ({"input_ids": [1], "sampling_params": {"top_k": 0}}, "top_k must be -1 (disable) or at least 1, got 0."),
    ({"input_ids": [1], "sampling_params": {"min_p": 2}}, "min_p must be in [0, 1], got 2.0."),
    ({"input_ids": [1], "sampling_params": {"frequency_penalty": 3}}, "frequency_penalty must be in [-2, 2], got 3.0."),
    (
        {"input_ids": [1], "sampling_params": {"repetition_penalty": 0}},
        "repetition_penalty must be in (0, 2] (1.0 = no penalty), got 0.0.",
    ),
    ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens must be at least 0, got -1."),
    (
        {"input_ids": [1], "sampling_params": {"min_new_tokens": 9, "max_new_tokens": 4}},
        "min_new_tokens must be in [0, max_new_tokens(4)], got 9.",
    ),
]


async def test_value_errors_use_the_nested_message_envelope():
    async with serve(context_length=100) as (url, s, _):
        for body, message in VALUE_CASES:
            async with s.post(url + "/generate", json=body) as r:
                assert r.status == 400, body
                assert await r.json() == {"error": {"message": message}}, body


async def test_sampling_value_errors_match_sglang_sampling_params():
    """The texts above come from SamplingParams.verify; pin them against the real class."""
    sp_mod = sampling_params_module()
    for body, message in VALUE_CASES[4:]:
        params = body["sampling_params"]
        with pytest.raises(ValueError) as e:
            sp_mod.SamplingParams(
                **{
                    k: (
                        float(v) if isinstance(v, int) and k not in ("top_k", "max_new_tokens", "min_new_tokens") else v
                    )
                    for k, v in params.items()
                }
            ).verify(151936)
        assert str(e.value) == message


async def test_valid_reference_adapter_request_passes():
    async with (
        serve() as (url, s, _),
        s.post(url + "/generate", json=gen_body(first_prompt()), headers={"X-SMG-Routing-Key": "s1"}) as r,
    ):
        assert r.status == 200
