"""Response bodies compared key by key with bodies built from SGLang's own API types."""

from __future__ import annotations

import pytest

from tests.fake_engine_helpers import first_prompt, gen_body, serve, sse_events
from tito_rl.trajectory.adapters.parsing.sglang_loader import sglang_module

api_types = sglang_module("api.v1.api_types")

# meta_info keys the TokenizerManager adds that the schema does not model (the last two seen from the real 0.5.23).
EXTRA_META = {"num_retractions", "response_sent_to_client_ts", "cached_tokens_details", "dp_rank"}


def rebuilt(body: dict) -> dict:
    """Decode with the schema and encode again: what SGLang's types say the body is."""
    return api_types.GenerateResponse.from_json_value(body).to_json_value()


def assert_matches_schema(body: dict) -> None:
    canonical = rebuilt(body)
    assert set(canonical) == set(body)
    for key in ("text", "output_ids"):
        assert canonical[key] == body[key]
    ours, theirs = body["meta_info"], canonical["meta_info"]
    assert set(ours) - set(theirs) <= EXTRA_META, set(ours) - set(theirs)
    for key, value in theirs.items():
        assert key in ours, key
        assert ours[key] == value, key
    # Value shapes: every logprob entry a [float, int, null] triple.
    for entry in ours.get("output_token_logprobs", []):
        assert api_types.LogprobEntry.from_json_value(entry).to_json_value() == entry


@pytest.mark.parametrize(
    "turn,finish",
    [
        ({"text": "Hi."}, {"type": "stop", "matched": 151645}),
        ({"text": "one two three four", "finish": "length"}, None),
        ({"text": "one two three four", "finish": "abort"}, None),
    ],
)
async def test_generate_bodies_match_schema(turn, finish):
    async with serve({"turns": [turn]}) as (url, s, _):
        async with s.post(url + "/generate", json=gen_body(first_prompt())) as r:
            body = await r.json()
        async with s.post(url + "/generate", json=gen_body(first_prompt(), stream=True)) as r:
            events = await sse_events(r)
    assert_matches_schema(body)
    for chunk in events[:-1]:
        assert_matches_schema(chunk)
    fr = api_types.decode_FinishReason(body["meta_info"]["finish_reason"])
    assert api_types.encode_FinishReason(fr) == body["meta_info"]["finish_reason"]
    if finish is not None:
        assert body["meta_info"]["finish_reason"] == finish
    if turn.get("finish") == "length":
        assert body["meta_info"]["finish_reason"] == {"type": "length", "length": len(body["output_ids"])}
        assert body["output_ids"][-1] != 151645


async def test_key_order_follows_tokenizer_manager():
    async with serve() as (url, s, _), s.post(url + "/generate", json=gen_body(first_prompt())) as r:
        body = await r.json()
    assert list(body["meta_info"]) == [
        "id",
        "finish_reason",
        "prompt_tokens",
        "weight_version",
        "num_retractions",
        "input_token_logprobs",
        "output_token_logprobs",
        "output_token_logprobs_length",
        "reasoning_tokens",
        "completion_tokens",
        "cached_tokens",
        "weight_versions",
        "cached_tokens_details",
        "dp_rank",
        "e2e_latency",
        "response_sent_to_client_ts",
    ]


async def test_info_bodies_decode_with_schema():
    async with serve() as (url, s, _):
        async with s.get(url + "/model_info") as r:
            info = await r.json()
        async with s.get(url + "/server_info") as r:
            server = await r.json()
        async with s.get(url + "/v1/models") as r:
            models = await r.json()
    decoded = api_types.GetModelInfoResponse.from_json_value(info).to_json_value()
    assert {k: info[k] for k in decoded} == decoded
    decoded = api_types.GetServerInfoResponse.from_json_value(server).to_json_value()
    for key in ("model_path", "served_model_name", "tokenizer_path", "version", "host", "port"):
        assert server[key] == decoded[key]
    card = api_types.ModelCard.from_json_value(models["data"][0]).to_json_value()
    assert {k: models["data"][0][k] for k in card} == card
