"""The fake engine held to the real vLLM's committed answers (no vLLM needed), and the structure comparison that
does it shown to catch what it must."""

from __future__ import annotations

import copy
from pathlib import Path

from tito_rl.fake_engine.openai.vllm_versions import VLLM_DEFAULT_VERSION
from tito_rl.recorder.engine_contract.answers import answers_path, load_recording
from tito_rl.recorder.engine_contract.exchange import DONE, Answer
from tito_rl.recorder.engine_contract.generated import all_requests, field_requests
from tito_rl.recorder.engine_contract.left_out import LEFT_OUT
from tito_rl.recorder.engine_contract.requests import BARE, FULL, TOOLS, vllm_requests
from tito_rl.recorder.engine_contract.runner import check_fake, drift
from tito_rl.recorder.engine_contract.shape import compare_answers
from tito_rl.recorder.real_engine.paths import VLLM_VERSION

ROOT = Path(__file__).resolve().parent.parent


def test_the_fake_engine_answers_every_recorded_request_with_the_real_engines_structure():
    recording = load_recording("vllm", VLLM_VERSION)
    verdict = check_fake(recording)
    assert verdict.differences == {}
    assert verdict.checked == len(recording.exchanges)
    assert set(verdict.left_out) <= {rule.key for rule in LEFT_OUT}


def test_the_recording_covers_every_contract_request_in_both_start_modes():
    recording = load_recording("vllm", VLLM_VERSION)
    recorded = {(e.request.mode, e.request.name) for e in recording.exchanges}
    assert recorded == {(r.mode, r.name) for r in all_requests("vllm")}
    assert {(r.mode, r.name) for r in vllm_requests()} <= recorded  # the listed ones, and the generated
    assert sum(e.request.name.startswith("field ") for e in recording.exchanges) == len(field_requests("vllm"))
    assert recording.start_flags[FULL] == [
        "--enable-scale-out",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
    ]
    assert recording.start_flags[TOOLS] == [
        "--enable-scale-out",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    assert recording.start_flags[BARE] == []
    # Recorded through tito's engine tap: each answer carries the dialect the tap attributed the call.
    assert [e.answer.dialect for e in recording.exchanges] == [e.request.dialect for e in recording.exchanges]
    assert {e.answer.dialect for e in recording.exchanges} == {"vllm-openai", "vllm-generate", "sglang"}
    statuses = {e.request.name: e.answer.status for e in recording.exchanges}
    # What only a start flag opens, and what vLLM refuses, as the real engine answered.
    assert statuses["bare generate json"] == 403 and statuses["generate json"] == 200
    assert statuses["bare chat tools auto"] == 400 and statuses["chat tools auto"] == 200
    assert statuses["generate no sampling_params"] == 400 and statuses["sglang generate path"] == 404
    by_name = {e.request.name: e for e in recording.exchanges}
    extra_body = by_name["chat json extra_body ids"].answer.body["choices"][0]
    assert extra_body["token_ids"] is None  # vLLM ignores a literal extra_body key
    assert by_name["chat json stop id"].answer.body["choices"][0]["stop_reason"] == recording.values["$stop_id"]
    assert by_name["chat json stop string"].answer.body["choices"][0]["stop_reason"] == recording.values["$stop_text"]
    # What the generated requests found, and the fake engine now does as vLLM 0.32.0 does.
    assert by_name["option unknown route"].answer.body == {"detail": "Not Found"}
    assert by_name["option wrong method"].answer.status == 405
    render = by_name["option chat render"].answer.body
    assert isinstance(render["token_ids"], list) and "sampling_params" in render
    tops = by_name["option completions logprobs 2 json"].answer.body["choices"][0]["logprobs"]["top_logprobs"]
    assert all(isinstance(entry, dict) and len(entry) >= 1 for entry in tops)  # token text -> logprob
    forced = by_name["tools chat sse tools required"].answer.chunks  # a cut forced call, streamed as tool_calls
    assert any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in forced if c != DONE)


def test_a_forced_tool_call_spelled_in_text_streams_as_the_real_engine_streamed_it():
    """vLLM's structured outputs make the model spell `<tool_call>` in ordinary tokens; the fake engine's hermes
    deltas over the real answer's own ids put the name and every arguments piece on the same tokens as vLLM did."""
    from tito_rl.fake_engine.openai.parse import vllm_chat_deltas
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    recording = load_recording("vllm", VLLM_VERSION)
    for name in ("tools chat sse tools required", "tools chat sse tools named"):
        exchange = next(e for e in recording.exchanges if e.request.name == name)
        chunks = [c for c in exchange.answer.chunks if c != DONE and c["choices"]][1:]
        ids = [i for c in chunks for i in c["choices"][0]["token_ids"]]
        real = [(c["choices"][0]["delta"].get("tool_calls") or [{}])[0] for c in chunks]
        fake = [
            (d.get("tool_calls") or [{}])[0]
            for d in vllm_chat_deltas(load_tokenizer(), ids, tool_parsing=True, seed="s", reasoning_parser=False)
        ]
        assert [f.get("function") for f in fake] == [r.get("function") for r in real], name
        assert [sorted(f) for f in fake] == [sorted(r) for r in real], name


