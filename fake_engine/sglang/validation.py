"""Request checks for /generate, in the real server's order, with its statuses and error envelopes.

SGLang 0.5.23 answers a bad /generate in three ways (see ../shared/notes/sglang-http.md):
1. the body does not parse into GenerateReqInput (pydantic): 400 `{"object":"error","message",...}`;
2. the body breaks the JSON contract (unknown sampling key, wrong JSON type): 400 `{"error": "<text>"}`;
3. a ValueError while tokenizing/admitting (empty input, context overflow, bad sampling value):
   400 `{"error": {"message": "<text>"}}`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tito_rl.fake_engine.sglang.contract import SAMPLING_FIELDS, ContractError, check_generate_body
from tito_rl.fake_engine.sglang.responses import VersionProfile

SAMPLING_EPS = 1e-6
TOP_K_ALL = 1 << 30


class EngineHTTPError(Exception):
    """An HTTP answer other than 200: status plus the exact JSON (or text) body."""

    def __init__(self, status: int, body: Any, content_type: str = "application/json") -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body
        self.content_type = content_type


def value_error(message: str, status: int = 400) -> EngineHTTPError:
    return EngineHTTPError(status, {"error": {"message": message}})


def parse_failure(message: str) -> EngineHTTPError:
    # FastAPI RequestValidationError -> sglang's ErrorResponse (message text approximates pydantic's).
    return EngineHTTPError(
        400, {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    )


@dataclass(frozen=True)
class ParsedGenerate:
    input_ids: list[int] | None
    text: str | None
    sampling_params: dict[str, Any]
    rid: str | None
    stream: bool
    return_logprob: bool
    routing_key: str | None
    return_routed_experts: bool = False
    routed_experts_start_len: int = 0
    return_top_p: bool = False  # slime's `sampling_params.custom_params.return_top_p_token_ids`


def _pydantic_int(v: Any) -> bool:
    """What pydantic's lax int accepts (the contract check then refuses the non-ints)."""
    if isinstance(v, bool):
        return True
    if isinstance(v, int):
        return True
    if isinstance(v, float):
        return math.isfinite(v) and v == int(v)
    if isinstance(v, str):
        try:
            int(v.strip())
            return True
        except ValueError:
            return False
    return False


def _check_parse(body: Any) -> None:
    if not isinstance(body, dict):
        raise parse_failure("Input should be a valid dictionary or instance of GenerateReqInput")
    ids = body.get("input_ids")
    if ids is not None:
        rows = ids if ids and isinstance(ids[0], list) else [ids] if isinstance(ids, list) else None
        if rows is None:
            raise parse_failure(f"body.input_ids: Input should be a valid list (input: {ids!r})")
        for row in rows:
            if set(map(type, row)) <= {int}:
                continue
            for i, v in enumerate(row):
                if not _pydantic_int(v):
                    raise parse_failure(
                        f"body.input_ids.{i}: Input should be a valid integer, "
                        f"got a number with a fractional part (input: {v!r})"
                    )
    sp = body.get("sampling_params")
    if sp is not None and (
        not isinstance(sp, (dict, list)) or isinstance(sp, list) and not all(isinstance(item, dict) for item in sp)
    ):
        raise parse_failure(f"body.sampling_params: Input should be a valid dictionary (input: {sp!r})")
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, (str, list)):
        raise parse_failure(f"body.rid: Input should be a valid string (input: {rid!r})")


