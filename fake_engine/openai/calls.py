"""One OpenAI-dialect request, read into what the app needs: which dialect and endpoint, the prompt (ids, or
messages the engine renders), what the caller asked to get back, and the policy's sampling parameters.

Which engine a shared path speaks is told as the recorder tells it (`trajectory/dialects/registry.py`): SGLang's
own request fields (`input_ids`, `return_meta_info`, `return_prompt_token_ids`, `no_stop_trim`) mean
`sglang-openai`, anything else `vllm-openai`; `EngineOptions.openai_dialect` may force one. A literal `extra_body:
{"return_token_ids": true}` in the JSON (what the OpenAI client would have merged into the root; rllm's gateway sends
it beside the root flag) is ignored as vLLM 0.32 ignores it (the engine contract: 200, no ids). Error envelopes
are each engine's: vLLM's nested `{"error": {...}}`, SGLang's flat `{"object": "error", ...}`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tito_rl.fake_engine.openai.vllm_versions import VLLM_DEFAULT_VERSION, VllmProfile, vllm_profile
from tito_rl.fake_engine.sglang.validation import EngineHTTPError
from tito_rl.trajectory.dialects.registry import detect_dialect, endpoint_of
from tito_rl.trajectory.dialects.view import SGLANG_OPENAI, VLLM_GENERATE

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
GENERATE_PATH = "/inference/v1/generate"
REQUEST_ID_HEADER = "X-Request-Id"


def vllm_error(
    status: int, message: str, err_type: str = "BadRequestError", param: str | None = None
) -> dict[str, Any]:
    """vLLM's envelope; `param` names the field at fault (`body.<field>` for a missing one, `max_tokens`,
    `input_tokens`), as 0.32 fills it."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def sglang_error(status: int, message: str, err_type: str = "BadRequestError") -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def error_body(dialect: str, status: int, message: str) -> dict[str, Any]:
    """An HTTP error (a fault's 5xx included) in the dialect's envelope."""
    err_type = (
        "BadRequestError" if status < 500 else ("ServiceUnavailableError" if status == 503 else "InternalServerError")
    )
    if dialect == SGLANG_OPENAI:
        return sglang_error(status, message, err_type)
    return vllm_error(status, message, err_type)


def bad_request(dialect: str, message: str, param: str | None = None) -> EngineHTTPError:
    body = error_body(dialect, 400, message)
    if param is not None and isinstance(body.get("error"), dict):
        body["error"]["param"] = param
    return EngineHTTPError(400, body)


@dataclass
class OpenAICall:
    """A validated request of one of the OpenAI-compatible dialects."""

    dialect: str
    endpoint: str  # chat | completions | generate
    body: dict[str, Any]
    prompt_ids: list[int] | None  # from the request; None: messages the engine renders (vLLM chat)
    stream: bool
    rid: str
    model: str
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    return_prompt_token_ids: bool = False  # SGLang: on the choice
    return_meta_info: bool = False  # SGLang: choices[0].meta_info as /generate writes it
    tokens_as_ids: bool = False  # vLLM: logprob entries' token reads "token_id:N"
    max_tokens: int | None = None  # None: up to the context length
    skip_special_tokens: bool = True
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM: `stream_options.continuous_usage_stats`, usage on every chunk
    sampling: dict[str, Any] = field(default_factory=dict)  # as the policy sees them (SGLang's names)
    vllm: VllmProfile = field(default_factory=lambda: vllm_profile(VLLM_DEFAULT_VERSION))  # the release imitated
    reasoning_parser: bool = True  # vLLM started with `--reasoning-parser qwen3`
    return_routed_experts: bool = False  # SGLang's routes ask (vLLM sends them unasked when started with them)
    routed_experts_start_len: int = 0
    routed_experts_prompt_start: int = 0  # vLLM 0.32: the routes' first row (`check_prompt_start`)

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        tools = self.body.get("tools")
        return tools if isinstance(tools, list) and tools else None

    @property
    def tool_parsing(self) -> bool:
        """Whether the engine runs its tool parser: tools offered and `tool_choice` not "none"."""
        return self.tools is not None and self.body.get("tool_choice", "auto") != "none"

    @property
    def thinking(self) -> bool:
        kwargs = self.body.get("chat_template_kwargs")
        return not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)


