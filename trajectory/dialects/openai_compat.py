"""OpenAI-compatible engine endpoints that return token ids: vLLM's and SGLang's `/v1/chat/completions` and
`/v1/completions`, and prime-rl's `/v1/chat/completions/tokens` (`docs/engine-dialects.md` pins each field to the
engines' source; `fields.py` is the same table as data).

Where the ids live differs: vLLM puts a chat call's prompt ids at the root (`prompt_token_ids`) and a completion's
on the choice; SGLang puts both on the choice (`return_prompt_token_ids`), calls a chat answer's output ids
`response_token_ids` (0.5.18+; `token_ids` in 0.5.17 only) and can also return both under the root `sglext`
(0.5.20+), and its logprobs also sit in `choices[0].meta_info.output_token_logprobs`, as in `/generate`. A streamed
answer is read as its merged body (`streams.merged_chunks`).
"""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.dialects.channel_reads import read_openai
from tito_rl.trajectory.dialects.sglang import _ids
from tito_rl.trajectory.dialects.streams import merged_chunks
from tito_rl.trajectory.dialects.view import SGLANG_OPENAI, VLLM_GENERATE, EngineView, object_at, sampling_view

TOKEN_ID_PREFIX = "token_id:"  # vLLM's `return_tokens_as_token_ids`: each logprob entry's token reads token_id:N
# Request keys that are not sampling parameters (the rest of a chat or completion request's scalars are).
NOT_SAMPLING = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "tools",
        "tool_choice",
        "stream",
        "stream_options",
        "logprobs",
        "top_logprobs",
        "return_token_ids",
        "return_tokens_as_token_ids",
        "return_meta_info",
        "return_prompt_token_ids",
        "input_ids",
        "tokens",
        "echo",
        "user",
        "rid",
        "extra_body",
        "chat_template",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "parallel_tool_calls",
        "response_format",
        "separate_reasoning",
        "stream_reasoning",
        "include_reasoning",
        "reasoning_effort",
        "request_id",
        "priority",
        "metadata",
        "session_id",
        "lora_path",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
        "documents",
        "mm_processor_kwargs",
        "cache_salt",
        "kv_transfer_params",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "prompt_logprobs",
        "logprob_token_ids",
        "return_prompt_text",
        "return_weight_versions",
        "return_input_ids_in_sglext",
        "return_output_ids_in_sglext",
        "return_hidden_states",
        "return_routed_experts",
        "routed_experts_start_len",
    }
)
KEPT_FLAGS = frozenset({"skip_special_tokens", "include_stop_str_in_output", "no_stop_trim", "ignore_eos"})
# Request flags that make the engine return the prompt ids it used (vLLM, SGLang, SGLang's sglext).
PROMPT_ID_FLAGS = ("return_token_ids", "return_prompt_token_ids", "return_input_ids_in_sglext")


def openai_view(dialect: str, endpoint: str, request: dict[str, Any], response: Any) -> EngineView:
    chat = endpoint == "chat"
    stream = bool(request.get("stream"))
    sampling = {k: v for k, v in request.items() if k not in NOT_SAMPLING or k in KEPT_FLAGS}
    prompt = (
        request.get("input_ids")
        if dialect == SGLANG_OPENAI
        else request.get("tokens")
        if dialect == VLLM_GENERATE
        else None
    )
    if not chat and prompt is None:
        prompt = request.get("prompt")
    prompt_ids = _ids(prompt)
    extra = object_at(request, "extra_body")
    asked = (
        prompt_ids is not None
        or any(bool(request.get(k)) for k in PROMPT_ID_FLAGS)
        or bool(extra.get("return_token_ids"))
    )
    view = EngineView(
        dialect,
        endpoint,
        prompt_ids,
        sampling=sampling_view(sampling),
        messages_in=chat and prompt_ids is None,
        stream=stream,
        prompt_ids_asked=asked,
    )
    body = merged_chunks(response) if isinstance(response, list) else response
    if not isinstance(body, dict):
        return view
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    sglext = object_at(body, "sglext")
    if view.prompt_ids is None:
        view.prompt_ids = _known(
            _ids(body.get("prompt_token_ids")), _ids(choice.get("prompt_token_ids")), _ids(sglext.get("input_ids"))
        )
    view.output_ids = _known(
        _ids(choice.get("token_ids")), _ids(choice.get("response_token_ids")), _first(sglext), _meta_ids(choice)
    )
    view.finish_reason = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    view.logprobs = _logprobs(choice)
    if chat:
        message = object_at(choice, "message")
        content = message.get("content")
        view.text = content if isinstance(content, str) else None
        # vLLM <= 0.11.0 and SGLang: reasoning_content; vLLM 0.11.1-0.15.1 both (same value); 0.16+: reasoning.
        reasoning = next(
            (message[k] for k in ("reasoning", "reasoning_content") if isinstance(message.get(k), str)), None
        )
        view.reasoning = reasoning
        calls = message.get("tool_calls")
        view.tool_calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else None
    elif isinstance(choice.get("text"), str):
        view.text = choice["text"]
    read_openai(view, request, body, choice)
    return view


def _meta_ids(choice: dict[str, Any]) -> list[int] | None:
    """SGLang's `meta_info.output_token_logprobs` triples `[logprob, id, text]` name each output id: a gateway that
    asks for `return_meta_info` but not `return_token_ids` (miles' session server) still says what was emitted."""
    meta = choice.get("meta_info")
    triples = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    if not isinstance(triples, list) or not all(
        isinstance(t, list | tuple) and len(t) > 1 and type(t[1]) is int for t in triples
    ):
        return None
    return [t[1] for t in triples]


def _known(*candidates: list[int] | None) -> list[int] | None:
    """The first id list that is there (an empty one counts: an answer aborted before its first token)."""
    return next((ids for ids in candidates if ids is not None), None)


def _first(sglext: dict[str, Any]) -> list[int] | None:
    """SGLang's `sglext.output_ids`: one id list per choice."""
    outputs = sglext.get("output_ids")
    return _ids(outputs[0]) if isinstance(outputs, list) and outputs else None


def _logprobs(choice: dict[str, Any]) -> list[float | None] | None:
    meta = choice.get("meta_info")
    if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), list):
        return [
            t[0] if isinstance(t, list | tuple) and t and isinstance(t[0], int | float) else None
            for t in meta["output_token_logprobs"]
        ]
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):
        return [
            e.get("logprob") if isinstance(e, dict) and isinstance(e.get("logprob"), int | float) else None
            for e in logprobs["content"]
        ]
    if isinstance(logprobs.get("token_logprobs"), list):
        return [v if isinstance(v, int | float) else None for v in logprobs["token_logprobs"]]
    return None


def logprob_token_ids(choice: dict[str, Any]) -> list[int] | None:
    """The ids a choice's logprobs name: vLLM's `return_tokens_as_token_ids` writes "token_id:N" into each chat
    entry's `token` (or each completion `tokens` item); `/inference/v1/generate` (0.32+) gives `token_id` ints."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    entries = logprobs.get("content")
    if isinstance(entries, list):
        if all(isinstance(e, dict) and type(e.get("token_id")) is int for e in entries):
            return [e["token_id"] for e in entries]
        tokens = [e.get("token") if isinstance(e, dict) else None for e in entries]
    elif isinstance(logprobs.get("tokens"), list):
        tokens = logprobs["tokens"]
    else:
        return None
    ids = []
    for token in tokens:
        if not isinstance(token, str) or not token.startswith(TOKEN_ID_PREFIX):
            return None
        try:
            ids.append(int(token[len(TOKEN_ID_PREFIX) :]))
        except ValueError:
            return None
    return ids
