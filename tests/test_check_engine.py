"""`tito check-engine URL` against the fake engine in every mode it has (no GPU, no vLLM): which dialects answer,
which are token-faithful, the start flag or field named where one is missing, and the exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from tito_rl.fake_engine.app import EngineOptions, create_app
from tito_rl.fake_engine.policies.demo import demo_policy
from tito_rl.recorder.engine_contract.check import EngineReport, check_engine, run
from tito_rl.recorder.engine_contract.fake import running_app
from tito_rl.recorder.real_engine.server import free_port
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer


@contextmanager
def fake(**options: Any) -> Iterator[str]:
    tokenizer = load_tokenizer()
    app = create_app(demo_policy(tokenizer), EngineOptions(tokenizer=tokenizer, model_name="tiny", **options))
    with running_app(app) as url:
        yield url


def by_route(report: EngineReport) -> dict[str, Any]:
    return {c.route: c for c in report.checks}


def test_the_fake_engine_as_vllm_with_every_flag_is_faithful_in_every_dialect():
    with fake(openai_dialect="vllm-openai") as url:
        report = check_engine(url)
    checks = by_route(report)
    assert report.model == "tiny"  # learned from GET /v1/models
    assert report.faithful == ["sglang", "vllm-generate", "vllm-openai"]
    assert all(c.faithful and not c.missing and not c.notes for c in checks.values())


def test_without_scale_out_the_generate_route_names_the_flag():
    with fake(openai_dialect="vllm-openai", vllm_scale_out=False) as url:
        report = check_engine(url)
    generate = by_route(report)["POST /inference/v1/generate"]
    assert (generate.served, generate.faithful, generate.status) == (False, False, 403)
    assert generate.missing == ["--enable-scale-out (vLLM serves /inference/v1/generate only with it)"]
    assert "vllm-generate" not in report.faithful and "vllm-openai" in report.faithful
    assert "--enable-scale-out" in generate.line()


def test_without_auto_tool_choice_the_chat_check_says_so_and_stays_faithful():
    with fake(openai_dialect="vllm-openai", vllm_auto_tool_choice=False) as url:
        report = check_engine(url)
    chat = by_route(report)["POST /v1/chat/completions"]
    assert chat.faithful and any("--enable-auto-tool-choice" in note for note in chat.notes)


def test_without_a_reasoning_parser_every_dialect_stays_faithful():
    with fake(openai_dialect="vllm-openai", vllm_reasoning_parser=False) as url:
        report = check_engine(url)
    assert report.faithful == ["sglang", "vllm-generate", "vllm-openai"]


def test_the_fake_engine_as_sglang_reports_sglangs_chat():
    with fake(openai_dialect="sglang-openai") as url:
        report = check_engine(url)
    chat = by_route(report)["POST /v1/chat/completions"]
    assert chat.dialect == "sglang-openai" and chat.served
    assert "sglang" in report.faithful
    assert "POST /v1/completions (ids)" not in by_route(report)  # vLLM's completions are not probed on SGLang


def test_an_older_vllm_profile_is_still_faithful():
    with fake(openai_dialect="vllm-openai", vllm_version="0.31.0") as url:
        report = check_engine(url)
    assert "vllm-generate" in report.faithful and "vllm-openai" in report.faithful


def stub_engine(chat_body: dict[str, Any]) -> web.Application:
    """An engine that serves only chat, answering with `chat_body` (an old vLLM: no token ids)."""
    app = web.Application()

    async def chat(request: web.Request) -> web.Response:
        return web.json_response(chat_body)

    app.router.add_post("/v1/chat/completions", chat)
    return app


def test_an_engine_without_token_ids_is_not_faithful_and_says_which_field():
    old = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "length",
                "logprobs": {"content": [{"token": "hi", "logprob": -0.5}]},
            }
        ]
    }
    with running_app(stub_engine(old)) as url:
        report = check_engine(url)
        assert run(Namespace(url=url, json=False), say=lambda line: None) == 1
    chat = by_route(report)["POST /v1/chat/completions"]
    assert chat.served and not chat.faithful
    assert chat.missing == ["return_token_ids support (vLLM >= 0.10.2)"]
    assert report.faithful == []
    assert not by_route(report)["POST /generate"].served


def test_exit_codes_from_the_command_line():
    lines: list[str] = []
    with fake(openai_dialect="vllm-openai", vllm_scale_out=False) as url:
        assert run(Namespace(url=url, json=False), say=lines.append) == 0
    assert lines[0] == f"engine {url} (model tiny)"
    assert any("--enable-scale-out" in line for line in lines)
    assert lines[-1] == "token-faithful: sglang, vllm-openai"
    with fake(openai_dialect="vllm-openai") as url:  # an OpenAI base URL (".../v1") names the same engine
        assert run(Namespace(url=url + "/v1/", json=False), say=lines.append) == 0
    assert lines[-1] == "token-faithful: sglang, vllm-generate, vllm-openai"
    closed = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "tito_rl", "check-engine", closed], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert result.stdout.strip().splitlines() == [
        f"tito check-engine: {closed} cannot be reached (GET {closed}/v1/models: ConnectionError)"
    ]


def test_json_report():
    lines: list[str] = []
    with fake(openai_dialect="vllm-openai") as url:
        assert run(Namespace(url=url, json=True), say=lines.append) == 0
    report = json.loads("\n".join(lines))
    assert report["token_faithful"] == ["sglang", "vllm-generate", "vllm-openai"]
    assert {d["dialect"] for d in report["dialects"]} == {"sglang", "vllm-openai", "vllm-generate"}
