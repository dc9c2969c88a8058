"""The fake engine held to the real SGLang 0.5.23's committed answers (no SGLang needed): the contract's requests
(listed, drawn from the field's cassettes, options in combination) to the dense tiny Qwen3, and the tiny MoE's
expert routes, compared by structure and, for the routes, by what a trainer reads from them."""

from __future__ import annotations

import base64

import numpy as np

from tito_rl.recorder.engine_contract.answers import Exchange, Recording, load_recording
from tito_rl.recorder.engine_contract.exchange import DONE, Answer, send
from tito_rl.recorder.engine_contract.fake import RealTokensPolicy, running_fake
from tito_rl.recorder.engine_contract.generated import all_requests, field_requests, structure_key
from tito_rl.recorder.engine_contract.left_out import LEFT_OUT, left_out_for
from tito_rl.recorder.engine_contract.requests import FULL, ROUTES, SGLANG, ContractRequest
from tito_rl.recorder.engine_contract.runner import check_fake
from tito_rl.recorder.real_engine.sglang_answers import route_requests
from tito_rl.recorder.real_engine.sglang_paths import SGLANG_VERSION
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

LAYERS, TOP_K, EXPERTS = 2, 2, 8  # the real SGLang's tiny Qwen3-MoE


def contract() -> Recording:
    return load_recording(SGLANG, SGLANG_VERSION)


def routes() -> Recording:
    return load_recording(SGLANG, f"{SGLANG_VERSION}-routes")


def test_the_fake_engine_answers_every_recorded_sglang_request_with_the_real_structure():
    recording = contract()
    verdict = check_fake(recording)
    assert verdict.differences == {}
    assert verdict.checked == len(recording.exchanges) == len(all_requests(SGLANG))
    assert set(verdict.left_out) <= {rule.key for rule in LEFT_OUT}


def test_the_recording_holds_every_generated_request_as_the_real_sglang_answered_it():
    recording = contract()
    assert [e.request.name for e in recording.exchanges] == [r.name for r in all_requests(SGLANG)]
    assert [e.answer.dialect for e in recording.exchanges] == [e.request.dialect for e in recording.exchanges]
    by_name = {e.request.name: e.answer for e in recording.exchanges}
    assert recording.values["$model"] == "tiny-qwen3"
    # What the live run showed and the fake engine now does (docs/engine-dialects.md, "The contract").
    meta = by_name["generate json"].body["meta_info"]
    assert meta["cached_tokens_details"].keys() == {"device", "host"} and "dp_rank" in meta
    assert isinstance(by_name["option generate batch json"].body, list)
    assert isinstance(by_name["option generate n 2 json"].body, list)
    top = by_name["option generate top_logprobs_num 2 json"].body["meta_info"]
    assert [len(row) for row in top["output_top_logprobs"]] == [2] * len(top["output_token_logprobs"])
    start = by_name["option generate logprob_start_len 0 json"].body["meta_info"]["input_token_logprobs"]
    assert start[0][0] is None and len(start) == len(recording.values["$prompt_ids"])
    assert by_name["option update weight version"].body.keys() == {"success", "message", "new_version"}
    assert by_name["option unknown route"].status == 404 and by_name["option unknown route"].body == {
        "detail": "Not Found"
    }
    assert by_name["option wrong method"].status == 405
    chat = by_name["chat input_ids token ids"].body
    assert "matched_stop" in chat["choices"][0] and chat["metadata"].keys() == {"weight_version", "weight_versions"}
    streamed = [c for c in by_name["generate sse"].chunks if c != DONE]
    assert "weight_versions" not in streamed[0]["meta_info"] and "weight_versions" in streamed[-1]["meta_info"]


