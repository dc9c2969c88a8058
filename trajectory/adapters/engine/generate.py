"""The engine client of tito's adapter: sampling parameters, rids, aborts (router-aware) and error mapping, in the
engine dialect the adapter is set to call (`ADAPTER_DIALECTS`): SGLang's `/generate` (the default), vLLM's
`/inference/v1/generate`, or vLLM's `/v1/completions` with a token-id prompt (`vllm.py`).

Every call is reported to a callback as an `EngineExchange`, so a recorder sees the engine leg exactly as
sent and received. The bytes travel through an `EngineTransport` (`transport`): HTTP to a live engine by
default; a replay plugs in one that answers from a cassette.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from tito_rl.trajectory.adapters.engine import vllm
from tito_rl.trajectory.adapters.engine.continuation import (
    MAX_CONTINUATIONS,
    Continuing,
    joined,
    rest_params,
    routes_end,
)
from tito_rl.trajectory.adapters.engine.generation import EngineError, Generation, failed_call
from tito_rl.trajectory.adapters.engine.routes_layout import RoutesLayout, engine_layout
from tito_rl.trajectory.adapters.engine.served_model import MODELS_PATH, ServedModelError, read_listing
from tito_rl.trajectory.adapters.engine.transport import EngineAnswer, EngineTransport, EngineUnreachable, HttpTransport
from tito_rl.trajectory.adapters.tap import EngineExchange
from tito_rl.trajectory.dialects.channel_reads import read_sglang
from tito_rl.trajectory.dialects.view import SGLANG, VLLM_GENERATE, VLLM_OPENAI, EngineView
from tito_rl.trajectory.runtime.untracked import untrack

__all__ = [
    "ADAPTER_DIALECTS",
    "EngineClient",
    "EngineError",
    "Generation",
    "new_rid",
    "parse_generation",
    "sampling_params",
]

# Start of every request's sampling params: ids must round-trip, so nothing is skipped or trimmed.
BASE_SAMPLING = {"skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True}
CLIENT_SAMPLING = ("temperature", "top_p", "top_k", "stop")
# A call's error when the adapter dropped it (its agent went away): how a vLLM engine without an abort route is aborted.
DROPPED = "cancelled: the agent went away before the engine answered"
# The engine APIs tito's adapter calls (it renders the prompt itself, so only token-in routes).
ADAPTER_DIALECTS = (SGLANG, VLLM_GENERATE, VLLM_OPENAI)
# SGLang lists its start arguments here, `enable_return_routed_experts` among them.
SERVER_INFO_PATH = "/get_server_info"
# slime's request for the top-p kept set of each output token (its SGLang patch), sent when sampling with top_p < 1.
KEPT_SETS_PARAMS = {"return_top_p_token_ids": True}


def sampling_params(
    client: dict[str, Any], prompt_len: int, context_length: int, default_max_tokens: int, seed: int | None = None
) -> dict[str, Any] | None:
    """Reference rules: base params, max_new_tokens capped by the client and the context left, the client's
    temperature/top_p/top_k/stop on top, and `seed` as SGLang's `sampling_seed` where one is set. SGLang's names:
    a vLLM dialect renames them (`vllm.vllm_sampling`). None when no context is left (an empty `length` turn)."""
    left = context_length - prompt_len
    if left <= 0:
        return None
    params: dict[str, Any] = dict(BASE_SAMPLING)
    params["max_new_tokens"] = min(int(client.get("max_tokens") or default_max_tokens), left)
    for key in CLIENT_SAMPLING:
        if client.get(key) is not None:
            params[key] = client[key]
    if seed is not None:
        params["sampling_seed"] = seed
    return params


def new_rid() -> str:
    # SGLang aborts by rid *prefix*: fixed-length rids never prefix one another.
    return uuid.uuid4().hex


ExchangeCallback = Callable[[EngineExchange], None]


class EngineClient:
    """`dialect`: the engine API called (`ADAPTER_DIALECTS`); `model`: the served model's name, which the vLLM
    dialects send (None: learned from the engine's `GET /v1/models` before the first generation); `routes`: whether
    SGLang is asked for expert routes (None: learned from its `GET /get_server_info` before the first generation;
    vLLM sends them unasked when started with them); `kept_sets`: whether SGLang is asked for top-p kept sets when a
    request samples with top_p < 1 (a replay of a recording from before them says False); `routes_layout`: how
    SGLang's flat route rows split into layers x top_k as told (the user's, or learned at start), else learned with
    the routes flag from the engine's `/get_server_info` (its model folder's config, `routes_layout.engine_layout`),
    else `fallback_layout` (the tokenizer folder's config), else the rows stay flat."""

    def __init__(
        self,
        base_url: str,
        session_factory: Callable[[], Awaitable[aiohttp.ClientSession]] | None = None,
        timeout_s: float = 600.0,
        rid_factory: Callable[[], str] = new_rid,
        transport: EngineTransport | None = None,
        clock: Callable[[], float] = time.time,
        dialect: str = SGLANG,
        model: str | None = None,
        routes: bool | None = None,
        kept_sets: bool = True,
        routes_layout: RoutesLayout | None = None,
        fallback_layout: RoutesLayout | None = None,
    ) -> None:
        if dialect not in ADAPTER_DIALECTS:
            raise ValueError(f"tito's adapter calls the engine in {', '.join(ADAPTER_DIALECTS)}, not {dialect!r}")
        self.base_url = base_url.rstrip("/")
        self.transport: EngineTransport = transport or HttpTransport(session_factory, timeout_s)
        self.rid_factory = rid_factory
        self.clock = clock
        self.dialect = dialect
        self.model = model
        self.routes = routes if dialect == SGLANG else False
        self.kept_sets = kept_sets and dialect == SGLANG
        self.routes_layout = routes_layout
        self.engine_layout: RoutesLayout | None = None  # learned from the engine's /get_server_info
        self.fallback_layout = fallback_layout
        self._learning: asyncio.Lock | None = None
        # The recorder's engine counter (`EngineRecord.order`), where one places this adapter's calls among a
        # trainer's updates (plain `tito record`'s engine tap shares it); None: calls are not placed.
        self.order: Callable[[], int] | None = None

    async def close(self) -> None:
        await self.transport.close()

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        headers: dict[str, str],
        on_exchange: ExchangeCallback,
        t0: float,
        base: str | None = None,
        placed: bool = True,
    ) -> EngineAnswer:
        """`placed`: a session's call, placed on the recorder's engine counter where there is one (`order`)."""
        exchange = EngineExchange(
            method, path, body, 0, headers=dict(headers), started_s=time.monotonic() - t0, dialect=self.dialect
        )
        order = self.order if placed else None
        at = order() if order is not None else None
        started = time.monotonic()
        try:
            answer = await self.transport.send(method, (base or self.base_url) + path, body, headers)
            exchange.status, exchange.response = answer.status, answer.body
            return answer
        except EngineUnreachable as exc:
            exchange.error = exc.text
            raise EngineError(
                504 if exc.timed_out else 502, f"engine unreachable at {self.base_url}{path}: {exc.text}"
            ) from exc
        except asyncio.CancelledError:  # the agent went away: the call is dropped, which a vLLM engine takes as abort
            exchange.error = DROPPED
            raise
        finally:
            exchange.duration_s = time.monotonic() - started
            if order is not None and at is not None:
                exchange.order = [at, order()]
            if base:
                exchange.path = base + path
            on_exchange(exchange)

    async def served_model(self, t0: float) -> str:
        """The served model's name, asked of the engine once when not known. Not a session's call, so no tap hears
        of it (as the recorder's engine tap leaves model info out); a replay reads the name from the recording."""
        if self.model is None:
            self._learning = self._learning or asyncio.Lock()
            async with self._learning:
                if self.model is None:
                    answer = await self._call("GET", MODELS_PATH, None, {}, lambda _exchange: None, t0, placed=False)
                    if answer.status != 200:
                        raise failed_call(MODELS_PATH, answer.status, _error_text(answer.body))
                    try:
                        self.model = read_listing(answer.body).name
                    except ServedModelError as exc:
                        raise EngineError(502, f"engine {exc}") from None
        return self.model

    async def serves_routes(self, t0: float) -> bool:
        """Whether SGLang was started with `--enable-return-routed-experts`, asked of it once when not known (its
        `/get_server_info`; not a session's call, as `served_model`). An engine that does not say is not asked."""
        if self.routes is None:
            self._learning = self._learning or asyncio.Lock()
            async with self._learning:
                if self.routes is None:
                    try:
                        answer = await self._call(
                            "GET", SERVER_INFO_PATH, None, {}, lambda _exchange: None, t0, placed=False
                        )
                    except EngineError:
                        return False  # not learned: asked again before the next generation
                    info = answer.body if answer.status == 200 and isinstance(answer.body, dict) else {}
                    self.routes = info.get("enable_return_routed_experts") is True
                    if self.routes and self.routes_layout is None:
                        self.engine_layout = engine_layout(info)
        return bool(self.routes)

    @property
    def layout(self) -> RoutesLayout | None:
        """How route rows split, by precedence: as told, as the engine's model says, as the tokenizer's says."""
        return self.routes_layout or self.engine_layout or self.fallback_layout

    async def generate(
        self,
        sid: str,
        rid: str,
        input_ids: list[int],
        params: dict[str, Any],
        on_exchange: ExchangeCallback,
        t0: float,
        routes_from: int = 0,
    ) -> Generation:
        """`routes_from`: the first position whose expert route the answer must hold (SGLang's
        `routed_experts_start_len`: rows before it came with an earlier turn's answer)."""
        headers = {"X-SMG-Routing-Key": sid}
        if self.dialect == SGLANG:
            body: dict[str, Any] = {"rid": rid, "input_ids": input_ids, "sampling_params": params}
            if self.kept_sets and _samples_top_p(params):
                body["sampling_params"] = {**params, "custom_params": dict(KEPT_SETS_PARAMS)}
            body["return_logprob"] = True
            if await self.serves_routes(t0):
                body["return_routed_experts"] = True
                body["routed_experts_start_len"] = min(max(routes_from, 0), len(input_ids))
            answer = await self._call("POST", "/generate", body, headers, on_exchange, t0)
            if answer.status != 200:
                raise failed_call("/generate", answer.status, _error_text(answer.body))
            generation = parse_generation(rid, answer.body, body, self.layout)
        else:
            model = await self.served_model(t0)
            path, body = vllm.request(self.dialect, rid, input_ids, params, model)
            answer = await self._call("POST", path, body, headers, on_exchange, t0)
            if answer.status != 200:
                raise failed_call(path, answer.status, _error_text(answer.body) + vllm.route_hint(path, answer.status))
            generation = vllm.parse_answer(self.dialect, path, rid, body, answer.body)
        generation.created = int(self.clock())
        return generation

    async def generate_whole(
        self,
        sid: str,
        run: Continuing,
        input_ids: list[int],
        params: dict[str, Any],
        on_exchange: ExchangeCallback,
        t0: float,
        routes_from: int = 0,
    ) -> Generation:
        """The turn's whole generation: where the engine aborts it on its own (a weight update's
        `abort_all_requests`, a trainer's pause or abort) and the adapter did not ask (`run.stopped`), the prompt
        and the partial output are sent again for the rest (`continuation`), at most `MAX_CONTINUATIONS` times;
        the calls' answers joined into one. Each call is reported as made, so a recording holds every one."""
        run.parts.append(await self.generate(sid, run.rid, input_ids, params, on_exchange, t0, routes_from))
        while run.parts[-1].finish_reason == "abort" and not run.stopped and len(run.parts) <= MAX_CONTINUATIONS:
            rest = rest_params(params, run.done)
            if rest is None:  # aborted as the token budget ran out: the reply is as long as it may be
                run.parts[-1].finish_reason = "length"
                break
            run.rid = self.rid_factory()
            run.parts.append(
                await self.generate(
                    sid,
                    run.rid,
                    input_ids + run.output_ids(),
                    rest,
                    on_exchange,
                    t0,
                    routes_end(run.parts, routes_from),
                )
            )
        return joined(run.parts, routes_from)

    async def abort(self, rid: str, on_exchange: ExchangeCallback, t0: float) -> bool:
        """Best effort; True when the engine was told, so the generation's call answers with its partial output.
        SGLang: its /abort_request, or, behind a router (404), every listed worker's. vLLM's generate: its
        /inference/v1/abort_requests (`--enable-scale-out`). vLLM's completions have no abort route: the call
        is dropped (False), which vLLM takes as an abort, and the output so far is lost with it."""
        if self.dialect == VLLM_OPENAI:
            return False
        if self.dialect == VLLM_GENERATE:
            try:
                answer = await self._call("POST", vllm.ABORT_PATH, vllm.abort_body(rid), {}, on_exchange, t0)
            except EngineError:
                return False
            return 200 <= answer.status < 300
        try:
            answer = await self._call("POST", "/abort_request", {"rid": rid}, {}, on_exchange, t0)
            if answer.status != 404:
                return True
            listing = await self._call("GET", "/workers", None, {}, on_exchange, t0)
            for url in worker_urls(listing.body) if listing.status == 200 else []:
                try:
                    await self._call("POST", "/abort_request", {"rid": rid}, {}, on_exchange, t0, base=url)
                except EngineError:
                    continue
        except EngineError:
            pass
        return True