def _flag(body: dict[str, Any], key: str, dialect: str = "") -> bool:
    """A root flag. vLLM reads only the root (a literal `extra_body` key is an unknown field it ignores: no ids,
    which shows a gateway's bug instead of hiding it); SGLang's server takes the nested one too."""
    extra = body.get("extra_body")
    nested = dialect == SGLANG_OPENAI and isinstance(extra, dict) and bool(extra.get(key))
    return bool(body.get(key)) or nested


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return list(value)
    return None


def _int(body: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = body.get(key)
        if value is not None:
            return int(value)
    return None


def dialect_of(path: str, body: Any, forced: str | None) -> str:
    """The dialect a request on `path` speaks (module docstring)."""
    return detect_dialect(path, body, hint=forced)


def parse_call(path: str, body: Any, headers: Mapping[str, str], model_name: str, forced: str | None) -> OpenAICall:
    """Read and check one request; raises EngineHTTPError (400) in the dialect's envelope."""
    endpoint = endpoint_of(path)
    dialect = dialect_of(path, body, forced)
    if not isinstance(body, dict):
        raise bad_request(dialect, "Input should be a valid dictionary")
    rid = str(body.get("rid") or body.get("request_id") or headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex)
    stream = bool(body.get("stream"))
    if dialect == VLLM_GENERATE:
        return _generate_call(body, rid, model_name, stream)
    model = str(body.get("model") or model_name)
    if endpoint == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request(dialect, "messages: Field required (a non-empty list)", "body.messages")
        prompt = _ids(body.get("input_ids")) if dialect == SGLANG_OPENAI else None
        if dialect == SGLANG_OPENAI and body.get("input_ids") is not None and prompt is None:
            raise bad_request(dialect, "input_ids: Input should be a non-empty list of integers")
    else:
        prompt = _ids(body.get("prompt"))
        if prompt is None and isinstance(body.get("prompt"), str) and body["prompt"]:
            prompt = None  # a text prompt: the handler encodes it with the engine's tokenizer
        elif prompt is None:
            raise bad_request(
                dialect, "prompt: the fake engine takes a token-id prompt (a list of integers)", "body.prompt"
            )
    logprobs_value = body.get("logprobs")
    if endpoint == "completions":
        logprobs, top = logprobs_value is not None and logprobs_value is not False, int(logprobs_value or 0)
    else:
        logprobs, top = bool(logprobs_value), int(body.get("top_logprobs") or 0)
    call = OpenAICall(
        dialect=dialect,
        endpoint=endpoint,
        body=body,
        prompt_ids=prompt,
        stream=stream,
        rid=rid,
        model=model,
        logprobs=logprobs,
        top_logprobs=top,
        return_token_ids=_flag(body, "return_token_ids", dialect),
        return_prompt_token_ids=bool(body.get("return_prompt_token_ids")),
        return_meta_info=bool(body.get("return_meta_info")),
        return_routed_experts=bool(body.get("return_routed_experts")),
        routed_experts_start_len=_int(body, "routed_experts_start_len") or 0,
        tokens_as_ids=bool(body.get("return_tokens_as_token_ids")),
        max_tokens=_int(body, "max_completion_tokens", "max_tokens"),
        skip_special_tokens=body.get("skip_special_tokens", True) is not False,
        include_usage=isinstance(body.get("stream_options"), dict)
        and bool(body["stream_options"].get("include_usage")),
        continuous_usage=isinstance(body.get("stream_options"), dict)
        and bool(body["stream_options"].get("continuous_usage_stats")),
    )
    if dialect == SGLANG_OPENAI and stream:
        # SGLang 0.5.23 serving_chat refuses these on a stream (ValueError -> 400).
        for key in ("return_prompt_token_ids", "return_token_ids", "return_meta_info"):
            if body.get(key):
                raise bad_request(
                    dialect, f"{key} is not supported with streaming. Please set stream=false when using {key}=true."
                )
    call.sampling = _sampling(body, call)
    return call


PROMPT_START = "routed_experts_prompt_start"


def _prompt_start(value: Any, dialect: str) -> int:
    """vLLM 0.32's `routed_experts_prompt_start` as its request models type it: an int, read leniently as pydantic
    reads one (the real engine takes `"3"`; chat and completions: `Field(ge=0)`, pydantic's 400; generate:
    SamplingParams' `int`, its bound checked against the prompt later)."""
    numeric_text = isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value) is not None
    if numeric_text or (isinstance(value, float) and value.is_integer()):
        value = int(value)
    if type(value) is not int:
        raise bad_request(dialect, f"{PROMPT_START}: Input should be a valid integer", PROMPT_START)
    if value < 0 and dialect != VLLM_GENERATE:
        raise bad_request(dialect, f"{PROMPT_START}: Input should be greater than or equal to 0", PROMPT_START)
    return value


