"""Which dialect an engine call speaks, and its view: the one entry point the rest of tito reads calls through.

A call's dialect is recorded with it. Where the recorder was not told (`--engine-dialect`), it is read from the
call (`docs/engine-dialects.md`, "How tito reads each"): the path first (`/inference/v1/generate`,
`/v1/chat/completions/tokens` and `/abort_requests` are vLLM's token paths; `/generate` and `/abort_request` are
SGLang's), then, for the OpenAI paths both engines serve, SGLang's own request fields (`input_ids`,
`return_meta_info`, `return_prompt_token_ids`, `no_stop_trim`, `return_*_in_sglext`) or SGLang's own answer fields
(`matched_stop`, `meta_info` or `response_token_ids` on a choice, `sglext` at the root); otherwise vLLM's. A cassette
from before dialects has none recorded: its calls are `/generate` and read as `sglang`.
"""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.dialects.openai_compat import openai_view
from tito_rl.trajectory.dialects.sglang import generate_view
from tito_rl.trajectory.dialects.view import (
    DIALECTS,
    SGLANG,
    SGLANG_OPENAI,
    VLLM_GENERATE,
    VLLM_OPENAI,
    EngineView,
)
from tito_rl.trajectory.dialects.vllm_generate import tokens_view

SGLANG_OPENAI_FIELDS = (
    "input_ids",
    "return_meta_info",
    "return_prompt_token_ids",
    "no_stop_trim",
    "return_input_ids_in_sglext",
    "return_output_ids_in_sglext",
)
SGLANG_CHOICE_FIELDS = ("matched_stop", "meta_info", "response_token_ids")  # vLLM's choices have none of them
CHAT_TOKENS_PATH = "/v1/chat/completions/tokens"  # prime-rl's vLLM extension: a chat request plus `tokens`
TOKENS_PATHS = ("/inference/v1/generate", CHAT_TOKENS_PATH)
VLLM_ABORT_PATH = "/abort_requests"  # vLLM's (also under /inference/v1); SGLang's is /abort_request


def endpoint_of(path: str) -> str:
    path = path.split("?", 1)[0].rstrip("/")
    if path.endswith(TOKENS_PATHS) or path.endswith("/generate"):
        return "generate"
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completions"
    if path.endswith(("/abort_request", VLLM_ABORT_PATH)):
        return "abort"
    return "other"


GENERATIONS = ("generate", "chat", "completions")


def is_generation(path: str) -> bool:
    """A call the engine generates for, in any dialect (not an abort, health check or model info)."""
    return endpoint_of(path) in GENERATIONS


def detect_dialect(path: str, request: Any, response: Any = None, hint: str | None = None) -> str:
    """The dialect of one call: `hint` (the recording's `--engine-dialect`) where it fits the path, else read
    from the path and the request (module docstring)."""
    path = path.split("?", 1)[0].rstrip("/")
    endpoint = endpoint_of(path)
    if path.endswith(TOKENS_PATHS) or path.endswith(VLLM_ABORT_PATH):
        return VLLM_GENERATE
    if endpoint in ("generate", "abort"):
        return SGLANG
    if endpoint in ("chat", "completions"):
        if hint in (SGLANG_OPENAI, VLLM_OPENAI):
            return hint
        if isinstance(request, dict) and any(request.get(k) is not None for k in SGLANG_OPENAI_FIELDS):
            return SGLANG_OPENAI
        return SGLANG_OPENAI if _sglang_answer(response) else VLLM_OPENAI
    return hint if hint in DIALECTS else SGLANG


def _sglang_answer(response: Any) -> bool:
    """An answer (a body or its stream chunks) only SGLang's OpenAI server writes: `matched_stop` (on every chat
    and completion choice, streamed or not), `meta_info` or `response_token_ids` on a choice, `sglext` at the root."""
    for body in response if isinstance(response, list) else [response]:
        if not isinstance(body, dict):
            continue
        if "sglext" in body:
            return True
        choices = body.get("choices")
        if isinstance(choices, list) and any(
            isinstance(c, dict) and any(k in c for k in SGLANG_CHOICE_FIELDS) for c in choices
        ):
            return True
    return False


def view_of(dialect: str | None, path: str, request: Any, response: Any) -> EngineView:
    """The normalized view of one engine call (`view.EngineView`); `dialect=None` detects it."""
    dialect = dialect or detect_dialect(path, request, response)
    endpoint = endpoint_of(path)
    data = request if isinstance(request, dict) else {}
    if dialect == VLLM_GENERATE and path.split("?", 1)[0].rstrip("/").endswith(CHAT_TOKENS_PATH):
        view = openai_view(VLLM_GENERATE, "chat", data, response)  # a vLLM chat body, prompt ids in `tokens`
        view.endpoint = "generate"
        return view
    if dialect == VLLM_GENERATE and endpoint == "generate":
        return tokens_view(data, response)
    if endpoint == "generate":
        return generate_view(data, response)
    if endpoint in ("chat", "completions"):
        return openai_view(dialect, endpoint, data, response)
    return EngineView(dialect, endpoint)


def record_view(record: Any) -> EngineView:
    """The view of a cassette's `EngineRecord` (its recorded dialect, or the one its call shows)."""
    return view_of(getattr(record, "dialect", None), record.path, record.request, record.response)