def test_the_fake_engine_imitates_the_version_checked_live_by_default():
    assert VLLM_DEFAULT_VERSION == VLLM_VERSION
    assert answers_path("vllm", VLLM_DEFAULT_VERSION).is_file()


def test_an_older_release_of_the_fake_engine_fails_the_contract_where_0_32_changed():
    recording = load_recording("vllm", VLLM_VERSION)
    verdict = check_fake(recording, vllm_version="0.31.0", only=lambda e: e.request.name == "generate json")
    [lines] = verdict.differences.values()
    assert any("choices[].logprobs.content[].token_id: the real engine sends it" in line for line in lines)
    assert any("usage: the real engine sends it" in line for line in lines)


def test_every_left_out_difference_is_named_in_the_docs():
    page = (ROOT / "docs" / "engine-dialects.md").read_text()
    for rule in LEFT_OUT:
        assert f"`{rule.key}`" in page, rule.key


BODY = {
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {"content": "hi", "reasoning": None},
            "token_ids": [1, 2],
            "logprobs": {"content": [{"logprob": -1.0}]},
            "stop_reason": None,
        }
    ],
    "prompt_token_ids": [5],
    "usage": {"prompt_tokens": 1},
}


def test_the_comparison_catches_missing_moved_retyped_and_emptied_fields():
    real = Answer(200, body=BODY)
    assert compare_answers(real, Answer(200, body=copy.deepcopy(BODY)), "x") == []
    moved = copy.deepcopy(BODY)
    moved["choices"][0]["prompt_token_ids"] = moved.pop("prompt_token_ids")  # SGLang's place, not vLLM's
    assert compare_answers(real, Answer(200, body=moved), "x") == [
        "x: choices[].prompt_token_ids: the fake engine sends it (list), the real one does not",
        "x: prompt_token_ids: the real engine sends it (list), the fake one does not",
    ]
    retyped = copy.deepcopy(BODY)
    retyped["choices"][0]["logprobs"]["content"][0]["logprob"] = "-1.0"
    assert compare_answers(real, Answer(200, body=retyped), "x") == [
        "x: choices[].logprobs.content[].logprob: real float, fake str"
    ]
    emptied = copy.deepcopy(BODY)
    emptied["choices"][0]["token_ids"] = None
    assert compare_answers(real, Answer(200, body=emptied), "x") == ["x: choices[].token_ids: real list, fake null"]
    assert compare_answers(real, Answer(400, body=BODY), "x") == ["x: status: real 200, fake 400"]
    other = copy.deepcopy(BODY)
    other["object"] = "text_completion"
    assert "x: object=chat.completion: the real engine sends it (value), the fake one does not" in compare_answers(
        real, Answer(200, body=other), "x"
    )


def test_fields_the_real_engine_sends_as_null_are_values_not_structure():
    real = copy.deepcopy(BODY)
    real["choices"][0]["routed_experts"] = None
    fake = copy.deepcopy(BODY)
    fake["choices"][0]["message"]["reasoning"] = "thought"  # the real one's null: any value, or none, is fine
    del fake["choices"][0]["stop_reason"]
    assert compare_answers(Answer(200, body=real), Answer(200, body=fake), "x") == []


def test_streams_compare_by_their_parts_and_order():
    def chunk(**choice: object) -> dict[str, object]:
        return {"object": "chat.completion.chunk", "choices": [{"index": 0, "finish_reason": None, **choice}]}

    first = {**chunk(delta={"role": "assistant", "content": ""}), "prompt_token_ids": [1]}
    tokens = [chunk(delta={"content": "a"}, token_ids=[3]), chunk(delta={"content": "b"}, token_ids=[4])]
    last = chunk(delta={}, token_ids=[5], finish_reason="stop", stop_reason=5)
    usage = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 1}}
    real = Answer(200, chunks=[first, *tokens, last, usage, DONE], streamed=True)
    assert compare_answers(real, Answer(200, chunks=list(real.chunks), streamed=True), "s") == []
    no_usage = Answer(200, chunks=[first, *tokens, last, DONE], streamed=True)
    assert compare_answers(real, no_usage, "s") == ["s: after the finish: real 1 chunk(s), fake 0"]
    ids_late = Answer(
        200,
        chunks=[
            chunk(delta={"role": "assistant", "content": ""}),
            *tokens,
            {**last, "prompt_token_ids": [1]},
            usage,
            DONE,
        ],
        streamed=True,
    )
    assert compare_answers(real, ids_late, "s") == [
        "s: first chunk: prompt_token_ids: the real engine sends it (list), the fake one does not",
        "s: finish chunk: prompt_token_ids: the fake engine sends it (list), the real one does not",
    ]
    no_done = Answer(200, chunks=[first, *tokens, last, usage], streamed=True)
    assert compare_answers(real, no_done, "s") == ["s: [DONE]: real sends it, fake omits it"]
    assert compare_answers(real, Answer(200, body=BODY), "s") == [
        "s: the real engine streams, the fake one answers with one body"
    ]