def test_the_field_requests_are_the_cassettes_own_deduplicated_by_structure():
    drawn = field_requests(SGLANG)
    # slime_retry's calls have slime_mixed's structure; slime_moe's, recorded around an engine serving expert
    # routes (top_p 0.9, routes not asked), go to the MoE started with --enable-return-routed-experts, and so do
    # miles_moe's chat calls (they ask for routes and meta_info); its 7 calls have 5 message structures (the
    # streamed session's calls reach the engine unstreamed: miles answers its client one chunk)
    miles = [f"field miles_moe {n}" for n in range(1, 6)]
    assert [(r.name, r.mode) for r in drawn] == [("field slime_mixed 1", SGLANG), ("field slime_moe 1", ROUTES)] + [
        (name, ROUTES) for name in miles
    ]
    body = drawn[0].body or {}
    assert "rid" not in body and body["sampling_params"]["max_new_tokens"] <= 6
    assert [r.name for r in all_requests(SGLANG) if r.name.startswith("field ")] == ["field slime_mixed 1"]
    assert [r.name for r in route_requests() if r.name.startswith("field ")] == ["field slime_moe 1", *miles]
    for request in drawn[2:]:
        chat = request.body or {}
        assert request.path == "/v1/chat/completions" and request.dialect == "sglang-openai"
        assert chat["return_routed_experts"] is True and chat["return_meta_info"] is True and "stream" not in chat
        assert chat["input_ids"] and chat["max_tokens"] <= 6
    vllm = field_requests("vllm")
    # moe_verifiers' calls have verifiers_mixed's structure (vLLM sends routes unasked: nothing to ask), and stay
    # in the full mode: vLLM 0.32's CPU build refuses --enable-return-routed-experts at start
    assert {r.mode for r in vllm} == {FULL} and not [r for r in vllm if "moe" in r.name]
    # NeMo Gym's gateway reads the prompt's ids back with `POST /tokenize` (chat `messages`) after each completion
    paths = {"/v1/chat/completions", "/inference/v1/generate", "/v1/completions", "/tokenize"}
    assert {r.path for r in vllm} == paths
    tokenize = [r for r in vllm if r.path == "/tokenize"]
    assert tokenize and all(r.name.startswith("field nemogym_") for r in tokenize)
    assert all("messages" in (r.body or {}) and "max_tokens" not in (r.body or {}) for r in tokenize)  # as recorded
    keys = [structure_key(r.path, r.dialect, r.body or {}) for r in vllm]
    assert len(keys) == len(set(keys))


def test_the_fake_moe_answers_every_recorded_routes_request_with_the_real_structure():
    recording = routes()
    verdict = check_fake(recording)
    assert verdict.differences == {}
    assert verdict.checked == len(recording.exchanges) == len(route_requests())
    # The one difference kept: stock SGLang 0.5.23 takes slime's kept-set key and answers none (JSON: 2 fields;
    # streamed: the same 2 in the first chunk and in the token chunks), the fake answers as slime's patched SGLang.
    assert {key: len(lines) for key, lines in verdict.left_out.items()} == {"kept-set-patch": 6}
    real = {e.request.name: e.answer for e in recording.exchanges}
    kept = real["generate routes kept set"]
    assert kept.status == 200 and "routed_experts" in kept.body["meta_info"]
    assert "top_p_token_ids" not in kept.body["meta_info"]
    # slime's adapters, recorded around an engine serving routes, do not ask for them: none come back
    assert "routed_experts" not in real["field slime_moe 1"].body["meta_info"]
    # miles' chat calls (return_meta_info and return_routed_experts, its own prompt ids): the real MoE answers the
    # routes in the choice's meta_info and none at the root, as the fake engine does
    miles = [name for name in real if name.startswith("field miles_moe ")]
    assert len(miles) == 5
    for name in miles:
        assert "sglext" not in real[name].body and real[name].body["choices"][0]["meta_info"]["routed_experts"]


def test_a_route_difference_on_the_moes_own_generate_is_not_left_out():
    request = ContractRequest("generate routes", ROUTES, "POST", "/generate", {"input_ids": [1]}, dialect=SGLANG)
    exchange = Exchange(request, Answer(status=200, body={}))
    line = "routes generate routes: meta_info.routed_experts: the real engine sends it (str), the fake one does not"
    assert left_out_for(exchange, line) is None
    on_vllm = Exchange(ContractRequest("sglang generate path", FULL, "POST", "/generate"), Answer(status=200, body={}))
    assert left_out_for(on_vllm, line).key == "one-port-every-dialect"


