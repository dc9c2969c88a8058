"""The contract's requests: what tito's dialects send an engine, with every option they use, and the errors.

Each request names the start mode it runs under: `full` (vLLM started with `--enable-scale-out`,
`--enable-auto-tool-choice --tool-call-parser hermes` and `--reasoning-parser qwen3`), `tools` (the same without the
reasoning parser: forced tool calls then start at once) or `bare` (none of them), so the routes and options that
need a start flag are checked both ways. Prompts are token ids of the embedded
tokenizer or short chat messages; every sampled request is seeded, so the real engine answers alike each time.
Two requests take a value from an earlier answer (`$stop_id`, `$stop_text`: the third token the seeded chat
request produced, and its text), so a stop id or string is sure to be met; the values used are stored with the
recorded answers.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

FULL, BARE, TOOLS = "full", "bare", "tools"
SGLANG = "sglang"  # SGLang started with --reasoning-parser qwen3 --tool-call-parser qwen25 (point it at your own)
ROUTES = "routes"  # SGLang serving the tiny Qwen3-MoE with --enable-return-routed-experts (its routes recording)
MODEL = "$model"  # the model name the engine serves, learned from GET /v1/models
STOP_ID, STOP_TEXT = "$stop_id", "$stop_text"
SEED = 7
MAX_TOKENS = 6
MESSAGES = [{"role": "user", "content": "Say hello in one word."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PROMPT_TEXT = "The capital of France is"


@dataclass(frozen=True)
class ContractRequest:
    """One request of the contract; `body` may hold `$model`, `$stop_id`, `$stop_text`, `$prompt_ids`."""

    name: str
    mode: str
    method: str
    path: str
    body: dict[str, Any] | None = None
    why: str = ""
    dialect: str = "vllm-openai"
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "seed": SEED} | extra


def _ids_on(**extra: Any) -> dict[str, Any]:
    return _chat(**{"logprobs": True, "top_logprobs": 0, "return_token_ids": True, **extra})


def _completion(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": "$prompt_ids",
        "max_tokens": MAX_TOKENS,
        "seed": SEED,
        "logprobs": 0,
        "return_token_ids": True,
    } | extra


def _generate(**params: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "token_ids": "$prompt_ids",
        "sampling_params": {"max_tokens": MAX_TOKENS, "seed": SEED, "logprobs": 0, **params},
    }


SSE_USAGE = {"include_usage": True}


def vllm_requests() -> list[ContractRequest]:
    """Every request tito's vLLM dialects send, and what goes wrong around them (module docstring)."""
    r = ContractRequest
    named = {"type": "function", "function": {"name": "get_weather"}}
    return [
        r("models", FULL, "GET", "/v1/models", why="the served model's name"),
        r("chat json ids", FULL, "POST", "/v1/chat/completions", _ids_on()),
        r("chat json top_logprobs 2", FULL, "POST", "/v1/chat/completions", _ids_on(top_logprobs=2)),
        r("chat json no ids", FULL, "POST", "/v1/chat/completions", _chat(logprobs=True)),
        r(
            "chat json extra_body ids",
            FULL,
            "POST",
            "/v1/chat/completions",
            _chat(logprobs=True, extra_body={"return_token_ids": True}),
            why="rllm's gateway nests the flag in a literal extra_body key: vLLM ignores it",
        ),
        r("chat json tokens as ids", FULL, "POST", "/v1/chat/completions", _ids_on(return_tokens_as_token_ids=True)),
        r("chat json stop id", FULL, "POST", "/v1/chat/completions", _ids_on(stop_token_ids=[STOP_ID])),
        r("chat json stop string", FULL, "POST", "/v1/chat/completions", _ids_on(stop=[STOP_TEXT])),
        r(
            "chat json no thinking",
            FULL,
            "POST",
            "/v1/chat/completions",
            _ids_on(chat_template_kwargs={"enable_thinking": False}),
            why="thinking off: the answer is content",
        ),
        r(
            "chat sse no thinking",
            FULL,
            "POST",
            "/v1/chat/completions",
            _ids_on(chat_template_kwargs={"enable_thinking": False}, stream=True, stream_options=SSE_USAGE),
        ),
        r("chat sse ids", FULL, "POST", "/v1/chat/completions", _ids_on(stream=True, stream_options=SSE_USAGE)),
        r("chat sse no usage", FULL, "POST", "/v1/chat/completions", _ids_on(stream=True)),
        r(
            "chat sse continuous usage",
            FULL,
            "POST",
            "/v1/chat/completions",
            _ids_on(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
        ),
        r(
            "chat sse stop id",
            FULL,
            "POST",
            "/v1/chat/completions",
            _ids_on(stream=True, stream_options=SSE_USAGE, stop_token_ids=[STOP_ID]),
        ),
        r("chat tools auto", FULL, "POST", "/v1/chat/completions", _ids_on(tools=[WEATHER_TOOL], tool_choice="auto")),
        r("chat tools none", FULL, "POST", "/v1/chat/completions", _ids_on(tools=[WEATHER_TOOL], tool_choice="none")),
        r(
            "chat tools required",
            FULL,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=24),
        ),
        r(
            "chat tools named",
            FULL,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice=named, max_tokens=24),
        ),
        r(
            "chat sse tools required",
            FULL,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=24, stream=True, stream_options=SSE_USAGE),
        ),
        r("chat no messages", FULL, "POST", "/v1/chat/completions", {"model": MODEL, "max_tokens": MAX_TOKENS}),
        r(
            "chat over-long",
            FULL,
            "POST",
            "/v1/chat/completions",
            _ids_on(max_tokens=9000),
            why="prompt plus max_tokens beyond --max-model-len 8192",
        ),
        r("completions json", FULL, "POST", "/v1/completions", _completion()),
        r("completions sse", FULL, "POST", "/v1/completions", _completion(stream=True, stream_options=SSE_USAGE)),
        r("completions stop id", FULL, "POST", "/v1/completions", _completion(stop_token_ids=[STOP_ID])),
        r("completions no prompt", FULL, "POST", "/v1/completions", {"model": MODEL, "max_tokens": MAX_TOKENS}),
        r("completions over-long", FULL, "POST", "/v1/completions", _completion(prompt="$long_prompt_ids")),
        r(
            "generate json",
            FULL,
            "POST",
            "/inference/v1/generate",
            {**_generate(), "return_token_ids": True},
            dialect="vllm-generate",
        ),
        r(
            "generate json no return_token_ids",
            FULL,
            "POST",
            "/inference/v1/generate",
            _generate(),
            dialect="vllm-generate",
        ),
        r(
            "generate sse",
            FULL,
            "POST",
            "/inference/v1/generate",
            {**_generate(), "return_token_ids": True, "stream": True},
            dialect="vllm-generate",
        ),
        r(
            "generate stop id",
            FULL,
            "POST",
            "/inference/v1/generate",
            {**_generate(stop_token_ids=[STOP_ID]), "return_token_ids": True},
            dialect="vllm-generate",
        ),
        r(
            "generate text mode",
            FULL,
            "POST",
            "/inference/v1/generate",
            {**_generate(), "return_token_ids": True, "output_mode": "text"},
            dialect="vllm-generate",
        ),
        r(
            "generate no sampling_params",
            FULL,
            "POST",
            "/inference/v1/generate",
            {"model": MODEL, "token_ids": "$prompt_ids"},
            dialect="vllm-generate",
        ),
        r(
            "generate empty token_ids",
            FULL,
            "POST",
            "/inference/v1/generate",
            {"model": MODEL, "token_ids": [], "sampling_params": {"max_tokens": MAX_TOKENS}},
            dialect="vllm-generate",
        ),
        r(
            "generate over-long",
            FULL,
            "POST",
            "/inference/v1/generate",
            {**_generate(), "token_ids": "$long_prompt_ids"},
            dialect="vllm-generate",
        ),
        r(
            "sglang generate path",
            FULL,
            "POST",
            "/generate",
            {"input_ids": "$prompt_ids"},
            why="SGLang's route on a vLLM engine",
            dialect="sglang",
        ),
        r("tokenize prompt", FULL, "POST", "/tokenize", {"model": MODEL, "prompt": PROMPT_TEXT}),
        r("tokenize messages", FULL, "POST", "/tokenize", {"model": MODEL, "messages": MESSAGES}),
        r("detokenize", FULL, "POST", "/detokenize", {"model": MODEL, "tokens": "$prompt_ids"}),
        r(
            "tools chat json ids",
            TOOLS,
            "POST",
            "/v1/chat/completions",
            _ids_on(),
            why="no reasoning parser: the answer is content",
        ),
        r(
            "tools chat tools required",
            TOOLS,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=24),
            why="structured outputs spell <tool_call> in text; cut by max_tokens: content, no calls",
        ),
        r(
            "tools chat tools named",
            TOOLS,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice=named, max_tokens=24),
        ),
        r(
            "tools chat sse tools required",
            TOOLS,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=24, stream=True, stream_options=SSE_USAGE),
            why="the cut call streamed as delta.tool_calls: its name, then arguments",
        ),
        r(
            "tools chat sse tools named",
            TOOLS,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice=named, max_tokens=24, stream=True, stream_options=SSE_USAGE),
        ),
        r(
            "tools chat sse tools auto",
            TOOLS,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice="auto", stream=True, stream_options=SSE_USAGE),
        ),
        r(
            "bare chat json ids",
            BARE,
            "POST",
            "/v1/chat/completions",
            _ids_on(),
            why="no reasoning parser: the message's reasoning field still there",
        ),
        r(
            "bare chat tools auto",
            BARE,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice="auto"),
            why="needs --enable-auto-tool-choice",
        ),
        r(
            "bare chat tools none",
            BARE,
            "POST",
            "/v1/chat/completions",
            _ids_on(tools=[WEATHER_TOOL], tool_choice="none"),
        ),
        r(
            "bare generate json",
            BARE,
            "POST",
            "/inference/v1/generate",
            {**_generate(), "return_token_ids": True},
            why="needs --enable-scale-out",
            dialect="vllm-generate",
        ),
        r("bare completions json", BARE, "POST", "/v1/completions", _completion()),
    ]