def verify_sampling(sp: dict[str, Any], vocab_size: int) -> None:
    """SamplingParams.__post_init__ + verify() of 0.5.23: same order, same texts."""

    def get(key: str, default: Any) -> Any:
        v = sp.get(key)
        return default if v is None else v

    temperature, top_p = float(get("temperature", 1.0)), float(get("top_p", 1.0))
    top_k, min_p = int(get("top_k", TOP_K_ALL)), float(get("min_p", 0.0))
    if 0 <= temperature < SAMPLING_EPS:
        temperature, top_k = 1.0, 1
    if top_k == -1:
        top_k = TOP_K_ALL
    beam_width = sp.get("beam_width")
    if beam_width is not None and beam_width < 1:
        raise value_error(f"beam_width must be at least 1, got {beam_width}.")
    if not math.isfinite(temperature) or temperature < 0.0:
        raise value_error(f"temperature must be a non-negative finite number, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise value_error(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise value_error(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1 or top_k == -1:
        raise value_error(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    for name in ("frequency_penalty", "presence_penalty"):
        value = float(get(name, 0.0))
        if not -2.0 <= value <= 2.0:
            raise value_error(f"{name} must be in [-2, 2], got {value}.")
    rep = float(get("repetition_penalty", 1.0))
    if not 0.0 < rep <= 2.0:
        raise value_error(f"repetition_penalty must be in (0, 2] (1.0 = no penalty), got {rep}.")
    min_new = int(get("min_new_tokens", 0))
    if not min_new >= 0:
        raise value_error(f"min_new_tokens must be in [0, max_new_tokens], got {min_new}.")
    max_new = sp.get("max_new_tokens", 128)
    if max_new is not None:
        if max_new < 0:
            raise value_error(f"max_new_tokens must be at least 0, got {max_new}.")
        if not min_new <= max_new:
            raise value_error(f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.")
    for token_id in sp.get("logit_bias") or {}:
        if not 0 <= int(token_id) < vocab_size:
            raise value_error(f"logit_bias must has keys in [0, {vocab_size - 1}], got {token_id}.")
    grammars = [sp.get(k) or None for k in ("json_schema", "regex", "ebnf", "structural_tag")]
    if sum(g is not None for g in grammars) > 1:
        raise value_error("Only one of json_schema, regex, ebnf, or structural_tag can be set.")


def check_routes_start(start: int, n_input: int) -> None:
    """SGLang 0.5.23's scheduler: a start outside `[0, len(input_ids)]` aborts the request with status 400."""
    if start < 0:
        raise value_error(
            f"recv_req.routed_experts_start_len={start} is lower than 0. "
            "Please use a non-negative routed_experts_start_len."
        )
    if start > n_input:
        raise value_error(
            f"recv_req.routed_experts_start_len={start} is higher than the number of input tokens "
            f"len(req.origin_input_ids)={n_input}. Please use a smaller routed_experts_start_len."
        )


def check_context(n_input: int, max_new_tokens: int | None, context_length: int) -> None:
    if n_input >= context_length:
        raise value_error(
            f"The input ({n_input} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    if max_new_tokens is not None and max_new_tokens + n_input > context_length:
        total = max_new_tokens + n_input
        raise value_error(
            f"Requested token count exceeds the model's maximum context length of {context_length} tokens. "
            f"You requested a total of {total} tokens: {n_input} tokens from the input messages and "
            f"{max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input "
            f"messages or the completion to fit within the limit."
        )


def parse_generate(body: Any, profile: VersionProfile, header_routing_key: str | None) -> ParsedGenerate:
    """Stages 1 and 2 plus the request-shape ValueErrors; context and sampling values come later."""
    _check_parse(body)
    if profile.contract_check:
        try:
            check_generate_body(body)
        except ContractError as e:
            raise EngineHTTPError(400, {"error": str(e)}) from None
    else:
        unknown = sorted(set(body.get("sampling_params") or {}) - set(SAMPLING_FIELDS))
        if isinstance(body.get("sampling_params"), dict) and unknown:
            # Before the contract gate (0.5.2): SamplingParams(**kwargs) raised TypeError, unhandled.
            raise EngineHTTPError(500, "Internal Server Error", content_type="text/plain")
    ids, text = body.get("input_ids"), body.get("text")
    if ids is None and text is None:
        raise value_error("Either text, input_ids or input_embeds should be provided.")
    batch = (
        (isinstance(ids, list) and ids and isinstance(ids[0], list))
        or isinstance(text, list)
        or isinstance(body.get("sampling_params"), list)
    )
    if batch:
        raise value_error("batch /generate requests are not supported by the tito fake engine")
    if ids is not None and len(ids) == 0:
        raise value_error("input_ids cannot be empty.")
    rid = body.get("rid")
    custom = (body.get("sampling_params") or {}).get("custom_params")
    return ParsedGenerate(
        input_ids=ids if ids is not None else None,
        text=text,
        sampling_params=dict(body.get("sampling_params") or {}),
        rid=rid,
        stream=bool(body.get("stream") or False),
        return_logprob=bool(body.get("return_logprob") or False),
        routing_key=header_routing_key or body.get("routing_key"),
        return_routed_experts=bool(body.get("return_routed_experts") or False),
        routed_experts_start_len=int(body.get("routed_experts_start_len") or 0),
        return_top_p=isinstance(custom, dict) and bool(custom.get("return_top_p_token_ids")),
    )
