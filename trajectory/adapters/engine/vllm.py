"""tito's adapter calling vLLM: the request bodies of its two token-in, token-out routes, and their answers read
into a `Generation`.

- `vllm-generate`: `POST /inference/v1/generate` (`token_ids`, `sampling_params` with vLLM's names), answered with
  `choices[0].token_ids` and per-token logprobs; served by engines started with `--enable-scale-out` (403 without).
- `vllm-openai`: `POST /v1/completions` with the prompt as ids and `return_token_ids` (vLLM >= 0.10.2), answered with
  the output ids on the choice and logprobs in the legacy layout; served by every vLLM OpenAI server.

Both carry the served model's name (learned from `GET /v1/models`, `served_model`), the adapter's rid as vLLM's
`request_id` (so an abort can name it), and `logprobs: 0` (the sampled token's logprob only). The answers are read
through the same dialect views as every recorded call (`trajectory/dialects`), then checked for what training
needs: an output id list, one logprob per id, the ids the logprobs name where they name any, and the prompt ids
the engine says it used where it says so. Expert routes (`.npy`, sent unasked by an engine started with
`--enable-return-routed-experts`) and weight versions are read from the choice (`dialects.channel_reads`).
"""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.adapters.engine.generation import EngineError, Generation
from tito_rl.trajectory.dialects.openai_compat import logprob_token_ids
from tito_rl.trajectory.dialects.registry import view_of
from tito_rl.trajectory.dialects.view import VLLM_GENERATE, VLLM_OPENAI
from tito_rl.trajectory.runtime.untracked import untrack

GENERATE_PATH = "/inference/v1/generate"
COMPLETIONS_PATH = "/v1/completions"
# vLLM's abort route under `/inference` (0.30+, with `--enable-scale-out`); it takes the engine's request ids.
ABORT_PATH = "/inference/v1/abort_requests"
# `/inference/v1/generate` runs a request as `generate-tokens-<request_id>` (vLLM 0.32
# `scale_out/token_in_token_out/serving.py`): the abort names that id, and the bare one for servers that use it as is.
GENERATE_ID_PREFIX = "generate-tokens-"
PATHS = {VLLM_GENERATE: GENERATE_PATH, VLLM_OPENAI: COMPLETIONS_PATH}
# SGLang's sampling names (what `generate.sampling_params` builds) -> vLLM's; None: not sent (vLLM has no such
# parameter: `no_stop_trim` keeps SGLang's text whole, and vLLM's output ids keep a matched stop anyway).
VLLM_NAMES: dict[str, str | None] = {"max_new_tokens": "max_tokens", "sampling_seed": "seed", "no_stop_trim": None}
FINISHES = ("stop", "length", "abort")


def vllm_sampling(params: dict[str, Any]) -> dict[str, Any]:
    """`generate.sampling_params`' SGLang names as vLLM's `SamplingParams` names them."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = VLLM_NAMES.get(key, key)
        if name is not None:
            out[name] = value
    return out


def request(
    dialect: str, rid: str, input_ids: list[int], params: dict[str, Any], model: str
) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of one generation in `dialect`."""
    sampling = vllm_sampling(params)
    if dialect == VLLM_GENERATE:
        return GENERATE_PATH, {
            "request_id": rid,
            "model": model,
            "token_ids": input_ids,
            "sampling_params": {**sampling, "logprobs": 0},
        }
    return COMPLETIONS_PATH, {
        "request_id": rid,
        "model": model,
        "prompt": input_ids,
        **sampling,
        "logprobs": 0,
        "return_token_ids": True,
    }


def route_hint(path: str, status: int) -> str:
    """What to do about a generate route the engine refuses (vLLM: 403 unless started with `--enable-scale-out`;
    404 before 0.11.1), appended to the error the agent gets."""
    if path != GENERATE_PATH or status not in (403, 404):
        return ""
    return (
        " (vLLM serves /inference/v1/generate when started with --enable-scale-out; without it, call it with "
        "--engine-dialect vllm-openai)"
    )


def abort_body(rid: str) -> dict[str, Any]:
    return {"request_ids": [GENERATE_ID_PREFIX + rid, rid]}


def parse_answer(dialect: str, path: str, rid: str, body: dict[str, Any], data: Any) -> Generation:
    """A 200 answer as the turn's generation; `EngineError` (502) for one that cannot train."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EngineError(502, f"engine {path} returned a malformed body: {str(data)[:200]!r}")
    choice = choices[0]
    view = view_of(dialect, path, body, data)
    if view.output_ids is None:
        hint = " (return_token_ids needs vLLM >= 0.10.2)" if dialect == VLLM_OPENAI else ""
        raise EngineError(502, f"engine {path} returned no output token ids{hint}")
    ids = view.output_ids
    logprobs = view.logprobs
    if logprobs is None or len(logprobs) != len(ids) or any(lp is None for lp in logprobs):
        raise EngineError(
            502,
            f"engine {path} returned {'no' if logprobs is None else len(logprobs)} logprobs for "
            f"{len(ids)} output ids (was logprobs honoured?)",
        )
    named = logprob_token_ids(choice)
    if named is not None and named != ids:
        raise EngineError(502, f"engine {path} token_ids disagree with the ids its logprobs name")
    echoed = choice.get("prompt_token_ids", data.get("prompt_token_ids"))
    sent = body.get("token_ids") if dialect == VLLM_GENERATE else body.get("prompt")
    if isinstance(echoed, list) and echoed != sent:
        raise EngineError(
            502,
            f"engine {path} generated from other prompt ids than it was sent ({len(echoed)} "
            f"returned, {len(sent or ())} sent): the turn would not train on what it saw",
        )
    if view.channel_error:
        raise EngineError(502, f"engine {path} returned a malformed channel: {view.channel_error}")
    finish = view.finish_reason if view.finish_reason in FINISHES else "stop"
    usage = data["usage"] if isinstance(data.get("usage"), dict) else {}
    details = usage["prompt_tokens_details"] if isinstance(usage.get("prompt_tokens_details"), dict) else {}
    try:  # a malformed body (or a hostile cassette's, in a replay) is the engine's error, not the adapter's
        prompt_tokens = int(usage.get("prompt_tokens") or len(sent or ()))
        cached_tokens = int(details.get("cached_tokens") or 0)
    except (TypeError, ValueError) as exc:
        raise EngineError(502, f"engine {path} returned malformed token counts: {exc}") from exc
    generation = Generation(
        rid,
        untrack(list(ids)),
        untrack([float(lp) for lp in logprobs if lp is not None]),
        finish,
        prompt_tokens,
        cached_tokens,
        data,
    )
    # Routes come unasked from an engine started with them (`null` when aborted before any forward pass).
    generation.routes, generation.weight_versions = view.routes, view.weight_versions
    return generation
