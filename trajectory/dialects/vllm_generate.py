"""vLLM's token-in, token-out `POST /inference/v1/generate` (0.11.1+; streamed 0.20+): `token_ids` and
`sampling_params` in, `choices[0].token_ids` and per-token logprobs out. Logprob entries read
`{"token": "token_id:N", "logprob"}` up to 0.31 and `{"token_id": N, "logprob", "rank"}` from 0.32 (`output_mode`
"tokens", the default); the root `prompt_token_ids` comes back with `return_token_ids` (0.30+). prime-rl's earlier
`/v1/chat/completions/tokens` is a vLLM chat body and is read by `openai_compat` (`registry.view_of`)."""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.dialects.channel_reads import read_openai
from tito_rl.trajectory.dialects.openai_compat import _logprobs
from tito_rl.trajectory.dialects.sglang import _ids
from tito_rl.trajectory.dialects.streams import merged_chunks
from tito_rl.trajectory.dialects.view import VLLM_GENERATE, EngineView, sampling_view


def tokens_view(request: dict[str, Any], response: Any) -> EngineView:
    params = request.get("sampling_params")
    view = EngineView(
        VLLM_GENERATE,
        "generate",
        _ids(request.get("token_ids")),
        stream=bool(request.get("stream")),
        sampling=sampling_view(params if isinstance(params, dict) else None),
        prompt_ids_asked=True,
    )
    body = merged_chunks(response) if isinstance(response, list) else response
    if not isinstance(body, dict):
        return view
    if view.prompt_ids is None:
        view.prompt_ids = _ids(body.get("prompt_token_ids"))
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    view.output_ids = _ids(choice.get("token_ids"))
    view.logprobs = _logprobs(choice)
    view.finish_reason = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    view.text = choice["text"] if isinstance(choice.get("text"), str) else None  # output_mode "text" (0.32+)
    read_openai(view, request, body, choice)
    return view
