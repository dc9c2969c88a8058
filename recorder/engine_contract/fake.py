"""The fake engine, in this process on a loopback port, answering each contract request with the real engine's
tokens: what is compared is then only how each engine writes the same output, never what a random model said.

`RealTokensPolicy.expect(answer)` is set before each request; the fake engine is started in the same start mode
as the real one was (`EngineOptions.vllm_scale_out`, `vllm_auto_tool_choice`, `vllm_reasoning_parser`).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from tito_rl.fake_engine.app import EngineOptions, create_app
from tito_rl.fake_engine.channels.moe import DEFAULT_MOE, MoeShape
from tito_rl.fake_engine.policy import FinishKind, GenerateRequest, Generation
from tito_rl.recorder.engine_contract.exchange import DONE, Answer
from tito_rl.recorder.engine_contract.requests import BARE, FULL, ROUTES, SGLANG
from tito_rl.recorder.real_engine.paths import MAX_MODEL_LEN, SERVED_MODEL_NAME, VLLM_VERSION
from tito_rl.recorder.real_engine.server import free_port
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer


def output_of(answer: Answer, tokenizer: Any) -> tuple[list[int], str, Any]:
    """(output ids, finish, matched) of choice 0 in a real answer; the text's ids where no ids were returned."""
    sglang = _sglang_output(answer)
    if sglang is not None:
        return sglang
    choices: list[dict[str, Any]] = []
    if answer.streamed:
        for chunk in answer.chunks:
            if chunk != DONE and isinstance(chunk, dict):
                choices += [c for c in chunk.get("choices") or [] if isinstance(c, dict) and c.get("index", 0) == 0]
    elif isinstance(answer.body, dict):
        choices = [c for c in answer.body.get("choices") or [] if isinstance(c, dict)][:1]
    ids: list[int] = []
    text = reasoning = content = ""
    calls: dict[int, list[str]] = {}  # a tool call's index -> [name, arguments so far]
    had_ids = False
    finish, matched = "length", None
    for choice in choices:
        meta = choice.get("meta_info") if isinstance(choice.get("meta_info"), dict) else {}
        own = (
            choice.get("token_ids")
            or choice.get("response_token_ids")
            or ([t[1] for t in meta.get("output_token_logprobs") or []] if meta else None)
        )
        if isinstance(own, list):
            had_ids = True
            ids += own
        if choice.get("matched_stop") is not None:
            matched = choice["matched_stop"]
        message = choice.get("message") or choice.get("delta") or {}
        text += str(choice.get("text") or "")
        reasoning += str(message.get("reasoning") or message.get("reasoning_content") or "")
        content += str(message.get("content") or "")
        for at, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {} if isinstance(call, dict) else {}
            entry = calls.setdefault(int(call.get("index", at)), ["", ""])
            entry[0] = entry[0] or str(function.get("name") or "")
            entry[1] += str(function.get("arguments") or "")
        if choice.get("finish_reason"):
            finish = str(choice["finish_reason"])
            matched = choice.get("stop_reason", matched)
    if not had_ids:
        text = text or spelled(reasoning, content, calls)
        ids = list(tokenizer.encode(text, add_special_tokens=False)) if text else []
    if finish not in ("stop", "length", "abort"):
        finish = "stop"  # tool_calls: the engine stopped
    return ids, finish, matched


def spelled(reasoning: str, content: str, calls: dict[int, list[str]]) -> str:
    """The model's text behind a parsed chat answer, as Qwen3 spells it: the reasoning in its think block where
    anything follows it (alone, an unclosed one, which a reasoning parser reads as all reasoning), the content,
    each tool call."""
    tools = "".join(
        f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments or "{}"}}}\n</tool_call>'
        for name, arguments in (calls[i] for i in sorted(calls))
    )
    after = content + ("\n" if content and tools else "") + tools
    if reasoning and after:
        return f"<think>{reasoning}</think>{after}"
    return reasoning or after


