"""The channel decoders (`trajectory/channels.py`) and where each dialect's view reads them (CHANNELS.md): SGLang's
base64 int32 routes placed by the request's start, vLLM's base64 `.npy` routes (header parsed by numpy, never
unpickled), the kept-set CSR, weight-version spans; each malformed input is one line naming the field."""

from __future__ import annotations

import base64
import io
import pickle

import numpy as np
import pytest

from tests.channel_support import LAYERS, TOP_K, b64_int32, b64_npy, expert_rows
from tito_rl.trajectory.adapters.engine import vllm
from tito_rl.trajectory.adapters.engine.generate import EngineError, parse_generation
from tito_rl.trajectory.adapters.engine.routes_layout import routes_top_k
from tito_rl.trajectory.channels import (
    ChannelError,
    VersionSpan,
    int32_array,
    kept_sets,
    npy_routes,
    sglang_routes,
    version_spans,
    versions_text,
)
from tito_rl.trajectory.dialects.registry import view_of

PROMPT, OUTPUT = [11, 12, 13, 14, 15], [21, 22, 23]


def _one_line(exc: pytest.ExceptionInfo[ChannelError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_sglang_routes_are_flat_little_endian_int32_rows_from_the_start() -> None:
    rows = expert_rows(PROMPT + OUTPUT)[3:7]
    routes = sglang_routes(b64_int32(rows), 3, 4)
    assert (routes.start, routes.end, routes.width, routes.layers) == (3, 7, LAYERS * TOP_K, None)
    assert np.array_equal(routes.rows, rows) and routes.rows.dtype == np.int16
    split = sglang_routes(b64_int32(rows), 3, 4, top_k=TOP_K)
    assert (split.layers, split.top_k) == (LAYERS, TOP_K)
    assert sglang_routes(rows.reshape(-1).tolist(), 3, 4).rows.tolist() == rows.tolist()  # a plain JSON list too
    big = sglang_routes(b64_int32([40_000, 1]), 0, 1)
    assert big.rows.dtype == np.int32 and big.rows.tolist() == [[40_000, 1]]


@pytest.mark.parametrize(
    ("value", "rows", "message"),
    [
        ("not base64!", 2, "routed_experts: not base64"),
        (base64.b64encode(b"\x01\x02\x03").decode(), 1, "3 bytes is not a whole number of int32"),
        (b64_int32([1, 2, 3]), 2, "3 ids do not split into 2 rows"),
        (b64_int32([1, -2]), 1, "negative expert id -2"),
        (b64_int32([1, 2]), 0, "2 ids where no row was expected"),
        (7, 1, "expected a base64 string or a list of ints, got int"),
    ],
)
def test_malformed_sglang_routes_are_one_line(value: object, rows: int, message: str) -> None:
    with pytest.raises(ChannelError) as exc:
        sglang_routes(value, 0, rows)
    assert message in _one_line(exc)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_vllm_npy_routes_keep_their_shape(dtype: type) -> None:
    array: np.ndarray = expert_rows(PROMPT + OUTPUT)[:-1].reshape(-1, LAYERS, TOP_K).astype(dtype)
    routes = npy_routes(b64_npy(array), len(PROMPT + OUTPUT) - 1)
    assert routes is not None and (routes.start, routes.layers, routes.top_k) == (0, LAYERS, TOP_K)
    assert np.array_equal(routes.rows, array.reshape(len(array), -1))
    assert npy_routes(None) is None  # aborted before any forward pass


def test_malformed_npy_routes_are_refused_without_unpickling() -> None:
    objects = io.BytesIO()
    np.save(objects, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    cases = [
        (base64.b64encode(objects.getvalue()).decode(), "not a .npy array"),
        (base64.b64encode(pickle.dumps([1, 2])).decode(), "not a .npy array"),
        (b64_npy(np.zeros((2, 3), np.uint8)), "expected a 3-d integer array"),
        (b64_npy(np.zeros((2, 1, 1), np.float32)), "expected a 3-d integer array"),
        (b64_npy(np.zeros((5, 1, 1), np.uint8)), "5 rows where the call's tokens call for 7"),
        ([1, 2], "expected base64 .npy bytes, got list"),
    ]
    for value, message in cases:
        with pytest.raises(ChannelError) as exc:
            npy_routes(value, 7)
        assert message in _one_line(exc)


def test_kept_sets_csr_and_their_errors() -> None:
    kept = kept_sets(b64_int32([21, 5, 22, 23, 9, 8]), b64_int32([0, 2, 3, 6]), 3)
    assert [kept.of(i) for i in range(3)] == [[21, 5], [22], [23, 9, 8]]
    for offsets, n, message in [
        ([0, 2, 6], 3, "3 entries for 3 output tokens"),
        ([1, 2, 3, 6], 3, "must rise from 0 to the 6 ids"),
        ([0, 4, 3, 6], 3, "must rise from 0 to the 6 ids"),
        ([0, 2, 3, 5], 3, "must rise from 0 to the 6 ids"),
    ]:
        with pytest.raises(ChannelError) as exc:
            kept_sets(b64_int32([21, 5, 22, 23, 9, 8]), b64_int32(offsets), n)
        assert message in _one_line(exc)
    with pytest.raises(ChannelError, match="an id does not fit int32"):
        int32_array([2**40], "top_p_token_ids")


def test_weight_version_spans() -> None:
    spans = [{"version": "v1", "start": 0, "end": 2}, {"version": "v2", "start": 2, "end": 3}]
    assert version_spans(spans, "v2", 3) == (VersionSpan("v1", 0, 2), VersionSpan("v2", 2, 3))
    assert version_spans(None, "v7", 3) == (VersionSpan("v7", 0, 3),)
    assert version_spans(None, None, 3) == ()
    assert version_spans([], "v2", 0) == (VersionSpan("v2", 0, 0),)  # aborted before its first token
    for bad, message in [
        ([{"version": "v1", "start": 1, "end": 3}], "does not continue at 0"),
        ([{"version": "v1", "start": 0, "end": 2}], "cover 2 of 3"),
        ([{"start": 0, "end": 3}], "needs a string version"),
        ({"version": "v1"}, "expected a list of spans"),
    ]:
        with pytest.raises(ChannelError) as exc:
            version_spans(bad, None, 3)
        assert message in _one_line(exc)
    assert versions_text(["a", "a", "b", "", "a"]) == "a x2, b, ?, a"


# ---- views ---------------------------------------------------------------------------------------------------


def _generate(meta_extra: dict[str, object], request_extra: dict[str, object] | None = None) -> tuple[dict, dict]:
    request = {"rid": "r", "input_ids": PROMPT, "sampling_params": {}, "return_logprob": True, **(request_extra or {})}
    meta = {
        "finish_reason": {"type": "stop"},
        "prompt_tokens": len(PROMPT),
        "output_token_logprobs": [[-0.1, t, None] for t in OUTPUT],
        **meta_extra,
    }
    return request, {"output_ids": OUTPUT, "meta_info": meta}


def test_the_sglang_view_places_routes_by_the_requests_start() -> None:
    rows = expert_rows(PROMPT + OUTPUT)
    request, answer = _generate(
        {
            "routed_experts": b64_int32(rows[4:7]),
            "top_p_token_ids": b64_int32([21, 1, 22, 23]),
            "top_p_token_offsets": b64_int32([0, 2, 3, 4]),
            "weight_version": "v2",
            "weight_versions": [{"version": "v1", "start": 0, "end": 1}, {"version": "v2", "start": 1, "end": 3}],
        },
        {"return_routed_experts": True, "routed_experts_start_len": 4},
    )
    view = view_of(None, "/generate", request, answer)
    assert view.routes_asked and not view.channel_error
    assert view.routes is not None and (view.routes.start, view.routes.end) == (4, 7)
    assert np.array_equal(view.routes.rows, rows[4:7])
    assert view.kept is not None and view.kept.of(0) == [21, 1]
    assert [s.version for s in view.weight_versions] == ["v1", "v2"]
    # slime's patch names the kept set top_p_kept_token_*; slime reads an echoed start from meta_info.
    request, answer = _generate(
        {
            "routed_experts": b64_int32(rows[2:7]),
            "routed_experts_start_len": 2,
            "top_p_kept_token_ids": [21, 22, 23],
            "top_p_kept_token_offsets": [0, 1, 2, 3],
        }
    )
    view = view_of(None, "/generate", request, answer)
    assert view.routes is not None and view.routes.start == 2 and view.kept is not None


def test_a_malformed_channel_leaves_the_rest_of_the_view_and_fails_the_adapters_turn() -> None:
    request, answer = _generate({"routed_experts": b64_int32([1, 2, 3]), "weight_version": "v1"})
    view = view_of(None, "/generate", request, answer)
    assert view.output_ids == OUTPUT and view.routes is None
    assert "routed_experts: 3 ids do not split into 7 rows" in view.channel_error
    assert [s.version for s in view.weight_versions] == ["v1"]
    with pytest.raises(EngineError) as exc:
        parse_generation("r", answer, request)
    assert exc.value.status == 502 and "malformed channel: routed_experts" in exc.value.message
    # Odd version spans never fail a turn: the final version stands for the whole output.
    request, answer = _generate({"weight_version": "v3", "weight_versions": [{"version": "v3", "start": 0}]})
    generation = parse_generation("r", answer, request)
    assert generation.weight_versions == (VersionSpan("v3", 0, 3),)


def test_the_vllm_views_read_npy_routes_and_versions_from_the_choice() -> None:
    array = expert_rows(PROMPT + OUTPUT)[:-1].reshape(-1, LAYERS, TOP_K).astype(np.uint8)
    choice = {
        "index": 0,
        "token_ids": OUTPUT,
        "logprobs": {"content": [{"token_id": t, "logprob": -0.1} for t in OUTPUT]},
        "finish_reason": "stop",
        "routed_experts": b64_npy(array),
        "weight_versions": [{"version": "7", "start": 0, "end": 3}],
    }
    body = {"request_id": "r", "model": "m", "token_ids": PROMPT, "sampling_params": {"logprobs": 0}}
    view = view_of(None, "/inference/v1/generate", body, {"choices": [choice]})
    assert view.routes is not None and (view.routes.layers, view.routes.top_k) == (LAYERS, TOP_K)
    generation = vllm.parse_answer("vllm-generate", "/inference/v1/generate", "r", body, {"choices": [choice]})
    assert generation.routes is not None and generation.routes.end == len(PROMPT + OUTPUT) - 1
    assert generation.weight_versions == (VersionSpan("7", 0, 3),)
    chunks = [
        {"choices": [{**choice, "routed_experts": None, "weight_versions": None, "finish_reason": None}]},
        {
            "choices": [
                {
                    "index": 0,
                    "token_ids": [],
                    "routed_experts": choice["routed_experts"],
                    "finish_reason": "stop",
                    "weight_versions": choice["weight_versions"],
                }
            ]
        },
    ]
    streamed = view_of(None, "/inference/v1/generate", {**body, "stream": True}, chunks)
    assert streamed.routes is not None and streamed.routes.end == len(PROMPT + OUTPUT) - 1
    assert streamed.weight_versions == (VersionSpan("7", 0, 3),)
    aborted = {**choice, "routed_experts": None}
    assert (
        vllm.parse_answer("vllm-generate", "/inference/v1/generate", "r", body, {"choices": [aborted]}).routes is None
    )
    broken = {**choice, "routed_experts": b64_npy(array[:2])}
    with pytest.raises(EngineError, match="2 rows where the call's tokens call for 7"):
        vllm.parse_answer("vllm-generate", "/inference/v1/generate", "r", body, {"choices": [broken]})


def test_the_sglang_openai_view_reads_sgl_ext_routes() -> None:
    rows = expert_rows(PROMPT + OUTPUT)[:-1]
    request = {"model": "m", "input_ids": PROMPT, "return_routed_experts": True, "logprobs": True}
    choice = {
        "index": 0,
        "response_token_ids": OUTPUT,
        "finish_reason": "stop",
        "matched_stop": 23,
        "sgl_ext": {"routed_experts": b64_int32(rows)},
    }
    answer = {"choices": [choice], "metadata": {"weight_version": "v5"}}
    view = view_of(None, "/v1/completions", request, answer)
    assert view.routes_asked and view.routes is not None and np.array_equal(view.routes.rows, rows)
    assert view.weight_versions == (VersionSpan("v5", 0, 3),)


def test_the_sglang_openai_view_reads_root_sglext_routes_streamed_or_not() -> None:
    """SGLang 0.5.23 (its real answers: recorder/engine_contract/answers/sglang-0.5.23-routes.json on sglang-real)
    puts OpenAI routes at the answer's root `sglext`; streamed, in a chunk of its own after the finish with
    `choices: []`; with `return_meta_info`, in the choice's `meta_info`."""
    rows = expert_rows(PROMPT + OUTPUT)[:-1]
    request = {"model": "m", "input_ids": PROMPT, "return_routed_experts": True, "return_token_ids": True}
    choice = {"index": 0, "response_token_ids": OUTPUT, "finish_reason": "stop", "matched_stop": 23}
    routes = b64_int32(rows)
    whole = {"choices": [choice], "sglext": {"routed_experts": routes}, "metadata": {"weight_version": "v5"}}
    chunks = [
        {
            "id": "c",
            "choices": [{"index": 0, "token_ids": OUTPUT, "delta": {"content": "hi"}, "finish_reason": "stop"}],
        },
        {"id": "c", "choices": [], "usage": None, "sglext": {"routed_experts": routes}},
    ]
    in_meta = {"choices": [{**choice, "meta_info": {"routed_experts": routes}}]}
    for answer in (whole, chunks, in_meta):
        view = view_of(None, "/v1/completions", {**request, "stream": isinstance(answer, list)}, answer)
        assert not view.channel_error, answer
        assert view.routes is not None and np.array_equal(view.routes.rows, rows), answer
    short = {"choices": [choice], "sglext": {"routed_experts": b64_int32(rows[:-1])}}
    assert "routed_experts" in (view_of(None, "/v1/completions", request, short).channel_error or "")


def test_the_models_config_splits_sglangs_flat_rows_into_layers(tmp_path) -> None:
    assert routes_top_k(None) is None and routes_top_k(str(tmp_path)) is None
    (tmp_path / "config.json").write_text('{"model_type": "qwen3_moe", "num_experts_per_tok": 2}')
    assert routes_top_k(str(tmp_path)) == TOP_K
    (tmp_path / "config.json").write_text('{"text_config": {"num_experts_per_tok": 8}}')
    assert routes_top_k(str(tmp_path)) == 8
    (tmp_path / "config.json").write_text("{not json")
    assert routes_top_k(str(tmp_path)) is None
    rows = expert_rows(PROMPT + OUTPUT)[:-1]
    request, answer = _generate({"routed_experts": b64_int32(rows)}, {"return_routed_experts": True})
    split = parse_generation("r", answer, request, TOP_K).routes
    assert split is not None and (split.layers, split.top_k) == (LAYERS, TOP_K)
    flat = parse_generation("r", answer, request, 4).routes  # 6 ids a row do not split by 4: kept flat
    assert flat is not None and flat.layers is None
