"""vLLM's `/tokenize` and `/detokenize`, as 0.32 answers them (NeMo Gym's fallback reads the prompt's ids there).

`/tokenize` takes a `prompt` (text; `add_special_tokens` default true, a no-op for Qwen's tokenizer) or chat
`messages` (rendered as `/v1/chat/completions` renders them) and answers `{count, max_model_len, tokens,
token_strs}` (`token_strs` with `return_token_strs`); `/detokenize` takes `tokens` and answers `{prompt}`. A body
with neither is a 400 in vLLM's envelope.

SGLang 0.5.23's `/v1/tokenize` (`{tokens, count, max_model_len}`) and `/v1/detokenize` (`{text}`) take the same
bodies (seen live).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tito_rl.fake_engine.openai.calls import vllm_error
from tito_rl.fake_engine.openai.render import render_chat
from tito_rl.fake_engine.serving import json_response
from tito_rl.fake_engine.sglang.validation import EngineHTTPError


class TokenizeRoutes:
    """The two routes over the engine's tokenizer and context length."""

    def __init__(self, tokenizer: Any, context_length: int) -> None:
        self.tokenizer = tokenizer
        self.context_length = context_length

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise EngineHTTPError(400, vllm_error(400, f"JSON decode error: {e}")) from None
        if not isinstance(body, dict):
            raise EngineHTTPError(400, vllm_error(400, "Input should be a valid dictionary"))
        return body

    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            if isinstance(body.get("messages"), list):
                ids = render_chat(self.tokenizer, body, lambda m: vllm_error(400, m))
            elif isinstance(body.get("prompt"), str):
                ids = list(self.tokenizer.encode(body["prompt"], add_special_tokens=False))
            else:
                raise EngineHTTPError(400, vllm_error(400, "prompt or messages: Field required"))
        except EngineHTTPError as e:
            return json_response(e.body, e.status)
        strs = [self.tokenizer.convert_ids_to_tokens(i) for i in ids] if body.get("return_token_strs") else None
        return json_response(
            {"count": len(ids), "max_model_len": self.context_length, "tokens": ids, "token_strs": strs}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._body(request)
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
                raise EngineHTTPError(400, vllm_error(400, "tokens: Input should be a valid list of integers"))
        except EngineHTTPError as e:
            return json_response(e.body, e.status)
        return json_response({"prompt": self.tokenizer.decode(tokens)})

    async def sglang_tokenize(self, request: web.Request) -> web.Response:
        answer = await self.tokenize(request)
        if answer.status != 200 or answer.body is None:
            return answer
        body = json.loads(bytes(answer.body))  # type: ignore[arg-type]
        return json_response({"tokens": body["tokens"], "count": body["count"], "max_model_len": body["max_model_len"]})

    async def sglang_detokenize(self, request: web.Request) -> web.Response:
        answer = await self.detokenize(request)
        if answer.status != 200 or answer.body is None:
            return answer
        return json_response({"text": json.loads(bytes(answer.body))["prompt"]})  # type: ignore[arg-type]