def _sglang_output(answer: Answer) -> tuple[list[int], str, Any] | None:
    """SGLang's /generate: root `output_ids` (cumulative chunks when streamed: the last one holds them all) and
    `meta_info.finish_reason` `{type, matched}`."""
    bodies = [c for c in answer.chunks if isinstance(c, dict)] if answer.streamed else [answer.body]
    if bodies and isinstance(bodies[-1], list):  # a batch (or n > 1): a list of answers, the first one's
        bodies = [b for b in bodies[-1] if isinstance(b, dict)][:1]
    elif answer.streamed:  # a streamed batch: each chunk names its answer by `index`
        bodies = [b for b in bodies if b.get("index", 0) == 0]
    last = bodies[-1] if bodies and isinstance(bodies[-1], dict) else None
    if last is None or "output_ids" not in last:
        return None
    finish = (last.get("meta_info") or {}).get("finish_reason") or {}
    kind = finish.get("type", "length") if isinstance(finish, dict) else "length"
    matched = finish.get("matched") if isinstance(finish, dict) else None
    return list(last.get("output_ids") or []), kind if kind in ("stop", "length", "abort") else "stop", matched


TINY_MOE = MoeShape(layers=2, top_k=2, experts=8)  # the real SGLang's tiny Qwen3-MoE (recorder/real_engine)


def finish_kind(finish: str) -> FinishKind:
    """An engine's finish reason as a policy's: `tool_calls` (or anything else) is a stop."""
    if finish == "length":
        return "length"
    return "abort" if finish == "abort" else "stop"


class RealTokensPolicy:
    """Answers the next request with the output the real engine gave the same request."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.next: Generation = Generation(output_ids=[], finish="length")

    def expect(self, answer: Answer) -> None:
        ids, finish, matched = output_of(answer, self.tokenizer)
        self.next = Generation(output_ids=ids, finish=finish_kind(finish), matched=matched)

    def generate(self, req: GenerateRequest) -> Generation:
        return self.next


def fake_options(
    mode: str, tokenizer: Any, vllm_version: str = VLLM_VERSION, context_length: int = MAX_MODEL_LEN
) -> EngineOptions:
    if mode in (SGLANG, ROUTES):  # SGLang's own profile (0.5.23); routes: the tiny MoE (2 layers, top 2 of 8)
        return EngineOptions(
            model_name=SERVED_MODEL_NAME + ("-moe" if mode == ROUTES else ""),
            model_path=SERVED_MODEL_NAME,
            context_length=context_length,
            tokenizer=tokenizer,
            vocab_size=max(len(tokenizer), 151936),
            openai_dialect="sglang-openai",
            return_routed_experts=mode == ROUTES,
            moe=TINY_MOE if mode == ROUTES else DEFAULT_MOE,
        )
    full = mode != BARE
    reasoning = mode == FULL
    return EngineOptions(
        model_name=SERVED_MODEL_NAME,
        model_path=SERVED_MODEL_NAME,
        context_length=context_length,
        tokenizer=tokenizer,
        vocab_size=len(tokenizer),
        openai_dialect="vllm-openai",
        vllm_version=vllm_version,
        vllm_scale_out=full,
        vllm_auto_tool_choice=full,
        vllm_reasoning_parser=reasoning,
    )


@contextmanager
def running_fake(
    mode: str, policy: RealTokensPolicy, vllm_version: str = VLLM_VERSION, context_length: int = MAX_MODEL_LEN
) -> Iterator[str]:
    """The fake engine in `mode`'s start flags on a free loopback port in a thread; yields its base URL."""
    tokenizer = load_tokenizer()
    with running_app(create_app(policy, fake_options(mode, tokenizer, vllm_version, context_length))) as url:
        yield url


@contextmanager
def running_app(app: web.Application) -> Iterator[str]:
    """An aiohttp app on a free loopback port, served from a thread of its own; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    port = free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.run_until_complete(runner.cleanup())
        loop.close()