def _sglang_generate(**extra: Any) -> dict[str, Any]:
    return {
        "input_ids": "$prompt_ids",
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0},
    } | extra


def sglang_requests() -> list[ContractRequest]:
    """What tito's SGLang dialects send (slime and AReaL's /generate, miles' chat with input_ids), greedy: SGLang
    has no per-request seed on every release, and greedy decoding repeats. Run against a real SGLang with
    `python -m tito_rl.recorder.engine_contract.cli live --engine sglang --url URL` (docs/engine-dialects.md)."""
    r = ContractRequest
    chat_ids = {
        "model": MODEL,
        "messages": MESSAGES,
        "input_ids": "$prompt_ids",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "logprobs": True,
    }
    return [
        r("models", SGLANG, "GET", "/v1/models", dialect="sglang-openai"),
        r("generate json", SGLANG, "POST", "/generate", _sglang_generate(), dialect="sglang"),
        r("generate sse", SGLANG, "POST", "/generate", _sglang_generate(stream=True), dialect="sglang"),
        r(
            "generate stop id",
            SGLANG,
            "POST",
            "/generate",
            _sglang_generate(
                sampling_params={"max_new_tokens": MAX_TOKENS, "temperature": 0, "stop_token_ids": [STOP_ID]}
            ),
            dialect="sglang",
        ),
        r(
            "generate stop string",
            SGLANG,
            "POST",
            "/generate",
            _sglang_generate(sampling_params={"max_new_tokens": MAX_TOKENS, "temperature": 0, "stop": [STOP_TEXT]}),
            dialect="sglang",
        ),
        r("generate empty input_ids", SGLANG, "POST", "/generate", _sglang_generate(input_ids=[]), dialect="sglang"),
        r(
            "generate over-long",
            SGLANG,
            "POST",
            "/generate",
            _sglang_generate(input_ids="$long_prompt_ids"),
            dialect="sglang",
        ),
        r(
            "generate unknown sampling key",
            SGLANG,
            "POST",
            "/generate",
            _sglang_generate(sampling_params={"max_new_tokens": MAX_TOKENS, "no_such_key": 1}),
            dialect="sglang",
        ),
        r(
            "chat input_ids meta_info",
            SGLANG,
            "POST",
            "/v1/chat/completions",
            chat_ids | {"return_meta_info": True, "return_prompt_token_ids": True},
            dialect="sglang-openai",
        ),
        r(
            "chat input_ids token ids",
            SGLANG,
            "POST",
            "/v1/chat/completions",
            chat_ids | {"return_token_ids": True},
            dialect="sglang-openai",
        ),
        r(
            "chat sse input_ids",
            SGLANG,
            "POST",
            "/v1/chat/completions",
            chat_ids | {"stream": True},
            dialect="sglang-openai",
        ),
        r(
            "chat sse with ids refused",
            SGLANG,
            "POST",
            "/v1/chat/completions",
            chat_ids | {"stream": True, "return_token_ids": True},
            dialect="sglang-openai",
        ),
        r(
            "completions ids",
            SGLANG,
            "POST",
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": "$prompt_ids",
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "logprobs": 0,
                "return_token_ids": True,
            },
            dialect="sglang-openai",
        ),
    ]


def requests_for(engine: str) -> list[ContractRequest]:
    return sglang_requests() if engine == SGLANG else vllm_requests()


def resolve(value: Any, values: dict[str, Any]) -> Any:
    """`value` with each `$name` string replaced by `values[name]` (deep; the request itself is not changed)."""
    if isinstance(value, str) and value in values:
        return copy.deepcopy(values[value])
    if isinstance(value, dict):
        return {k: resolve(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, values) for v in value]
    return value