def _samples_top_p(params: dict[str, Any]) -> bool:
    top_p = params.get("top_p")
    return isinstance(top_p, int | float) and not isinstance(top_p, bool) and top_p < 1


def worker_urls(listing: Any) -> list[str]:
    """Worker base URLs from a router's `GET /workers` (list of urls or of objects with `url`)."""
    if isinstance(listing, dict):
        listing = listing.get("workers") or listing.get("urls") or []
    urls = []
    for w in listing if isinstance(listing, list) else []:
        url = w if isinstance(w, str) else (w.get("url") if isinstance(w, dict) else None)
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            urls.append(url.rstrip("/"))
    return urls


def _error_text(data: Any) -> str:
    if isinstance(data, dict):
        err = data.get("error", data.get("message", data))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)
    return str(data)[:500]


def parse_generation(
    rid: str, data: Any, request: dict[str, Any] | None = None, layout: RoutesLayout | int | None = None
) -> Generation:
    """`request`: the body sent (its prompt ids and `routed_experts_start_len` place the answer's routes);
    `layout`: the model's layers x top_k (or its top_k alone), which split the routes' flat rows."""
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise EngineError(502, f"engine /generate returned a malformed body: {str(data)[:200]!r}")
    meta = data["meta_info"]
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list):
        raise EngineError(
            502, "engine /generate returned no meta_info.output_token_logprobs (was return_logprob honoured?)"
        )
    try:
        output_ids = untrack([int(t[1]) for t in triples])
        logprobs = untrack([float(t[0]) if t[0] is not None else 0.0 for t in triples])
    except (TypeError, IndexError, KeyError, ValueError) as exc:
        raise EngineError(502, f"engine /generate returned malformed logprobs: {exc!r}") from exc
    if isinstance(data.get("output_ids"), list) and data["output_ids"] != output_ids:
        raise EngineError(502, "engine /generate output_ids disagree with output_token_logprobs")
    reason = meta.get("finish_reason")
    finish = reason.get("type", "stop") if isinstance(reason, dict) else "stop"
    if finish not in ("stop", "length", "abort"):
        finish = "stop"
    try:  # a malformed body (or a hostile cassette's, in a replay) is the engine's error, not the adapter's
        prompt_tokens, cached_tokens = int(meta.get("prompt_tokens") or 0), int(meta.get("cached_tokens") or 0)
    except (TypeError, ValueError) as exc:
        raise EngineError(502, f"engine /generate returned malformed token counts: {exc}") from exc
    request = request or {}
    prompt = request.get("input_ids")
    view = EngineView(SGLANG, "generate", prompt if isinstance(prompt, list) else None, output_ids)
    read_sglang(view, request, meta)
    if view.channel_error:
        raise EngineError(502, f"engine /generate returned a malformed channel: {view.channel_error}")
    generation = Generation(rid, output_ids, logprobs, finish, prompt_tokens, cached_tokens, data)
    if isinstance(layout, int):
        layout = RoutesLayout(layout)
    routes = view.routes
    if routes is not None and layout is not None:
        routes = routes.with_split(layout.top_k, layout.layers)
    generation.routes, generation.kept, generation.weight_versions = routes, view.kept, view.weight_versions
    return generation
