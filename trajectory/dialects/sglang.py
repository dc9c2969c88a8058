"""SGLang's native `POST /generate` (`sglang-http.md`): ids in, ids and `meta_info` out."""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.dialects.channel_reads import read_sglang
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
    if isinstance(triples, list):
        view.logprobs = _first_numbers(triples)
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        view.finish_reason = finish.get("type") if isinstance(finish.get("type"), str) else None
    elif isinstance(finish, str):
        view.finish_reason = finish
    read_sglang(view, request, meta)
    return view


_SEQUENCES, _NUMBERS, _INTS = frozenset({list, tuple}), frozenset({int, float}), frozenset({int})


def _first_numbers(triples: list[Any]) -> list[float | None] | None:
    """Each `[logprob, id, text]` entry's logprob (None where it is not a number); None unless every entry is a
    non-empty list. Item types are gathered at C speed first: a reply holds thousands of entries."""
    if set(map(type, triples)) <= _SEQUENCES and all(triples):
        firsts = [t[0] for t in triples]
        if set(map(type, firsts)) <= _NUMBERS:
            return firsts
        return [v if isinstance(v, int | float) else None for v in firsts]
    if all(isinstance(t, list | tuple) and t for t in triples):  # subclasses of list or tuple
        return [t[0] if isinstance(t[0], int | float) else None for t in triples]
    return None


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list | tuple) and set(map(type, value)) <= _INTS:
        return list(value)
    if hasattr(value, "tolist") and hasattr(value, "packed"):  # the reader's PackedIds
        ids: list[int] = value.tolist()
        return ids
    return None
