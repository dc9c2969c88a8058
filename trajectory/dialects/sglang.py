"""SGLang's native `POST /generate` (`sglang-http.md`): ids in, ids and `meta_info` out."""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.dialects.view import SGLANG, EngineView, object_at, sampling_view


def generate_view(request: dict[str, Any], response: Any) -> EngineView:
    params = request.get("sampling_params")
    view = EngineView(
        SGLANG,
        "generate",
        _ids(request.get("input_ids")),
        stream=bool(request.get("stream")),
        sampling=sampling_view(params if isinstance(params, dict) else None),
        prompt_ids_asked=True,
    )
    if isinstance(response, list):  # a batch answer: the first item (tito's adapter never batches)
        response = response[0] if response else None
    if not isinstance(response, dict):
        return view
    view.output_ids = _ids(response.get("output_ids"))
    text = response.get("text")
    view.text = text if isinstance(text, str) else None
    meta = object_at(response, "meta_info")
    triples = meta.get("output_token_logprobs")
    if isinstance(triples, list) and all(isinstance(t, list | tuple) and t for t in triples):
        view.logprobs = [t[0] if isinstance(t[0], int | float) else None for t in triples]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        view.finish_reason = finish.get("type") if isinstance(finish.get("type"), str) else None
    elif isinstance(finish, str):
        view.finish_reason = finish
    return view


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list | tuple) and all(type(v) is int for v in value):
        return list(value)
    if hasattr(value, "tolist") and hasattr(value, "packed"):  # the reader's PackedIds
        ids: list[int] = value.tolist()
        return ids
    return None