def test_drift_between_two_recordings_is_structural_only():
    recording = load_recording("vllm", VLLM_VERSION)
    same = copy.deepcopy(recording)
    for exchange in same.exchanges:  # other values (ids, times), the same structure
        if isinstance(exchange.answer.body, dict) and "created" in exchange.answer.body:
            exchange.answer.body["created"] += 1
    assert drift(recording, same) == []
    changed = copy.deepcopy(recording)
    target = next(e for e in changed.exchanges if e.request.name == "generate json")
    target.answer.body["choices"][0]["logprobs"]["content"][0]["token"] = "x"
    changed.exchanges = [e for e in changed.exchanges if e.request.name != "detokenize"]
    found = drift(recording, changed)
    assert "full detokenize: not in the new recording" in found
    assert any(line.startswith("full generate json: choices[].logprobs.content[].token:") for line in found)


def test_the_sglang_contract_runs_against_any_running_sglang(tmp_path):
    """The live path a GPU run takes against a real SGLang, here against the fake engine in SGLang mode: every
    request answered, the placeholders learned from the engine, and the fake engine held to the answers."""
    from tito_rl.fake_engine.app import EngineOptions, create_app
    from tito_rl.fake_engine.policies.demo import demo_policy
    from tito_rl.recorder.engine_contract.cli import main
    from tito_rl.recorder.engine_contract.fake import running_app
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    app = create_app(
        demo_policy(tokenizer),
        EngineOptions(tokenizer=tokenizer, model_name="qwen", openai_dialect="sglang-openai", context_length=4096),
    )
    saved = tmp_path / "sglang.json"
    with running_app(app) as url:
        assert main(["live", "--engine", "sglang", "--url", url, "--save", str(saved)]) == 0
    from tito_rl.recorder.engine_contract.answers import Recording

    recording = Recording.from_json(saved.read_text())
    statuses = {e.request.name: e.answer.status for e in recording.exchanges}
    assert statuses["generate json"] == 200 and statuses["generate over-long"] == 400
    assert statuses["chat sse with ids refused"] == 400 and statuses["generate unknown sampling key"] == 400
    assert recording.values["$model"] == "qwen" and recording.values["$context_length"] == 4096
    assert len(recording.values["$long_prompt_ids"]) == 4096 + 16
    assert [e.answer.dialect for e in recording.exchanges] == [e.request.dialect for e in recording.exchanges]
    assert {e.answer.dialect for e in recording.exchanges} == {"sglang", "sglang-openai"}
    assert check_fake(recording).ok


def test_an_unreachable_engine_is_one_line_and_exit_2(capsys):
    from tito_rl.recorder.engine_contract.cli import main
    from tito_rl.recorder.real_engine.server import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["live", "--url", url]) == 2
    assert capsys.readouterr().err == f"engine contract: GET {url}/v1/models: ConnectionError\n"


def test_the_live_recording_goes_through_the_engine_tap_and_keeps_what_a_direct_client_gets():
    """The contract recorded against the fake engine through tito's engine tap, each request also sent straight to
    the engine: the tap's answers have the direct ones' structure (statuses, bodies, every stream event and its
    `[DONE]`), and each call carries the dialect the tap read from it."""
    from tito_rl.fake_engine.app import create_app
    from tito_rl.fake_engine.policies.demo import demo_policy
    from tito_rl.recorder.engine_contract.exchange import send
    from tito_rl.recorder.engine_contract.fake import fake_options, running_app
    from tito_rl.recorder.engine_contract.requests import resolve
    from tito_rl.recorder.engine_contract.runner import base_values, record_live, served_model
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    values: dict[str, object] = {}
    streamed = 0
    for mode in (FULL, TOOLS, BARE):
        chosen = [r for r in vllm_requests() if r.mode == mode]
        with running_app(create_app(demo_policy(tokenizer), fake_options(mode, tokenizer))) as url:
            values = values or base_values(tokenizer, *served_model(url))
            tapped = record_live(url, chosen, values)
            assert [e.request for e in tapped] == chosen
            for exchange in tapped:
                request, answer = exchange.request, exchange.answer
                direct = send(url, request.method, request.path, resolve(request.body, values))
                assert compare_answers(direct, answer, f"{mode} {request.name}") == []
                assert (answer.streamed, answer.chunks[-1:] if answer.streamed else None) == (
                    direct.streamed,
                    [DONE] if direct.streamed else None,
                ), request.name
                assert answer.dialect == request.dialect, request.name
                streamed += answer.streamed
    assert values["$stop_id"] is not None and streamed >= 10
