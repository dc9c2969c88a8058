"""vLLM 0.32's `POST /v1/chat/completions/render` (a scale-out route): the chat request rendered, not run.

It answers the `/inference/v1/generate` request the chat request becomes (seen live from the real vLLM): the
prompt's `token_ids` as the chat template renders them, vLLM's full `sampling_params`, the model, whether the
reasoning already ended in the prompt (thinking off), the chat template's arguments, and the generate request's other
fields. Without `--enable-scale-out` it is the 403 every scale-out route answers.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from tito_rl.fake_engine.openai.calls import vllm_error
from tito_rl.fake_engine.openai.render import render_chat
from tito_rl.fake_engine.serving import json_response
from tito_rl.fake_engine.sglang.validation import EngineHTTPError

RENDER_PATH = "/v1/chat/completions/render"
THINK_END_ID = 151668  # </think>: a prompt that holds it has ended its reasoning


def sampling_params(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's SamplingParams as the render route writes them, from the chat request's own values."""

    def number(key: str, default: float) -> float:
        value = body.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    stop = body.get("stop")
    return {
        "presence_penalty": number("presence_penalty", 0.0),
        "frequency_penalty": number("frequency_penalty", 0.0),
        "repetition_penalty": number("repetition_penalty", 1.0),
        "temperature": number("temperature", 1.0),
        "top_p": number("top_p", 1.0),
        "min_p": number("min_p", 0.0),
        "seed": body.get("seed"),
        "stop": [stop] if isinstance(stop, str) else list(stop or []),
        "stop_token_ids": list(body.get("stop_token_ids") or []),
        "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
        "logprobs": (int(body.get("top_logprobs") or 0) if body.get("logprobs") else None),
        "skip_special_tokens": body.get("skip_special_tokens", True) is not False,
        "output_kind": 2,
        "skip_clone": True,
        "bad_words": [],
        "skip_reading_prefix_cache": False,
    }


def render_answer(tokenizer: Any, body: dict[str, Any], model: str) -> dict[str, Any]:
    ids = render_chat(tokenizer, body, lambda message: vllm_error(400, message))
    given = body.get("chat_template_kwargs")
    kwargs: dict[str, Any] = given if isinstance(given, dict) else {}
    template = {"cohere_format": "cmd4", **kwargs, "add_generation_prompt": True, "continue_final_message": False}
    return {
        "request_id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
        "token_ids": ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling_params(body),
        "model": model,
        "reasoning_ended": THINK_END_ID in ids,
        "reasoning_parser_kwargs": {"chat_template_kwargs": template},
        "return_token_ids": None,
        "output_mode": "tokens",
        "stream": bool(body.get("stream")),
        "stream_options": body.get("stream_options"),
        "cache_salt": None,
        "priority": 0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }


class RenderRoute:
    def __init__(self, tokenizer: Any, model: str, scale_out: bool, refusal: str) -> None:
        self.tokenizer = tokenizer
        self.model = model
        self.scale_out = scale_out
        self.refusal = refusal

    async def render(self, request: web.Request) -> web.Response:
        if not self.scale_out:
            return json_response(vllm_error(403, self.refusal, "PermissionDeniedError"), 403)
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return json_response(vllm_error(400, f"JSON decode error: {e}"), 400)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return json_response(vllm_error(400, "messages: Field required"), 400)
        try:
            answer = render_answer(self.tokenizer, body, str(body.get("model") or self.model))
        except EngineHTTPError as e:
            return json_response(e.body, e.status)
        return json_response(answer)
