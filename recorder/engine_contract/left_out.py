"""Differences from the real engine the fake engine keeps on purpose, each with its reason.

docs/engine-dialects.md ("The contract", "Left out") names each by its key; a test holds the page to this list.
A difference is left out only where its predicate says so for that request, so the same kind of difference
anywhere else still fails the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tito_rl.recorder.engine_contract.answers import Exchange
from tito_rl.recorder.engine_contract.exchange import DONE
from tito_rl.recorder.engine_contract.requests import FULL, ROUTES, SGLANG

THINK_END_ID = 151668  # </think> in the Qwen3 tokenizer


@dataclass(frozen=True)
class LeftOut:
    key: str
    reason: str
    applies: Callable[[Exchange, str], bool]


def _output_ids(exchange: Exchange) -> list[int]:
    answer = exchange.answer
    bodies = [c for c in answer.chunks if c != DONE] if answer.streamed else [answer.body]
    ids: list[int] = []
    for body in bodies:
        for choice in (body or {}).get("choices") or [] if isinstance(body, dict) else []:
            if isinstance(choice, dict) and isinstance(choice.get("token_ids"), list):
                ids += choice["token_ids"]
    return ids


def _real_content(exchange: Exchange) -> str:
    """All the content text of the real answer (its message, or its stream's deltas)."""
    answer = exchange.answer
    bodies = [c for c in answer.chunks if c != DONE] if answer.streamed else [answer.body]
    text = ""
    for body in bodies:
        for choice in (body or {}).get("choices") or [] if isinstance(body, dict) else []:
            message = (choice.get("message") or choice.get("delta") or {}) if isinstance(choice, dict) else {}
            text += str(message.get("content") or "")
    return text


def _unclosed_thinking(exchange: Exchange, line: str) -> bool:
    body = exchange.request.body or {}
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)
    if not (exchange.request.path == "/v1/chat/completions" and thinking):
        return False
    if exchange.request.mode == FULL:
        unclosed = THINK_END_ID not in _output_ids(exchange)
        parts: tuple[str, ...] = (".reasoning:", ".content:", "reasoning_tokens")
    elif exchange.request.mode == SGLANG:  # SGLang's qwen3 parser alike: no content at all, all reasoning_content
        unclosed = not _real_content(exchange)
        parts = (".reasoning_content:", ".content:", "reasoning_tokens", "completion_tokens_details")
    else:
        return False
    return unclosed and any(part in line for part in parts)


INFO_PATHS = ("/get_server_info", "/server_info", "/get_model_info", "/model_info")


def _server_args(exchange: Exchange, line: str) -> bool:
    return (
        exchange.request.mode == SGLANG
        and exchange.request.path in INFO_PATHS
        and "the real engine sends it" in line
        and "the fake one does not" in line
    )


def _one_choice(exchange: Exchange, line: str) -> bool:
    body = exchange.request.body or {}
    params = body.get("sampling_params")
    n = params.get("n") if isinstance(params, dict) else body.get("n")
    return (
        exchange.request.path in ("/v1/chat/completions", "/v1/completions", "/inference/v1/generate")
        and isinstance(n, int)
        and n > 1
        and any(part in line for part in ("choices[]", "token chunks", "finish chunk", "stream length"))
    )


def _empty_tools(exchange: Exchange, line: str) -> bool:
    body = exchange.request.body or {}
    return (
        exchange.request.mode != SGLANG
        and exchange.request.path == "/v1/chat/completions"
        and body.get("tools") == []
        and "status: real 400, fake 200" in line
    )


KEPT_SET_FIELDS = ("meta_info.top_p_token_ids:", "meta_info.top_p_token_offsets:")


def _kept_set_patch(exchange: Exchange, line: str) -> bool:
    body = exchange.request.body or {}
    params = body.get("sampling_params")
    custom = params.get("custom_params") if isinstance(params, dict) else None
    asked = isinstance(custom, dict) and custom.get("return_top_p_token_ids") is True
    return (
        exchange.request.mode in (SGLANG, ROUTES)
        and exchange.request.path == "/generate"
        and asked
        and any(field in line for field in KEPT_SET_FIELDS)
        and "the fake engine sends it" in line
    )


LEFT_OUT = (
    LeftOut(
        "unclosed-thinking",
        "vLLM 0.32's qwen3 reasoning parser reads a thinking-mode answer with no `</think>` as all reasoning "
        "(content null). The fake engine reads it as content: a scripted turn without reasoning has no think "
        "block at all, where a real Qwen3 always opens one; emulating it would turn every such scripted reply "
        "into reasoning. With `</think>` in the answer, both split it alike. SGLang 0.5.23's qwen3 parser does "
        "the same (all `reasoning_content`, content empty), for the same reason.",
        _unclosed_thinking,
    ),
    LeftOut(
        "one-port-every-dialect",
        "SGLang's `/generate` answers on the fake engine however it is started (vLLM answers 404): one fake "
        "engine serves the targets of every dialect, and `tito check-engine` reports each dialect it finds.",
        lambda exchange, line: exchange.request.path == "/generate" and exchange.request.mode not in (SGLANG, ROUTES),
    ),
    LeftOut(
        "server-args",
        "SGLang's `/get_server_info` dumps every start argument (556 keys in 0.5.23, a different set each release: "
        "speculative decoding, LoRA, disaggregation, watermarks, ...) and `/get_model_info` its embedding "
        "capabilities. The fake engine answers the fields tito and the gateways read (model and tokenizer paths, "
        "served name, context length, parsers, `enable_return_routed_experts`, streaming mode, sizes, version, "
        "weight version, status, start-up times); a field it sends is held to the real one's type.",
        _server_args,
    ),
    LeftOut(
        "one-choice",
        "`n` > 1 on the OpenAI routes and `/inference/v1/generate`: the fake engine answers with one choice "
        "(its policy gives one output per request), where the engines answer n (a streamed answer interleaves "
        "their chunks, one role chunk and one finish chunk per choice). SGLang's `/generate` with `n` is "
        "answered as the batch it is.",
        _one_choice,
    ),
    LeftOut(
        "empty-tools",
        'vLLM 0.32 refuses a chat request with `tools: []` (400, "`tools` must not be an empty array", param '
        "`tools`: `check_tool_usage` in its chat protocol); the fake engine serves it as a request without tools. "
        "NeMo Gym's chat call in the committed cassette `cassettes/targets/nemogym_mixed.tito` (its toolless "
        "session ng-hello) carries `tools: []` and was recorded through the fake engine with an answer: refusing "
        "it would change that session's engine answer until it is re-recorded with NeMo Gym. Against the real "
        "vLLM 0.32 that call gets the 400.",
        _empty_tools,
    ),
    LeftOut(
        "kept-set-patch",
        "The top-p kept set (`meta_info.top_p_token_ids` / `top_p_token_offsets`, asked with "
        "`sampling_params.custom_params.return_top_p_token_ids`) comes from slime's patch to SGLang "
        "(`docker/patch/latest/sglang-top_p.patch`), which slime's rollouts run on; stock SGLang 0.5.23 takes "
        "`custom_params` and ignores the key (200, no kept set: the routes recording's `generate routes kept set`). "
        "The fake engine answers as the patched SGLang slime trains with.",
        _kept_set_patch,
    ),
)


def left_out_for(exchange: Exchange, line: str) -> LeftOut | None:
    return next((rule for rule in LEFT_OUT if rule.applies(exchange, line)), None)