def read_prompt_start(call: OpenAICall) -> None:
    """Set `call.routed_experts_prompt_start` from the request where the vLLM release imitated reads it (generate:
    inside `sampling_params`; chat and completions: the body's root); once `call.vllm` is the engine's release."""
    if call.dialect == SGLANG_OPENAI or not call.vllm.routed_experts_prompt_start:
        return
    where = call.body.get("sampling_params") if call.dialect == VLLM_GENERATE else call.body
    assert isinstance(where, dict)  # checked when the call was parsed
    call.routed_experts_prompt_start = _prompt_start(where.get(PROMPT_START, 0), call.dialect)


def check_prompt_start(call: OpenAICall, prompt_len: int) -> None:
    """vLLM 0.32's input processor (`v1/engine/input_processor.py`), for every request whether or not the engine
    returns routes: the start must lie in `[0, prompt_len]`, else a VLLMValidationError, a 400 naming the parameter
    and the value (`vllm/exceptions.py` `__str__`)."""
    start = call.routed_experts_prompt_start
    if not 0 <= start <= prompt_len:
        raise bad_request(
            call.dialect,
            f"{PROMPT_START} must be between 0 and the prompt length ({prompt_len}), inclusive. "
            f"(parameter={PROMPT_START}, value={start})",
            PROMPT_START,
        )


def _sampling(body: dict[str, Any], call: OpenAICall) -> dict[str, Any]:
    keys = (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "stop",
        "stop_token_ids",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "ignore_eos",
        "no_stop_trim",
        "skip_special_tokens",
        "min_tokens",
        "logit_bias",
        "n",
        "include_stop_str_in_output",
    )
    out = {k: body[k] for k in keys if body.get(k) is not None}
    out["max_new_tokens"] = call.max_tokens
    return out


def _generate_call(body: dict[str, Any], rid: str, model_name: str, stream: bool) -> OpenAICall:
    """vLLM's `/inference/v1/generate`: `token_ids` and `sampling_params` (vLLM's SamplingParams names)."""
    prompt = _ids(body.get("token_ids"))
    if prompt is None:
        raise bad_request(VLLM_GENERATE, "token_ids: Input should be a non-empty list of integers", "body.token_ids")
    params = body.get("sampling_params")
    if params is None:  # vLLM's GenerateRequest requires it (pydantic: 400)
        raise bad_request(VLLM_GENERATE, "sampling_params: Field required", "body.sampling_params")
    if not isinstance(params, dict):
        raise bad_request(VLLM_GENERATE, "sampling_params: Input should be a valid dictionary")
    params = params or {}
    logprobs = params.get("logprobs")
    call = OpenAICall(
        dialect=VLLM_GENERATE,
        endpoint="generate",
        body=body,
        prompt_ids=prompt,
        stream=stream,
        rid=str(body.get("request_id") or rid),
        model=str(body.get("model") or model_name),
        logprobs=logprobs is not None,
        top_logprobs=int(logprobs or 0),
        return_token_ids=_flag(body, "return_token_ids"),
        tokens_as_ids=True,
        max_tokens=_int(params, "max_tokens"),  # its entries' token: `token_id:N` (to 0.31)
        skip_special_tokens=params.get("skip_special_tokens", True) is not False,
    )
    call.sampling = {
        **{k: v for k, v in params.items() if k not in ("max_tokens", "logprobs", PROMPT_START)},
        "max_new_tokens": call.max_tokens,
    }
    return call
