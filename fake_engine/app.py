"""The fake engine's HTTP app: SGLang 0.5.x's native API, and the OpenAI-compatible dialects, in front of a Policy.

`create_app(policy, options)` is the single factory; tests and other modules use it like this:

    from aiohttp import web
    from tito_rl.fake_engine.app import EngineOptions, create_app
    app = create_app(ScriptedPolicy(scenario, tokenizer), EngineOptions(tokenizer=tokenizer))
    web.run_app(app, host="127.0.0.1", port=30000)

The app owns everything a policy should not care about: validation (validation.py), queueing and
`/abort_request`, streaming, faults (faults.py) and response shapes (responses.py). A policy only maps a
`GenerateRequest` to a `Generation`, or raises `PolicyError`. The OpenAI-compatible routes (`openai/handler.py`:
SGLang's and vLLM's `/v1/chat/completions` and `/v1/completions`, vLLM's `/inference/v1/generate`) share the
queue, aborts, faults and logprobs through `Engine.tracked_run` and `Engine.prepare`. The per-token channels (expert
routes, top-p kept sets, weight versions) and the weight-update admin routes are in `channels/`; `Engine.produce`
notes the weight version of each token it makes and holds them while generation is paused.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from tito_rl.fake_engine.channels.admin import add_admin_routes
from tito_rl.fake_engine.channels.answer import ChannelSettings, sglang_channels, version_spans
from tito_rl.fake_engine.channels.moe import DEFAULT_MOE, MoeShape
from tito_rl.fake_engine.channels.versions import WeightVersions
from tito_rl.fake_engine.drift import inject_splits
from tito_rl.fake_engine.faults import FaultSchedule, FaultSpec
from tito_rl.fake_engine.logprobs import logprobs_for, token_logprob
from tito_rl.fake_engine.openai.calls import CHAT_PATH, COMPLETIONS_PATH, GENERATE_PATH, vllm_error
from tito_rl.fake_engine.openai.handler import SCALE_OUT_REFUSAL, OpenAIRoutes
from tito_rl.fake_engine.openai.render_route import RENDER_PATH, RenderRoute
from tito_rl.fake_engine.openai.tokenize_routes import TokenizeRoutes
from tito_rl.fake_engine.openai.tokens import visible_text
from tito_rl.fake_engine.openai.vllm_bodies import models_list as vllm_models_list
from tito_rl.fake_engine.openai.vllm_versions import VLLM_DEFAULT_VERSION
from tito_rl.fake_engine.policy import FinishKind, GenerateRequest, Generation, Policy, PolicyError
from tito_rl.fake_engine.serving import Dropped, Prepared, Tracked, drop, dumps, json_response
from tito_rl.fake_engine.sessions import continued_tokens, session_key, turn_index
from tito_rl.fake_engine.sglang.logprob_layout import LogprobLayout, laid_out
from tito_rl.fake_engine.sglang.responses import (
    DEFAULT_PROFILE,
    finish_abort,
    finish_length,
    finish_stop,
    generate_body,
    get_profile,
    logprob_entries,
    meta_info,
    model_info,
    models_list,
    queued_abort_body,
    server_info,
)
from tito_rl.fake_engine.sglang.validation import (
    EngineHTTPError,
    check_context,
    check_routes_start,
    parse_failure,
    parse_generate,
    verify_sampling,
)
from tito_rl.trajectory.dialects.view import VLLM_GENERATE, VLLM_OPENAI

ROUTING_HEADER = "X-SMG-Routing-Key"
TOKENS_PATH = "/v1/chat/completions/tokens"  # /inference/v1/generate's earlier name (prime-rl PR #1422)
VLLM_ABORT_PATHS = ("/inference/v1/abort_requests", "/abort_requests")
VLLM_ID_PREFIXES = ("generate-tokens-", "cmpl-", "chatcmpl-", "")  # the engine's ids of a request_id, then as is
FLUSH_CACHE_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


@dataclass
class EngineOptions:
    """Server-level settings (what `python -m sglang.launch_server` flags would set)."""

    model_name: str = "Qwen/Qwen3-8B"  # served model name
    model_path: str = "Qwen/Qwen3-8B"
    context_length: int = 40960
    version_profile: str = DEFAULT_PROFILE
    incremental_streaming: bool = False
    router: bool = False  # also serve GET /workers, refuse /abort_request like the SGLang router
    weight_version: str = "default"
    max_running_requests: int = 0  # 0: unlimited; beyond it requests wait in a queue (abortable)
    vocab_size: int = 151936
    tokenizer: Any = None  # for `text` in requests and `text` in responses; None: no text key
    faults: FaultSchedule = field(default_factory=FaultSchedule)
    logprob_seed: str = "tito"
    host: str = "127.0.0.1"
    port: int = 30000
    # The shared OpenAI paths (/v1/chat/completions, /v1/completions): None tells SGLang's server from vLLM's by
    # the request's SGLang-only fields (trajectory/dialects/registry.py); "sglang-openai" or "vllm-openai" forces
    # one (and picks GET /v1/models' shape).
    openai_dialect: str | None = None
    # vLLM as started (docs/engine-dialects.md, "The contract"): the release whose wire shapes to answer with, and
    # the start flags that open routes and options: `--enable-scale-out` (/inference/v1/generate; 403 without),
    # `--enable-auto-tool-choice --tool-call-parser hermes` (tool_choice auto, required, named; 400 without),
    # `--reasoning-parser qwen3` (the message's `reasoning` filled; null without).
    vllm_version: str = VLLM_DEFAULT_VERSION
    vllm_scale_out: bool = True
    vllm_auto_tool_choice: bool = True
    vllm_reasoning_parser: bool = True
    # `--enable-return-routed-experts` (both engines' start flag) and the model's MoE shape (`--moe L,K,E`).
    return_routed_experts: bool = False
    moe: MoeShape = DEFAULT_MOE


class Engine:
    """Request bookkeeping shared by the router face and its worker face."""

    def __init__(self, policy: Policy, options: EngineOptions) -> None:
        self.policy = policy
        self.options = options
        self.profile = get_profile(options.version_profile)
        self.tracked: dict[str, Tracked] = {}
        self.slots = asyncio.Semaphore(options.max_running_requests) if options.max_running_requests else None
        self.restarting_until = 0.0
        self.startup_time = time.time()
        self.weights = WeightVersions(options.weight_version)
        self.channels = ChannelSettings(options.return_routed_experts, options.moe, options.vocab_size)
        self.running = asyncio.Event()  # clear while generation is paused
        self.running.set()
        self.paused = asyncio.Event()  # set while paused (tests wait on it)

    # ---- bookkeeping -------------------------------------------------------------------------------
    def abort(self, rid: str, abort_all: bool) -> int:
        """SGLang 0.5.23 semantics: an empty rid is ignored, an unknown exact rid does nothing (one
        tokenizer worker), a known one aborts every request whose rid starts with it."""
        if not abort_all and (not rid or rid not in self.tracked):
            return 0
        hits = [t for r, t in self.tracked.items() if abort_all or r.startswith(rid)]
        for t in hits:
            t.aborted.set()
        return len(hits)

    def restart(self, seconds: float, current: web.Request) -> None:
        self.restarting_until = time.monotonic() + seconds
        for t in list(self.tracked.values()):
            if t.request is not None and t.request is not current and t.request.transport is not None:
                t.request.transport.abort()
        self.tracked.clear()

    @property
    def restarting(self) -> bool:
        return time.monotonic() < self.restarting_until

    def pause(self) -> None:
        """Hold every request at its next token until `resume` (SGLang's in-place pause, vLLM's `keep`)."""
        self.running.clear()
        self.paused.set()

    def resume(self) -> None:
        self.paused.clear()
        self.running.set()

    def update_weight_version(self, new_version: str, abort_all: bool) -> None:
        """The tokens made from now on carry `new_version`; `abort_all` first aborts every request in flight."""
        if abort_all:
            self.abort("", True)
        self.weights.update(new_version)

    # ---- /generate ---------------------------------------------------------------------------------
    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        try:
            if self.restarting:
                drop(request)
            raw = await request.read()
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise parse_failure(f"JSON decode error: {e.msg if hasattr(e, 'msg') else e}") from None
            rows = batch_rows(body)
            if rows is not None and self.profile.contract_check:
                if body.get("stream"):
                    return await self._stream_batch(request, [{**row, "stream": False} for row in rows])
                return await self._batch(request, rows)
            return await self._generate(request, body)
        except EngineHTTPError as e:
            if e.content_type == "application/json":
                return json_response(e.body, e.status)
            return web.Response(text=str(e.body), status=e.status, content_type=e.content_type)
        except Dropped:
            return web.Response(status=500)  # never reaches the client: the socket is gone

    async def _batch(self, request: web.Request, rows: list[dict[str, Any]]) -> web.StreamResponse:
        """A batch (`input_ids` as a list of lists, or `sampling_params.n` > 1): each row answered in turn, the
        answers as a list (SGLang 0.5.23, seen live); the first failing row's answer is the batch's."""
        answers: list[Any] = []
        for row in rows:
            answer = await self._generate(request, row)
            if answer.status != 200 or not isinstance(answer, web.Response) or answer.body is None:
                return answer
            answers.append(json.loads(bytes(answer.body)))  # type: ignore[arg-type]
        return json_response(answers)

    async def _stream_batch(self, request: web.Request, rows: list[dict[str, Any]]) -> web.StreamResponse:
        """A streamed batch: each row's answer as cumulative chunks, each chunk naming its row by `index`, the rows'
        chunks interleaved as SGLang sends them (0.5.23, seen live), then one `[DONE]`."""
        finals: list[dict[str, Any]] = []
        for row in rows:
            answer = await self._generate(request, row)
            if answer.status != 200 or not isinstance(answer, web.Response) or answer.body is None:
                return answer
            finals.append(json.loads(bytes(answer.body)))  # type: ignore[arg-type]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        longest = max(len(final["output_ids"]) for final in finals)
        for step in range(1, longest + 1):
            for index, final in enumerate(finals):
                if step <= len(final["output_ids"]):
                    chunk = cumulative_chunk(final, step, self.options.tokenizer)
                    await resp.write(b"data: " + dumps({**chunk, "index": index}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _generate(self, request: web.Request, body: Any) -> web.StreamResponse:
        opts = self.options
        parsed = parse_generate(body, self.profile, request.headers.get(ROUTING_HEADER))
        input_ids = parsed.input_ids
        if input_ids is None:
            if opts.tokenizer is None:
                raise EngineHTTPError(
                    400, {"error": {"message": "text input needs a tokenizer (the engine runs without one)"}}
                )
            input_ids = list(opts.tokenizer.encode(parsed.text, add_special_tokens=False))
        sp = parsed.sampling_params
        check_context(len(input_ids), sp.get("max_new_tokens"), opts.context_length)
        verify_sampling(sp, opts.vocab_size)
        if parsed.return_routed_experts:
            check_routes_start(parsed.routed_experts_start_len, len(input_ids))
        rid = parsed.rid or uuid.uuid4().hex
        greq = GenerateRequest(
            input_ids=input_ids,
            sampling_params=sp,
            rid=rid,
            stream=parsed.stream,
            return_logprob=parsed.return_logprob,
            routing_key=parsed.routing_key,
            headers=request.headers,
            session_key=session_key(input_ids, parsed.routing_key),
            turn_index=turn_index(input_ids),
            return_routed_experts=parsed.return_routed_experts,
            routed_experts_start_len=parsed.routed_experts_start_len,
            return_top_p=parsed.return_top_p,
            body=body,
        )
        start = time.perf_counter()

        def queued() -> web.StreamResponse:
            return json_response(
                queued_abort_body(
                    rid=rid,
                    weight_version=self.weights.current,
                    with_logprobs=parsed.return_logprob,
                    e2e_latency=time.perf_counter() - start,
                    sent_ts=time.time(),
                    has_text=opts.tokenizer is not None,
                )
            )

        n = int(sp.get("n") or 1)
        if n > 1:
            return await self._parallel(request, greq, n, start, queued)
        return await self.tracked_run(request, rid, lambda tracked: self._run(request, greq, tracked, start), queued)

    async def _parallel(
        self,
        request: web.Request,
        greq: GenerateRequest,
        n: int,
        start: float,
        queued: Callable[[], web.StreamResponse],
    ) -> web.StreamResponse:
        """SGLang's parallel sampling (`n > 1`): a list of n answers under rids `<rid>_<i>`, each choice its own
        draws (`GenerateRequest.choice_index`); the first error answers for all. Streamed: each choice's events in
        turn, each carrying its `index` (SGLang sends them as they come; one after the other is one such order)."""
        if greq.stream:
            return await self.tracked_run(
                request, greq.rid, partial(self._stream_choices, request, greq, n, start), queued
            )
        bodies = []
        for i in range(n):
            sub = replace(greq, rid=f"{greq.rid}_{i}", choice_index=i)
            answer = await self.tracked_run(request, sub.rid, partial(self._run, request, sub, start=start), queued)
            if not isinstance(answer, web.Response) or answer.status != 200 or not isinstance(answer.body, bytes):
                return answer
            bodies.append(json.loads(answer.body))
        return json_response(bodies)

    async def tracked_run(
        self,
        request: web.Request,
        rid: str,
        run: Callable[[Tracked], Awaitable[web.StreamResponse]],
        queued_abort: Callable[[], web.StreamResponse],
    ) -> web.StreamResponse:
        """Run one request under its rid: abortable by `/abort_request`, queued beyond the running limit
        (`queued_abort` answers one aborted while it waited). Every dialect's requests go through here."""
        tracked = Tracked(rid=rid, request=request)
        self.tracked[rid] = tracked
        try:
            if not await self._admit(tracked):
                return queued_abort()
            try:
                return await run(tracked)
            finally:
                if self.slots is not None:
                    self.slots.release()
        finally:
            tracked.done.set()
            if self.tracked.get(rid) is tracked:
                del self.tracked[rid]

    async def _admit(self, tracked: Tracked) -> bool:
        """Wait for a running slot; False if aborted while queued."""
        if self.slots is None:
            tracked.running = True
            return True
        acquire = asyncio.ensure_future(self.slots.acquire())
        aborted = asyncio.ensure_future(tracked.aborted.wait())
        await asyncio.wait({acquire, aborted}, return_when=asyncio.FIRST_COMPLETED)
        if acquire.done() and not tracked.aborted.is_set():
            aborted.cancel()
            tracked.running = True
            return True
        if acquire.done():
            self.slots.release()
        else:
            acquire.cancel()
        aborted.cancel()
        return False

    def _policy_generation(self, greq: GenerateRequest) -> Generation:
        try:
            return self.policy.generate(greq)
        except PolicyError as e:
            raise EngineHTTPError(e.status, {"error": {"message": e.message}}) from None

    def _shape_output(
        self, greq: GenerateRequest, gen: Generation, faults: FaultSpec
    ) -> tuple[list[int], list[float], str, Any]:
        ids = list(gen.output_ids)
        lps = (
            list(gen.logprobs)
            if gen.logprobs is not None
            else logprobs_for(self.options.logprob_seed, greq.session_key, greq.turn_index, ids)
        )
        finish, matched = gen.finish, gen.matched
        if faults.drift and self.options.tokenizer is not None:
            split = inject_splits(self.options.tokenizer, ids, faults.drift_splits)
            if split is not None:
                ids, positions = split
                for pos in positions:  # in order: each earlier split has already shifted the logprobs
                    extra = token_logprob(
                        self.options.logprob_seed, greq.session_key, greq.turn_index, pos + 1, ids[pos + 1]
                    )
                    lps = lps[: pos + 1] + [extra] + lps[pos + 1 :]
        done = continued_tokens(greq.input_ids, ids)  # a continuation after an abort: the rest of the reply
        if done:
            ids, lps = ids[done:], lps[done:]
        cuts: tuple[tuple[int | None, FinishKind], ...] = (
            (faults.finish_length, "length"),
            (faults.abort_after, "abort"),
        )
        for keep, kind in cuts:
            if keep is not None and (keep < len(ids) or kind == "abort"):
                ids, lps, finish = ids[:keep], lps[:keep], kind
        limit = greq.max_new_tokens
        if limit is not None and len(ids) > limit:
            ids, lps, finish = ids[:limit], lps[:limit], "length"
        if finish == "stop" and matched is None:
            matched = ids[-1] if ids else None
        return ids, lps, finish, matched

    def _finish_reason(self, finish: str, matched: Any, n: int) -> dict[str, Any]:
        if finish == "stop":
            return finish_stop(matched)
        if finish == "length":
            return finish_length(n)
        return finish_abort()

    def _text(self, ids: list[int], sp: dict[str, Any], trim_stop: bool, matched: Any = None) -> str | None:
        tok = self.options.tokenizer
        if tok is None:
            return None
        skip = sp.get("skip_special_tokens")
        return visible_text(
            tok,
            ids,
            "stop" if trim_stop else None,
            matched,
            skip_special_tokens=True if skip is None else bool(skip),
            sglang=True,
            keep_stop=bool(sp.get("no_stop_trim", False)),
        )

    def _body(
        self,
        greq: GenerateRequest,
        ids: list[int],
        lps: list[float],
        finish_reason: dict[str, Any] | None,
        cached: int,
        *,
        n_total: int,
        trim_stop: bool = False,
        e2e: float | None = None,
        sent_ts: float | None = None,
        full: list[int] | None = None,
        tracked: Tracked | None = None,
        faults: FaultSpec | None = None,
        matched: Any = None,
    ) -> dict[str, Any]:
        """One response body; `ids` may be a streaming delta while `n_total` counts all output so far (`full`: all of
        it, for the channels; a finished answer has a finish reason)."""
        entries = logprob_entries(ids, lps) if greq.return_logprob else None
        faults = faults or FaultSpec()
        version, spans = version_spans(self.weights, tracked.versions if tracked else [], n_total, faults)
        channels = sglang_channels(
            self.channels, greq, ids if full is None else full, faults, final=finish_reason is not None
        )
        meta = meta_info(
            rid=greq.rid,
            finish_reason=finish_reason,
            prompt_tokens=len(greq.input_ids),
            n_output=n_total,
            profile=self.profile,
            weight_version=version,
            logprobs=entries,
            cached_tokens=cached,
            e2e_latency=e2e,
            sent_ts=sent_ts,
            weight_versions=spans,
            channels=channels,
        )
        layout = LogprobLayout.of(dict(greq.body))
        if greq.return_logprob and layout != LogprobLayout():
            meta = laid_out(meta, layout, greq.input_ids, self.options.logprob_seed, self.options.tokenizer)
        return generate_body(self._text(ids, greq.sampling_params, trim_stop, matched), ids, meta)

    async def prepare(
        self, request: web.Request, greq: GenerateRequest, error_body: Callable[[int, str], Any] | None = None
    ) -> Prepared | web.Response:
        """Everything before the first output byte, shared by every dialect: the policy's answer, then the
        faults (latency, restart, dropped connection, an HTTP error in `error_body`'s envelope) and the
        output's shaping (drift splits, length and abort cuts, max tokens)."""
        faults = self.options.faults.next()
        gen = self._policy_generation(greq)
        faults = faults.merged(gen.faults)
        if faults.latency_ms:
            await asyncio.sleep(faults.latency_ms / 1000)
        if faults.restart_s is not None:
            self.restart(faults.restart_s, request)
            drop(request)
        if faults.drop_connection:
            drop(request)
        if faults.status is not None:
            # Default: what SGLang's HTTPException handler writes for a 5xx.
            body = (
                error_body(faults.status, faults.message)
                if error_body
                else {
                    "object": "error",
                    "message": faults.message,
                    "type": str(faults.status),
                    "param": None,
                    "code": faults.status,
                }
            )
            return json_response(body, faults.status)
        ids, lps, finish, matched = self._shape_output(greq, gen, faults)
        return Prepared(ids, lps, finish, matched, gen.cached_tokens, faults)

    async def _run(
        self, request: web.Request, greq: GenerateRequest, tracked: Tracked, start: float
    ) -> web.StreamResponse:
        prepared = await self.prepare(request, greq)
        if isinstance(prepared, web.Response):
            return prepared
        ids, lps, finish, matched, faults = (
            prepared.ids,
            prepared.logprobs,
            prepared.finish,
            prepared.matched,
            prepared.faults,
        )
        gen = prepared
        if greq.stream:
            return await self._stream(
                request, greq, tracked, ids, lps, finish, matched, gen.cached_tokens, faults, start
            )
        produced = await self.produce(tracked, len(ids), faults.token_delay_ms, faults.pause_after)
        if produced < len(ids) or tracked.aborted.is_set():
            ids, lps, finish = ids[:produced], lps[:produced], "abort"
        body = self._body(
            greq,
            ids,
            lps,
            self._finish_reason(finish, matched, len(ids)),
            gen.cached_tokens,
            n_total=len(ids),
            trim_stop=finish == "stop",
            e2e=time.perf_counter() - start,
            sent_ts=time.time(),
            tracked=tracked,
            faults=faults,
            matched=matched,
        )
        return json_response(body)

    async def produce(self, tracked: Tracked, n: int, delay_ms: float, pause_after: int | None = None) -> int:
        """Pretend to decode n tokens, each noted with the weight version current when it is made; a pause holds
        them, an abort stops them. Returns how many were produced. `pause_after` (a fault): the engine pauses
        itself once this request has made that many tokens."""
        if pause_after is not None and tracked.pause_at is None and tracked.produced <= pause_after:
            tracked.pause_at = pause_after
        done = 0
        while done < n or tracked.pause_at == tracked.produced:
            if tracked.pause_at is not None and tracked.produced >= tracked.pause_at:
                tracked.pause_at = None
                self.pause()
            if done == n:
                break
            if not (self.running.is_set() or tracked.exempt.is_set()) and not await self._until_running(tracked):
                break
            if tracked.aborted.is_set():
                break
            step = 1 if delay_ms > 0 else n - done
            if tracked.pause_at is not None:
                step = min(step, tracked.pause_at - tracked.produced)
            if delay_ms > 0:
                try:
                    await asyncio.wait_for(tracked.aborted.wait(), delay_ms / 1000)
                    break
                except TimeoutError:
                    pass
            tracked.versions.extend([self.weights.current] * step)
            done += step
        return done

    async def _until_running(self, tracked: Tracked) -> bool:
        """Wait out a pause (or an exemption from it); False if the request is aborted meanwhile."""
        waits = [asyncio.ensure_future(e.wait()) for e in (self.running, tracked.exempt, tracked.aborted)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        return not tracked.aborted.is_set()

    async def _stream_choices(
        self, request: web.Request, greq: GenerateRequest, n: int, start: float, tracked: Tracked
    ) -> web.StreamResponse:
        """A streamed `n > 1`: every choice's output prepared (a status fault answers for all), then one stream."""
        choices = [replace(greq, rid=f"{greq.rid}_{i}", choice_index=i) for i in range(n)]
        prepared = []
        for choice in choices:
            answer = await self.prepare(request, choice)
            if isinstance(answer, web.Response):
                return answer
            prepared.append(answer)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        for i, (choice, p) in enumerate(zip(choices, prepared, strict=True)):
            part = Tracked(rid=choice.rid, aborted=tracked.aborted, request=request, exempt=tracked.exempt)
            await self._stream(
                request,
                choice,
                part,
                p.ids,
                p.logprobs,
                p.finish,
                p.matched,
                p.cached_tokens,
                p.faults,
                start,
                resp=resp,
                index=i,
                last=i == n - 1,
            )
        return resp

    async def _stream(
        self,
        request: web.Request,
        greq: GenerateRequest,
        tracked: Tracked,
        ids: list[int],
        lps: list[float],
        finish: str,
        matched: Any,
        cached: int,
        faults: FaultSpec,
        start: float,
        resp: web.StreamResponse | None = None,
        index: int | None = None,
        last: bool = True,
    ) -> web.StreamResponse:
        """Cumulative chunks by default (each repeats all output so far), deltas in incremental mode;
        the last event is the full body, then `[DONE]`. One choice of `n` (`index`) writes to the shared `resp`,
        each event with its `index`; the `last` one ends the stream."""
        if resp is None:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
            await resp.prepare(request)

        def event(body: dict[str, Any]) -> bytes:
            return b"data: " + dumps(body if index is None else {**body, "index": index}) + b"\n\n"

        interval = max(1, int(greq.sampling_params.get("stream_interval") or 1))
        incremental = self.options.incremental_streaming
        prev, sent = 0, 0
        while prev < len(ids):
            step = min(interval, len(ids) - prev)
            produced = await self.produce(tracked, step, faults.token_delay_ms, faults.pause_after)
            if produced < step or tracked.aborted.is_set():
                ids, lps, finish = ids[: prev + produced], lps[: prev + produced], "abort"
                break
            if prev + step == len(ids):
                break  # the final event below carries the last tokens
            lo = prev if incremental else 0
            chunk = self._body(
                greq,
                ids[lo : prev + step],
                lps[lo : prev + step],
                None,
                cached,
                n_total=prev + step,
                sent_ts=time.time() if sent == 0 else None,
                full=ids[: prev + step],
                tracked=tracked,
                faults=faults,
            )
            await resp.write(event(chunk))
            sent += 1
            prev += step
            if faults.cut_stream_after is not None and sent >= faults.cut_stream_after:
                drop(request)
        if faults.cut_stream_after is not None and sent >= faults.cut_stream_after:
            drop(request)
        lo = prev if incremental else 0
        final = self._body(
            greq,
            ids[lo:],
            lps[lo:],
            self._finish_reason(finish, matched, len(ids)),
            cached,
            n_total=len(ids),
            trim_stop=finish == "stop",
            e2e=time.perf_counter() - start,
            sent_ts=time.time() if sent == 0 else None,
            full=ids,
            tracked=tracked,
            faults=faults,
            matched=matched,
        )
        await resp.write(event(final))
        if last:
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        return resp

    # ---- other endpoints ---------------------------------------------------------------------------
    async def handle_abort(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read() or b"{}")
        except json.JSONDecodeError as e:
            return json_response(parse_failure(f"JSON decode error: {e.msg}").body, 400)
        if not isinstance(body, dict):
            return json_response(parse_failure("Input should be a valid dictionary or object").body, 400)
        self.abort(str(body.get("rid") or ""), bool(body.get("abort_all") or False))
        return web.Response(status=200)

    async def handle_abort_requests(self, request: web.Request) -> web.Response:
        """vLLM's `/inference/v1/abort_requests` (and `/abort_requests`): `{"request_ids": [...]}`, each the engine's
        id of a request (`/inference/v1/generate` runs `request_id` X as `generate-tokens-X`, completions as
        `cmpl-X`) or the bare `request_id`; unknown ids are ignored. 200 with no body, as vLLM 0.32 answers."""
        try:
            body = json.loads(await request.read() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return json_response(vllm_error(400, f"JSON decode error: {e}"), 400)
        ids = body.get("request_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            return json_response(vllm_error(400, "Missing 'request_ids' in request body"), 400)
        for request_id in map(str, ids):
            for prefix in VLLM_ID_PREFIXES:
                rid = request_id.removeprefix(prefix)
                if rid in self.tracked:
                    self.abort(rid, False)
                    break
        return web.Response(status=200)

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.restarting else 200)

    async def handle_model_info(self, request: web.Request) -> web.Response:
        o = self.options
        return json_response(
            model_info(model_path=o.model_path, served_model_name=o.model_name, weight_version=self.weights.current)
        )

    async def handle_server_info(self, request: web.Request) -> web.Response:
        o = self.options
        return json_response(
            server_info(
                model_path=o.model_path,
                served_model_name=o.model_name,
                host=o.host,
                port=o.port,
                context_length=o.context_length,
                incremental=o.incremental_streaming,
                profile=self.profile,
                startup_time=self.startup_time,
                enable_return_routed_experts=o.return_routed_experts,
                weight_version=self.weights.current,
            )
        )

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        return web.Response(text=FLUSH_CACHE_TEXT, content_type="text/plain")

    async def handle_models(self, request: web.Request) -> web.Response:
        o = self.options
        if o.openai_dialect in (VLLM_OPENAI, VLLM_GENERATE):
            return json_response(vllm_models_list(o.model_name, o.context_length, int(self.startup_time)))
        return json_response(models_list(o.model_name, o.context_length, int(self.startup_time)))

    async def handle_workers(self, request: web.Request) -> web.Response:
        url = f"{request.scheme}://{request.host}/worker0"
        worker = {
            "url": url,
            "model": self.options.model_name,
            "healthy": not self.restarting,
            "requests_active": len(self.tracked),
        }
        return json_response({"workers": [worker], "total": 1, "healthy": int(not self.restarting)})


ENGINE_KEY = web.AppKey("engine", Engine)


def _add_engine_routes(app: web.Application, engine: Engine, *, abort: bool) -> None:
    r = app.router
    r.add_route("POST", "/generate", engine.handle_generate)
    r.add_route("PUT", "/generate", engine.handle_generate)
    if abort:
        r.add_post("/abort_request", engine.handle_abort)
        for path in VLLM_ABORT_PATHS:
            r.add_post(path, engine.handle_abort_requests)
    r.add_get("/health", engine.handle_health)
    r.add_get("/health_generate", engine.handle_health)
    r.add_get("/get_model_info", engine.handle_model_info)
    r.add_get("/get_server_info", engine.handle_server_info)
    if engine.profile.info_routes:
        r.add_get("/model_info", engine.handle_model_info)
        r.add_get("/server_info", engine.handle_server_info)
    r.add_route("GET", "/flush_cache", engine.handle_flush_cache)
    r.add_route("POST", "/flush_cache", engine.handle_flush_cache)
    r.add_get("/v1/models", engine.handle_models)
    add_admin_routes(app, engine)
    openai = OpenAIRoutes(engine)
    for path in (CHAT_PATH, COMPLETIONS_PATH, GENERATE_PATH, TOKENS_PATH):
        r.add_post(path, openai.handle)
    if engine.options.tokenizer is not None:
        tokenize = TokenizeRoutes(engine.options.tokenizer, engine.options.context_length)
        r.add_post("/tokenize", tokenize.tokenize)
        r.add_post("/detokenize", tokenize.detokenize)
        r.add_post("/v1/tokenize", tokenize.sglang_tokenize)
        r.add_post("/v1/detokenize", tokenize.sglang_detokenize)
        opts = engine.options
        render = RenderRoute(opts.tokenizer, opts.model_name, opts.vllm_scale_out, SCALE_OUT_REFUSAL)
        r.add_post(RENDER_PATH, render.render)


def batch_rows(body: Any) -> list[dict[str, Any]] | None:
    """The single requests of a /generate batch, or None: `input_ids` as a list of lists, each row `sampling_params.n`
    times (SGLang expands it into n copies of the request). One prompt with `n` > 1 is no batch here: `_parallel`
    answers it, each choice under `<rid>_<i>` with its own draws."""
    if not isinstance(body, dict):
        return None
    ids, params = body.get("input_ids"), body.get("sampling_params")
    n = params.get("n") if isinstance(params, dict) else None
    copies = n if isinstance(n, int) and n > 1 else 1
    single = {k: v for k, v in body.items() if k != "rid"}
    if isinstance(params, dict) and copies > 1:
        single["sampling_params"] = {k: v for k, v in params.items() if k != "n"}
    if isinstance(ids, list) and ids and all(isinstance(row, list) for row in ids):
        return [{**single, "input_ids": row} for row in ids for _ in range(copies)]
    return None


def cumulative_chunk(final: dict[str, Any], step: int, tokenizer: Any) -> dict[str, Any]:
    """The chunk of a finished /generate answer after `step` output tokens, as a cumulative stream sends it: the last
    one is the answer (less `response_sent_to_client_ts`), an earlier one has no finish, spans or latency, the
    first one its send time."""
    ids = final["output_ids"]
    meta = dict(final["meta_info"])
    if step == len(ids):
        meta.pop("response_sent_to_client_ts", None)
        return {**final, "meta_info": meta} if step > 1 else final
    for key in ("weight_versions", "e2e_latency"):
        meta.pop(key, None)
    if step > 1:
        meta.pop("response_sent_to_client_ts", None)
    meta["finish_reason"] = None
    meta["completion_tokens"] = step
    for key in ("output_token_logprobs", "output_top_logprobs"):
        if key in meta:
            meta[key] = meta[key][:step]
    if "output_token_logprobs_length" in meta:
        meta["output_token_logprobs_length"] = step
    chunk: dict[str, Any] = {}
    if "text" in final:
        chunk["text"] = tokenizer.decode(ids[:step]) if tokenizer is not None else ""
    chunk["output_ids"] = ids[:step]
    chunk["meta_info"] = meta
    return chunk


FASTAPI_DETAILS = {404: "Not Found", 405: "Method Not Allowed"}


@web.middleware
async def fastapi_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """An unknown route or method answered as both engines' FastAPI servers answer it: `{"detail": "Not Found"}`
    (404) or `{"detail": "Method Not Allowed"}` (405), not aiohttp's text."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status in FASTAPI_DETAILS and error.text and error.text.startswith(f"{error.status}:"):
            headers = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else None
            response = json_response({"detail": FASTAPI_DETAILS[error.status]}, error.status)
            if headers:
                response.headers.update(headers)
            return response
        raise


def create_app(policy: Policy, options: EngineOptions | None = None) -> web.Application:
    """The fake engine as an aiohttp app. Router mode: the app is the router (no /abort_request, plus
    GET /workers) and its one worker is mounted at /worker0 with the full engine API."""
    options = options or EngineOptions()
    engine = Engine(policy, options)
    app = web.Application(client_max_size=1 << 30, middlewares=[fastapi_errors])
    app[ENGINE_KEY] = engine
    _add_engine_routes(app, engine, abort=not options.router)
    if options.router:
        app.router.add_get("/workers", engine.handle_workers)
        worker = web.Application(client_max_size=1 << 30)
        _add_engine_routes(worker, engine, abort=True)
        app.add_subapp("/worker0/", worker)
    return app