def _routes(answer_body: dict, where: str = "meta_info") -> np.ndarray:
    holders = {"meta_info": lambda b: b["meta_info"], "sglext": lambda b: b["sglext"]}
    holders["choice"] = lambda b: b["choices"][0]["meta_info"]
    holder = holders[where](answer_body)
    raw = base64.b64decode(holder["routed_experts"])
    assert len(raw) % 4 == 0
    return np.frombuffer(raw, dtype="<i4").reshape(-1, LAYERS, TOP_K)


def test_the_fake_engines_routes_have_the_real_moes_shape_encoding_start_and_prefix():
    recording = routes()
    tokenizer = load_tokenizer()
    policy = RealTokensPolicy(tokenizer)
    fake: dict[str, Answer] = {}
    with running_fake(ROUTES, policy) as url:
        for exchange in recording.exchanges:
            policy.expect(exchange.answer)
            fake[exchange.request.name] = send(url, "POST", exchange.request.path, recording.body_of(exchange))
    real = {e.request.name: e.answer for e in recording.exchanges}
    for name in ("generate routes", "generate routes from 3", "generate routes longer prompt"):
        real_rows, fake_rows = _routes(real[name].body), _routes(fake[name].body)
        assert fake_rows.shape == real_rows.shape, name  # [prompt + output - 1 - start, layers, top_k]
        assert fake_rows.min() >= 0 and fake_rows.max() < EXPERTS
        assert all(len(set(row)) == TOP_K for layer in fake_rows for row in layer)
    full, from_3 = _routes(fake["generate routes"].body), _routes(fake["generate routes from 3"].body)
    assert (from_3 == full[3:]).all()  # routed_experts_start_len drops that many leading rows
    longer = _routes(fake["generate routes longer prompt"].body)
    shared = len(recording.values["$prompt_ids"])
    assert (longer[:shared] == full[:shared]).all()  # the shared prefix routes alike
    assert "routed_experts" not in fake["generate routes not asked"].body["meta_info"]
    chunks = [c for c in fake["generate routes sse"].chunks if c != DONE]
    assert ["routed_experts" in c["meta_info"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    chat = fake["chat routes"].body
    assert _routes(chat, "sglext").shape == _routes(real["chat routes"].body, "sglext").shape
    assert "routed_experts" not in str(chat["choices"])  # at the root, not under choices
    for name in [n for n in real if n.startswith("field miles_moe ")]:  # return_meta_info: in the choice instead
        assert "sglext" not in fake[name].body, name
        assert _routes(fake[name].body, "choice").shape == _routes(real[name].body, "choice").shape, name


def test_the_fake_engine_imitates_the_sglang_release_checked_live_by_default():
    from tito_rl.fake_engine.sglang.responses import DEFAULT_PROFILE
    from tito_rl.recorder.engine_contract.answers import answers_path

    assert DEFAULT_PROFILE == SGLANG_VERSION
    assert answers_path(SGLANG, DEFAULT_PROFILE).is_file()
    recording = contract()
    assert "--random-seed" in recording.start_flags[SGLANG] and "qwen3" in recording.start_flags[SGLANG]


def test_the_committed_requests_are_what_the_generator_draws_today():
    """A change to the cassettes or the options shows here: re-record (make real-sglang-answers and make
    engine-contract-live) so the committed answers are to the requests the contract draws."""
    from tito_rl.recorder.real_engine.paths import VLLM_VERSION

    for engine, version in ((SGLANG, SGLANG_VERSION), ("vllm", VLLM_VERSION)):
        recorded = {(e.request.mode, e.request.name): e.request.body for e in load_recording(engine, version).exchanges}
        for request in all_requests(engine):
            assert recorded.get((request.mode, request.name)) == request.body, (engine, request.name)
    moe = {e.request.name: e.request.body for e in routes().exchanges}
    assert moe == {request.name: request.body for request in route_requests()}
