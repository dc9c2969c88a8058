"""SGLang 0.5.23's JSON contract gate for /generate, re-implemented (the fake engine does not need sglang).

The real server checks each body against its generated schema and answers 400 `{"error": "<text>"}` with
serde's wording. This module reproduces that wording for the fields adapters send; tests compare it with
`sglang.api.v1.api_types.GenerateRequest.from_json_value` so any drift from the real schema fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SAMPLING_FIELDS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
)


class ContractError(ValueError):
    """A schema violation: the real server's 400 `{"error": str(e)}`."""


def _unexpected(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


def _invalid(v: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {_unexpected(v)}, expected {expected}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int(expected: str = "i64") -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not _is_int(v):
            raise _invalid(v, expected)

    return check


def _uint(expected: str) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not _is_int(v):
            raise _invalid(v, expected)
        if v < 0:
            raise ContractError(f"invalid value: integer `{v}`, expected {expected}")

    return check


def _float(v: Any) -> None:
    if not (isinstance(v, (int, float)) and not isinstance(v, bool)):
        raise _invalid(v, "f64")


def _bool(expected: str = "a boolean") -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if not isinstance(v, bool):
            raise _invalid(v, expected)

    return check


def _str(v: Any) -> None:
    if not isinstance(v, str):
        raise _invalid(v, "a string")


def _seq(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise _invalid(v, "a sequence")
    return v


def _or_list(scalar: Callable[[Any], None], alias: str, element: Callable[[Any], None]) -> Callable[[Any], None]:
    def check(v: Any) -> None:
        if isinstance(v, list):
            for e in v:
                element(e)
        else:
            try:
                scalar(v)
            except ContractError:
                raise _invalid(v, f"a value or an array of values for {alias}") from None

    return check


def _int_list(v: Any) -> None:
    if type(v) is list and set(map(type, v)) <= {int}:
        return  # fast path: long prompts are plain ints
    for e in _seq(v):
        _int()(e)


def _token_ids_or_list(v: Any) -> None:
    if not isinstance(v, list):
        raise _invalid(v, "a value or an array of values for TokenIdsOrList")
    if not v or (isinstance(v[0], (int, float)) and not isinstance(v[0], bool)):
        _int_list(v)
    else:
        for row in v:
            _int_list(row)


def _logit_bias(v: Any) -> None:
    if not isinstance(v, dict):
        raise _invalid(v, "a map")
    for e in v.values():
        _float(e)


def _choice(v: Any) -> None:
    for e in _seq(v):
        _str(e)


_SAMPLING_CHECKS: dict[str, Callable[[Any], None] | None] = {
    "max_new_tokens": _int(),
    "stop": _or_list(_str, "StringOrList", _str),
    "stop_token_ids": _int_list,
    "stop_regex": _or_list(_str, "StringOrList", _str),
    "temperature": _float,
    "top_p": _float,
    "top_k": _int(),
    "min_p": _float,
    "frequency_penalty": _float,
    "presence_penalty": _float,
    "repetition_penalty": _float,
    "min_new_tokens": _int(),
    "n": _int(),
    "json_schema": _str,
    "regex": _str,
    "ebnf": _str,
    "structural_tag": _str,
    "ignore_eos": _bool(),
    "skip_special_tokens": _bool(),
    "spaces_between_special_tokens": _bool(),
    "no_stop_trim": _bool(),
    "stream_interval": _int(),
    "logit_bias": _logit_bias,
    "sampling_seed": _int(),
    "custom_params": None,
    "beam_width": _int(),
    "watermark": None,
    "choice": _choice,
}


def _unknown_field(key: str) -> ContractError:
    listed = ", ".join(f"`{f}`" for f in SAMPLING_FIELDS)
    return ContractError(f"unknown field `{key}`, expected one of {listed}")


def check_sampling_params(value: Any) -> None:
    if not isinstance(value, dict):
        raise _invalid(value, "struct SamplingParams")
    for key, x in value.items():
        if key not in _SAMPLING_CHECKS:
            raise _unknown_field(key)
        check = _SAMPLING_CHECKS[key]
        if x is not None and check is not None:
            check(x)


def _sampling_or_list(v: Any) -> None:
    if isinstance(v, list):
        for e in v:
            check_sampling_params(e)
    else:
        check_sampling_params(v)


# Top-level fields adapters send; the schema ignores unknown top-level keys.
_TOP_CHECKS: dict[str, Callable[[Any], None]] = {
    "rid": _or_list(_str, "StringOrList", _str),
    "text": _or_list(_str, "StringOrList", _str),
    "input_ids": _token_ids_or_list,
    "stream": _bool(),
    "sampling_params": _sampling_or_list,
    "return_logprob": _or_list(_bool(), "BoolOrList", _bool()),
    "logprob_start_len": _or_list(_int(), "Int64OrList", _int()),
    "top_logprobs_num": _or_list(_int(), "Int64OrList", _int()),
    "return_text_in_logprobs": _bool(),
    "routing_key": _str,
    "session_id": _str,
    "priority": _int(),
    "max_thinking_tokens": _uint("u64"),
    "routed_experts_start_len": _int(),
}


def check_generate_body(body: Any) -> None:
    """Raise ContractError with the real server's text if `body` violates the /generate schema."""
    if not isinstance(body, dict):
        raise _invalid(body, "struct GenerateRequest")
    for key, x in body.items():
        check = _TOP_CHECKS.get(key)
        if check is not None and x is not None:
            check(x)
