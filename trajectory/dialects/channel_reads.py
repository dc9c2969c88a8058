"""Where each dialect puts the per-token channels (`trajectory.channels`), read into an `EngineView`.

- `sglang` (`/generate`): `meta_info.routed_experts` (rows from the request's `routed_experts_start_len`, or the
  answer's where an engine echoes it), `meta_info.top_p_token_ids` / `top_p_token_offsets` (slime's patch also
  names them `top_p_kept_token_ids` / `_offsets`), `meta_info.weight_versions` spans, `meta_info.weight_version`.
- `sglang-openai`: the root `sglext.routed_experts` (0.5.23; streamed, in a chunk of its own after the finish,
  `choices: []`), else the choice's `meta_info` (`return_meta_info`) or `sgl_ext` (older readers), all from row 0;
  the root `metadata.weight_version(s)`.
- `vllm-generate`, `vllm-openai`: `choices[0].routed_experts` (`.npy`, sent unasked by an engine started with
  them; null when aborted before any forward pass), `choices[0].weight_versions`.

A malformed route or kept set leaves the view's without them and says why in `channel_error` (one line): the rest
of the call still reads, and tito's adapter turns the error into the engine's 502. Malformed version spans fall back
to the answer's final version.
"""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.channels import (
    ChannelError,
    VersionSpan,
    kept_sets,
    npy_routes,
    sglang_routes,
    version_spans,
)
from tito_rl.trajectory.dialects.view import EngineView, object_at

KEPT_IDS = ("top_p_token_ids", "top_p_kept_token_ids")
KEPT_OFFSETS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def _first_key(meta: dict[str, Any], keys: tuple[str, ...]) -> Any:
    return next((meta[k] for k in keys if meta.get(k) is not None), None)


def _rows(view: EngineView, start: int) -> int | None:
    if view.prompt_ids is None or view.output_ids is None:
        return None
    return max(len(view.prompt_ids) + len(view.output_ids) - 1 - start, 0)


def routes_start(request: dict[str, Any], meta: dict[str, Any]) -> int:
    """The first row an answer's routes hold: the request's `routed_experts_start_len` (0.5.23 does not echo it;
    slime reads `meta_info.routed_experts_start_len`, default 0)."""
    for value in (request.get("routed_experts_start_len"), meta.get("routed_experts_start_len")):
        if type(value) is int and value >= 0:
            return value
    return 0


def read_sglang(view: EngineView, request: dict[str, Any], meta: dict[str, Any]) -> None:
    """`/generate`'s channels from its `meta_info` (the view's ids already read)."""
    view.routes_asked = bool(request.get("return_routed_experts"))
    n_out = len(view.output_ids or ())
    try:
        value = meta.get("routed_experts")
        if value is not None:
            start = routes_start(request, meta)
            rows = _rows(view, start)
            if rows is None:
                raise ChannelError("routed_experts: the call's prompt or output ids are unknown")
            view.routes = sglang_routes(value, start, rows)
        ids, offsets = _first_key(meta, KEPT_IDS), _first_key(meta, KEPT_OFFSETS)
        if ids is not None or offsets is not None:
            if ids is None or offsets is None:
                raise ChannelError("top_p_token_ids and top_p_token_offsets come together")
            view.kept = kept_sets(ids, offsets, n_out)
    except ChannelError as exc:
        _failed(view, exc)
    view.weight_versions = _versions(meta.get("weight_versions"), meta.get("weight_version"), n_out)


def read_openai(view: EngineView, request: dict[str, Any], body: dict[str, Any], choice: dict[str, Any]) -> None:
    """An OpenAI-style answer's channels: SGLang's `sgl_ext` and root `metadata`, vLLM's choice fields."""
    view.routes_asked = bool(request.get("return_routed_experts"))
    n_out = len(view.output_ids or ())
    try:
        sglang = _sglang_openai_routes(body, choice)
        if sglang is not None:
            rows = _rows(view, 0)
            if rows is None:
                raise ChannelError("routed_experts: the call's prompt or output ids are unknown")
            view.routes = sglang_routes(sglang, 0, rows)
        elif isinstance(choice.get("routed_experts"), str):
            view.routes = npy_routes(choice["routed_experts"], _rows(view, 0))
    except ChannelError as exc:
        _failed(view, exc)
    metadata = object_at(body, "metadata")
    spans = choice.get("weight_versions", metadata.get("weight_versions"))
    view.weight_versions = _versions(spans, metadata.get("weight_version"), n_out)


def _sglang_openai_routes(body: dict[str, Any], choice: dict[str, Any]) -> Any:
    """SGLang's OpenAI routes: the root `sglext.routed_experts` (0.5.23; streamed, a chunk of its own), the choice's
    `meta_info` (with `return_meta_info`), or the choice's `sgl_ext` (where older readers looked)."""
    for holder in (object_at(body, "sglext"), object_at(choice, "meta_info"), object_at(choice, "sgl_ext")):
        if holder.get("routed_experts") is not None:
            return holder["routed_experts"]
    return None


def _versions(spans: Any, version: Any, n_out: int) -> tuple[VersionSpan, ...]:
    """Spans where they read; else the final version over the whole output; else none. Versions say which weights
    generated a turn, and no engine's spans are worth failing a turn over (routes and kept sets are)."""
    try:
        return version_spans(spans, version, n_out)
    except ChannelError:
        try:
            return version_spans(None, version, n_out)
        except ChannelError:
            return ()


def _failed(view: EngineView, exc: ChannelError) -> None:
    view.routes, view.kept = None, None
    view.channel_error = str(exc)
