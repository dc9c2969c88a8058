"""The contract's generated requests: what the field sends, and each route's options in combination.

The listed requests (`requests.py`) name what tito's dialects use; these are drawn rather than listed, so the
contract grows with what tito records:

- **From the field** (`field_requests`): every engine request in the committed cassettes of the gateways tito knows
  (FIELD_CASSETTES: those of `cassettes/targets/` and `cassettes/real_vllm/` the committed answers were recorded for,
  read with tito's cassette reader), deduplicated by start mode and structure (route, dialect and the body's key
  paths and types, plus the values that change an answer's structure: `stream`, `tool_choice`, `n`). Each is sent
  as recorded, made repeatable: the served model's name, a short output (`max_tokens`/`max_new_tokens` at most
  MAX_TOKENS; none added to `/tokenize`), no `rid`/`request_id` (random per call); no seed is added (see
  `repeatable`). An SGLang request that asks for expert routes, or comes from a cassette recorded around an engine
  serving them (its header's `engine_server_info` says `enable_return_routed_experts`), goes to the routes mode:
  the real tiny MoE started with `--enable-return-routed-experts` (`sglang-0.5.23-routes.json`), not the dense
  model. A vLLM one stays in the full mode: vLLM 0.32's CPU build refuses that flag at start
  (docs/engine-dialects.md, "Left out").
- **Options in combination** (`option_requests`): each route tito's dialects use, JSON and SSE, with each option
  they send (tools and tool choices incl. `required`, stop ids and strings, `logit_bias`, `n`, batches, seeds,
  `top_logprobs`/`top_logprobs_num`, `logprob_start_len`, `return_tokens_as_token_ids`, ...), `/tokenize` and
  `/detokenize` in each form, unknown routes and methods, bad bodies.

A generated request identical (resolved body, route, mode) to a listed one is dropped: it would be sent twice.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tito_rl.recorder.engine_contract.requests import (
    FULL,
    MAX_TOKENS,
    MESSAGES,
    MODEL,
    PROMPT_TEXT,
    ROUTES,
    SEED,
    SGLANG,
    STOP_ID,
    STOP_TEXT,
    WEATHER_TOOL,
    ContractRequest,
)
from tito_rl.recorder.engine_contract.shape import flatten

ROOT = Path(__file__).resolve().parents[2]
# The gateway cassettes whose engine requests the committed real answers hold, named one by one: a cassette added later
# joins the contract by adding it here and re-recording the answers live (`make engine-contract-live`,
# `make engine-contract-live-sglang`), never by merely existing (the committed answers would lack its requests).
FIELD_CASSETTES = tuple(
    f"cassettes/targets/{name}.tito"
    for name in (
        "agentlightning_mini_tool_loop",
        "agentlightning_mixed",
        "nemogym_mixed",
        "nemogym_opencode_tool_loop",
        "rllm_mixed",
        "rllm_opencode_tool_loop",
        "rllm_qwen_tool_loop",
        "slime_mixed",
        "slime_moe",
        "slime_retry",
        "verifiers_mixed",
        "verifiers_opencode_tool_loop",
        "verifiers_qwen_tool_loop",
        "moe_verifiers",
        "miles_moe",
    )
) + tuple(f"cassettes/real_vllm/{name}.tito" for name in ("rllm_vllm", "tito_vllm_generate", "tito_vllm_openai"))
SGLANG_DIALECTS = ("sglang", "sglang-openai", None)  # None: a cassette from before dialects (SGLang's /generate)
STRUCTURE_VALUES = ("stream", "tool_choice", "n")
VOLATILE = ("rid", "request_id")
NOT_GENERATING = ("/tokenize", "/detokenize")  # no output to limit
LOGIT_BIAS = {"0": -100}  # a bias that changes no greedy choice of the tiny model in practice: structure only


def field_requests(engine: str, root: Path = ROOT) -> list[ContractRequest]:
    """One request per start mode and distinct structure of the engine requests recorded in the committed gateway
    cassettes (SGLang's in the dense mode or, where routes are asked or served, the MoE's routes mode)."""
    from tito_rl.cassette.reader import read_cassette

    out: list[ContractRequest] = []
    seen: set[str] = set()
    for relative in FIELD_CASSETTES:
        path = str(root / relative)
        cassette = read_cassette(path)
        stem = Path(path).stem
        routes_served = serves_routes(cassette.header.extra)
        for log in cassette.sessions.values():
            for record in log.engine:
                if not isinstance(record.request, dict) or record.method != "POST":
                    continue
                sglang = record.dialect in SGLANG_DIALECTS
                if sglang != (engine == SGLANG):
                    continue
                dialect = record.dialect or "sglang"  # a cassette from before dialects: /generate's
                # as sent: two that differ only in a seed are one
                body = repeatable(record.request, sglang, record.path)
                mode = (ROUTES if routes_served or asks_routes(body) else SGLANG) if sglang else FULL
                key = mode + " " + structure_key(record.path, dialect, body)
                if key in seen:
                    continue
                seen.add(key)
                name = f"field {stem} {len([r for r in out if r.name.startswith(f'field {stem} ')]) + 1}"
                why = f"recorded in {relative.split('/')[1]}/{stem}.tito ({record.path})"
                out.append(ContractRequest(name, mode, "POST", record.path, body, why=why, dialect=dialect))
    return out


def serves_routes(extra: dict[str, Any]) -> bool:
    """Whether a cassette was recorded around an engine serving expert routes (its header's start arguments)."""
    info = extra.get("engine_server_info") if isinstance(extra, dict) else None
    return isinstance(info, dict) and info.get("enable_return_routed_experts") is True


def asks_routes(body: dict[str, Any]) -> bool:
    return body.get("return_routed_experts") is True


def structure_key(path: str, dialect: str | None, body: dict[str, Any]) -> str:
    shape = {k: sorted(v) for k, v in flatten(body).items()}
    values = {k: _value_key(body.get(k)) for k in STRUCTURE_VALUES if k in body}
    params = body.get("sampling_params")
    if isinstance(params, dict):
        values |= {f"sampling_params.{k}": _value_key(params.get(k)) for k in STRUCTURE_VALUES if k in params}
    return json.dumps([path, dialect, shape, values], sort_keys=True)


def _value_key(value: Any) -> Any:
    return value if isinstance(value, (str, int, bool)) or value is None else type(value).__name__


def repeatable(body: dict[str, Any], sglang: bool, path: str = "") -> dict[str, Any]:
    """The recorded body made repeatable against the tiny model: its name, a short output, no per-call ids.

    A limit is added only where the route generates: NeMo Gym's `POST /tokenize` (chat `messages`) is sent as recorded.
    """
    out: dict[str, Any] = {k: v for k, v in json.loads(json.dumps(body)).items() if k not in VOLATILE}
    if "model" in out:
        out["model"] = MODEL
    holders: list[Any] = [out, out.get("sampling_params")]
    for holder in holders:
        if not isinstance(holder, dict):
            continue
        for key in ("max_tokens", "max_new_tokens", "max_completion_tokens"):
            if key in holder and isinstance(holder[key], int):
                holder[key] = min(holder[key], MAX_TOKENS)
    # No seed is added: vLLM 0.32's CPU build dies on a seeded request whose long prompt is prefilled in chunks
    # (`EngineDeadError`: "CPU Generator does not use offset", seen here on rllm's 7,000-token prompts); one recorded
    # with a seed keeps it.
    limited = "max_tokens" in out or "max_completion_tokens" in out
    if not sglang and "sampling_params" not in out and not limited and path not in NOT_GENERATING:
        out["max_tokens"] = MAX_TOKENS
    params = out.get("sampling_params")
    if isinstance(params, dict):  # without a limit vLLM generates to the context's end, SGLang 128 tokens
        params.setdefault("max_new_tokens" if sglang else "max_tokens", MAX_TOKENS)
    return out


def _r(name: str, mode: str, method: str, path: str, body: Any = None, dialect: str = "vllm-openai") -> ContractRequest:
    return ContractRequest(f"option {name}", mode, method, path, body, why="an option in combination", dialect=dialect)


def _both(name: str, path: str, body: dict[str, Any], mode: str, dialect: str, sse: dict[str, Any]) -> list[Any]:
    return [
        _r(f"{name} json", mode, "POST", path, body, dialect),
        _r(f"{name} sse", mode, "POST", path, body | sse, dialect),
    ]


def vllm_option_requests() -> list[ContractRequest]:
    sse = {"stream": True, "stream_options": {"include_usage": True}}
    named = {"type": "function", "function": {"name": "get_weather"}}
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "seed": SEED, "logprobs": True}
    chat |= {"return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}}
    tools = {"tools": [WEATHER_TOOL], "max_tokens": 24}
    chat_options: dict[str, dict[str, Any]] = {
        "tools auto": tools | {"tool_choice": "auto"},
        "tools required": tools | {"tool_choice": "required"},
        "tools named": tools | {"tool_choice": named},
        "stop id": {"stop_token_ids": [STOP_ID]},
        "stop string": {"stop": [STOP_TEXT]},
        "logit_bias": {"logit_bias": LOGIT_BIAS},
        "n 2": {"n": 2},
        "top_logprobs 2": {"top_logprobs": 2},
        "tokens as ids": {"return_tokens_as_token_ids": True},
    }
    completion = {"model": MODEL, "prompt": "$prompt_ids", "max_tokens": MAX_TOKENS, "seed": SEED, "logprobs": 0}
    completion |= {"return_token_ids": True}
    completion_options: dict[str, dict[str, Any]] = {
        "stop id": {"stop_token_ids": [STOP_ID]},
        "stop string": {"stop": [STOP_TEXT]},
        "logit_bias": {"logit_bias": LOGIT_BIAS},
        "n 2": {"n": 2},
        "logprobs 2": {"logprobs": 2},
        "tokens as ids": {"return_tokens_as_token_ids": True},
        "text prompt": {"prompt": PROMPT_TEXT},
    }
    generate_params = {"max_tokens": MAX_TOKENS, "seed": SEED, "logprobs": 0}
    generate_options: dict[str, dict[str, Any]] = {
        "stop id": {"stop_token_ids": [STOP_ID]},
        "stop string": {"stop": [STOP_TEXT]},
        "logit_bias": {"logit_bias": LOGIT_BIAS},
        "n 2": {"n": 2},
        "logprobs 2": {"logprobs": 2},
    }
    out: list[ContractRequest] = []
    for name, extra in chat_options.items():
        out += _both(f"chat {name}", "/v1/chat/completions", chat | extra, FULL, "vllm-openai", sse)
    for name, extra in completion_options.items():
        out += _both(f"completions {name}", "/v1/completions", completion | extra, FULL, "vllm-openai", sse)
    for name, extra in generate_options.items():
        body = {"model": MODEL, "token_ids": "$prompt_ids", "sampling_params": generate_params | extra}
        out += _both(f"generate {name}", "/inference/v1/generate", body, FULL, "vllm-generate", {"stream": True})
    out += [
        _r(
            "tokenize messages tools",
            FULL,
            "POST",
            "/tokenize",
            {"model": MODEL, "messages": MESSAGES, "tools": [WEATHER_TOOL]},
        ),
        _r(
            "tokenize no special",
            FULL,
            "POST",
            "/tokenize",
            {"model": MODEL, "prompt": PROMPT_TEXT, "add_special_tokens": False},
        ),
        _r(
            "tokenize tokens",
            FULL,
            "POST",
            "/tokenize",
            {"model": MODEL, "prompt": PROMPT_TEXT, "return_token_strs": True},
        ),
        _r("detokenize tokens", FULL, "POST", "/detokenize", {"model": MODEL, "tokens": "$prompt_ids"}),
        _r("chat render", FULL, "POST", "/v1/chat/completions/render", chat),
        _r("unknown route", FULL, "POST", "/v1/no_such_route", {"model": MODEL}),
        _r("unknown get route", FULL, "GET", "/no_such_route"),
        _r("wrong method", FULL, "GET", "/v1/chat/completions"),
        _r("bad body messages", FULL, "POST", "/v1/chat/completions", {"model": MODEL, "messages": "hello"}),
        _r("bad body prompt", FULL, "POST", "/v1/completions", {"model": MODEL, "prompt": {"ids": [1]}}),
        _r(
            "bad body token_ids",
            FULL,
            "POST",
            "/inference/v1/generate",
            {"model": MODEL, "token_ids": ["a"], "sampling_params": generate_params},
            "vllm-generate",
        ),
    ]
    return out


def sglang_option_requests() -> list[ContractRequest]:
    sse = {"stream": True}
    base = {"input_ids": "$prompt_ids", "return_logprob": True}
    params = {"max_new_tokens": MAX_TOKENS, "temperature": 0}
    options: dict[str, dict[str, Any]] = {
        "stop id": {"sampling_params": params | {"stop_token_ids": [STOP_ID]}},
        "stop string": {"sampling_params": params | {"stop": [STOP_TEXT]}},
        "logit_bias": {"sampling_params": params | {"logit_bias": LOGIT_BIAS}},
        "n 2": {"sampling_params": params | {"n": 2}},
        "seeded": {"sampling_params": params | {"temperature": 1.0, "sampling_seed": SEED}},
        "top_logprobs_num 2": {"top_logprobs_num": 2},
        "logprob_start_len 0": {"logprob_start_len": 0},
        "text in logprobs": {"return_text_in_logprobs": True},
        "no logprobs": {"return_logprob": False},
        "batch": {"input_ids": ["$prompt_ids", "$prompt_ids"]},
        "text": {"input_ids": None, "text": PROMPT_TEXT},
        "slime sampling": {
            "sampling_params": params
            | {"skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True}
        },
    }
    out: list[ContractRequest] = []
    for name, extra in options.items():
        body = {k: v for k, v in ({"sampling_params": params} | base | extra).items() if v is not None}
        out += _both(f"generate {name}", "/generate", body, SGLANG, "sglang", sse)
    out.append(
        _r(
            "generate max_new_tokens 0",
            SGLANG,
            "POST",
            "/generate",
            base | {"sampling_params": params | {"max_new_tokens": 0}, "logprob_start_len": 0},
            "sglang",
        )
    )
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": True}
    tools = {"tools": [WEATHER_TOOL], "max_tokens": 24}
    chat_options: dict[str, dict[str, Any]] = {
        "messages": {},
        "tools auto": tools | {"tool_choice": "auto"},
        "tools required": tools | {"tool_choice": "required"},
        "stop string": {"stop": [STOP_TEXT]},
        "n 2": {"n": 2},
        "top_logprobs 2": {"top_logprobs": 2},
    }
    for name, extra in chat_options.items():
        out += _both(f"chat {name}", "/v1/chat/completions", chat | extra, SGLANG, "sglang-openai", sse)
    completion = {"model": MODEL, "prompt": PROMPT_TEXT, "max_tokens": MAX_TOKENS, "temperature": 0}
    out += _both("completions text", "/v1/completions", completion, SGLANG, "sglang-openai", sse)
    out += [
        _r("model info", SGLANG, "GET", "/get_model_info", dialect="sglang-openai"),
        _r("server info", SGLANG, "GET", "/get_server_info", dialect="sglang-openai"),
        _r("model info new", SGLANG, "GET", "/model_info", dialect="sglang-openai"),
        _r("health", SGLANG, "GET", "/health", dialect="sglang-openai"),
        _r("tokenize", SGLANG, "POST", "/v1/tokenize", {"model": MODEL, "prompt": PROMPT_TEXT}, "sglang-openai"),
        _r("detokenize", SGLANG, "POST", "/v1/detokenize", {"model": MODEL, "tokens": "$prompt_ids"}, "sglang-openai"),
        _r("unknown route", SGLANG, "POST", "/no_such_route", {"input_ids": [1]}, "sglang-openai"),
        _r("wrong method", SGLANG, "DELETE", "/generate", None, "sglang"),
        _r(
            "bad body input_ids", SGLANG, "POST", "/generate", {"input_ids": "abc", "sampling_params": params}, "sglang"
        ),
        _r(
            "bad body sampling_params",
            SGLANG,
            "POST",
            "/generate",
            {"input_ids": [1], "sampling_params": [1]},
            "sglang",
        ),
        _r("abort unknown rid", SGLANG, "POST", "/abort_request", {"rid": "no-such-rid"}, "sglang"),
        # Last: it changes the server's weight version for every later answer.
        _r("update weight version", SGLANG, "POST", "/update_weight_version", {"new_version": "v2"}, "sglang-openai"),
    ]
    return out


def option_requests(engine: str) -> list[ContractRequest]:
    return sglang_option_requests() if engine == SGLANG else vllm_option_requests()


def without_repeats(listed: Iterable[ContractRequest], generated: Iterable[ContractRequest]) -> list[ContractRequest]:
    """`generated` less any request the listed ones (or an earlier generated one) already send."""
    seen = {_identity(r) for r in listed}
    out: list[ContractRequest] = []
    for request in generated:
        if _identity(request) in seen:
            continue
        seen.add(_identity(request))
        out.append(request)
    return out


def _identity(request: ContractRequest) -> str:
    return json.dumps([request.mode, request.method, request.path, request.body], sort_keys=True)


def all_requests(engine: str, root: Path = ROOT) -> list[ContractRequest]:
    """The listed requests, then the field's, then the options in combination (each once); SGLang's to the dense
    model only (the routes mode's field requests are `route_field_requests`)."""
    from tito_rl.recorder.engine_contract.requests import requests_for

    listed = requests_for(engine)
    field = [r for r in field_requests(engine, root) if r.mode != ROUTES]
    return listed + without_repeats(listed, field + option_requests(engine))


def route_field_requests(root: Path = ROOT) -> list[ContractRequest]:
    """The field's SGLang requests for the MoE started with `--enable-return-routed-experts` (the routes mode)."""
    return [r for r in field_requests(SGLANG, root) if r.mode == ROUTES]
