"""The OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/inference/v1/generate`.

Each request goes the way a `/generate` does (`app.Engine`): read into a `GenerateRequest` (prompt ids from the
request, or rendered from its messages), tracked under its rid (abortable, queued beyond the running limit), the
policy asked, the faults applied (`Engine.prepare`), the tokens "decoded" at the fault's pace, then written in the
dialect's shapes, streamed or not. Only the shapes differ: the output ids and logprobs are the policy's, so every
dialect's normalized view (`trajectory/dialects`) reads back the same tokens.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, Protocol

from aiohttp import web

from tito_rl.fake_engine.channels.answer import ChannelSettings, sglang_channels, version_spans, vllm_routes
from tito_rl.fake_engine.channels.versions import WeightVersions
from tito_rl.fake_engine.faults import FaultSpec
from tito_rl.fake_engine.openai import sglang_bodies, vllm_bodies
from tito_rl.fake_engine.openai.calls import (
    GENERATE_PATH,
    OpenAICall,
    bad_request,
    check_prompt_start,
    dialect_of,
    error_body,
    parse_call,
    read_prompt_start,
    vllm_error,
)
from tito_rl.fake_engine.openai.parse import sglang_chat, vllm_chat, vllm_chat_deltas
from tito_rl.fake_engine.openai.render import render_chat
from tito_rl.fake_engine.openai.tokens import clip_deltas, clip_pieces, text_pieces, visible_text
from tito_rl.fake_engine.openai.vllm_versions import vllm_profile
from tito_rl.fake_engine.policy import GenerateRequest
from tito_rl.fake_engine.serving import Dropped, Prepared, Tracked, drop, dumps, json_response
from tito_rl.fake_engine.sessions import session_key, turn_index
from tito_rl.fake_engine.sglang.responses import (
    finish_abort,
    finish_length,
    finish_stop,
    get_profile,
    logprob_entries,
    meta_info,
)
from tito_rl.fake_engine.sglang.validation import EngineHTTPError, check_context, check_routes_start
from tito_rl.trajectory.dialects.view import SGLANG_OPENAI, VLLM_GENERATE, VLLM_OPENAI

ROUTING_HEADER = "X-SMG-Routing-Key"
# vLLM 0.32's answers where a start flag is missing (the engine contract recorded them).
SCALE_OUT_REFUSAL = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
AUTO_TOOL_REFUSAL = '"{}" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'


class EngineCore(Protocol):
    """What the routes need of `app.Engine` (a Protocol: the app imports this module, not the reverse)."""

    options: Any
    weights: WeightVersions
    channels: ChannelSettings

    @property
    def restarting(self) -> bool: ...

    async def prepare(
        self, request: web.Request, greq: GenerateRequest, error_body: Callable[[int, str], Any] | None = None
    ) -> Prepared | web.Response: ...

    async def tracked_run(
        self,
        request: web.Request,
        rid: str,
        run: Callable[[Tracked], Awaitable[web.StreamResponse]],
        queued_abort: Callable[[], web.StreamResponse],
    ) -> web.StreamResponse: ...

    async def produce(self, tracked: Tracked, n: int, delay_ms: float, pause_after: int | None = None) -> int: ...


def _message_of(body: Any) -> str:
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict):
            return str(inner.get("message", inner))
        return str(inner)
    return str(body)


class OpenAIRoutes:
    """The handlers, bound to one engine (router mode mounts the same engine twice)."""

    def __init__(self, engine: EngineCore) -> None:
        self.engine = engine

    @property
    def tokenizer(self) -> Any:
        return self.engine.options.tokenizer

    async def handle(self, request: web.Request) -> web.StreamResponse:
        dialect = dialect_of(request.path, None, self.engine.options.openai_dialect)
        try:
            return await self._handle(request)
        except EngineHTTPError as e:
            body = (
                e.body
                if isinstance(e.body, dict)
                and ("object" in e.body or isinstance(e.body.get("error"), dict) and "code" in e.body["error"])
                else error_body(dialect, e.status, _message_of(e.body))
            )
            return json_response(body, e.status)
        except Dropped:
            return web.Response(status=500)  # never reaches the client: the socket is gone

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        engine, opts = self.engine, self.engine.options
        if engine.restarting:
            drop(request)
        if self.tokenizer is None:
            raise EngineHTTPError(
                500,
                error_body(
                    dialect_of(request.path, None, opts.openai_dialect), 500, "the OpenAI routes need a tokenizer"
                ),
            )
        raw = await request.read()
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise bad_request(dialect_of(request.path, None, opts.openai_dialect), f"JSON decode error: {e}") from None
        call = parse_call(request.path, body, request.headers, opts.model_name, opts.openai_dialect)
        self._as_started(call, request.path)
        read_prompt_start(call)
        if call.prompt_ids is not None:
            prompt = call.prompt_ids
        elif call.endpoint == "completions":  # a text prompt, encoded as both engines do (no special tokens added)
            prompt = list(self.tokenizer.encode(str(body["prompt"]), add_special_tokens=False))
            call.prompt_ids = prompt
        else:
            prompt = render_chat(self.tokenizer, body, lambda m: error_body(call.dialect, 400, m))
        try:
            check_context(len(prompt), call.max_tokens, opts.context_length)
        except EngineHTTPError as e:
            over_prompt = len(prompt) >= opts.context_length
            param = None if call.dialect == VLLM_GENERATE else ("input_tokens" if over_prompt else "max_tokens")
            raise bad_request(call.dialect, _message_of(e.body), param) from None
        check_prompt_start(call, len(prompt))
        routing = request.headers.get(ROUTING_HEADER) or forwarded_bearer(request.headers)
        routes_asked = call.dialect == SGLANG_OPENAI and call.return_routed_experts
        if routes_asked:
            try:
                check_routes_start(call.routed_experts_start_len, len(prompt))
            except EngineHTTPError as e:
                raise bad_request(call.dialect, _message_of(e.body)) from None
        greq = GenerateRequest(
            input_ids=prompt,
            sampling_params=call.sampling,
            rid=call.rid,
            stream=call.stream,
            return_logprob=call.logprobs,
            routing_key=routing,
            headers=request.headers,
            session_key=session_key(prompt, routing),
            turn_index=turn_index(prompt),
            return_routed_experts=routes_asked,
            routed_experts_start_len=call.routed_experts_start_len,
            dialect=call.dialect,
        )
        start = time.perf_counter()
        n = call.sampling.get("n", 1)
        if type(n) is not int or n < 1:
            raise bad_request(call.dialect, f"n must be a positive integer, got {n!r}", "n")
        if n > 1 and not (call.stream and call.dialect == VLLM_GENERATE):
            return await self._parallel(request, call, greq, n, start)
        # n > 1 streamed on /inference/v1/generate: one choice (the contract's `one-choice`; vLLM answers n)
        return await engine.tracked_run(
            request,
            call.rid,
            lambda tracked: self._run(request, call, greq, tracked, start),
            lambda: json_response(self._body(call, greq, [], [], "abort", None, 0, start, queued=True)),
        )

    async def _parallel(
        self, request: web.Request, call: OpenAICall, greq: GenerateRequest, n: int, start: float
    ) -> web.StreamResponse:
        """`n > 1`: each choice run as a request of its own (tracked as `<rid>_<i>`, its own draws:
        `GenerateRequest.choice_index`), then one answer with the n choices; the first error answers for all.
        Streamed: the choices' chunks interleaved in one stream (on /inference/v1/generate, one choice: the caller)."""
        if call.stream:
            return await self.engine.tracked_run(
                request,
                call.rid,
                partial(self._run_choices, request, call, [replace(greq, choice_index=i) for i in range(n)]),
                lambda: json_response(self._body(call, greq, [], [], "abort", None, 0, start, queued=True)),
            )
        bodies = []
        for i in range(n):
            sub = replace(greq, choice_index=i)
            answer = await self.engine.tracked_run(
                request,
                f"{call.rid}_{i}",
                partial(self._run, request, call, sub, start=start),
                lambda: json_response(self._body(call, greq, [], [], "abort", None, 0, start, queued=True)),
            )
            if not isinstance(answer, web.Response) or answer.status != 200 or not isinstance(answer.body, bytes):
                return answer
            bodies.append(json.loads(answer.body))
        return json_response(merge_choices(bodies))

    async def _run_choices(
        self, request: web.Request, call: OpenAICall, greqs: list[GenerateRequest], tracked: Tracked
    ) -> web.StreamResponse:
        """A streamed `n > 1`: every choice's output prepared (the policy asked, the faults applied), then one
        stream."""
        prepared = []
        for greq in greqs:
            answer = await self.engine.prepare(request, greq, lambda status, m: error_body(call.dialect, status, m))
            if isinstance(answer, web.Response):
                return answer
            prepared.append(answer)
        return await self._stream(request, call, greqs, tracked, prepared)

    async def _run(
        self, request: web.Request, call: OpenAICall, greq: GenerateRequest, tracked: Tracked, start: float
    ) -> web.StreamResponse:
        prepared = await self.engine.prepare(request, greq, lambda status, m: error_body(call.dialect, status, m))
        if isinstance(prepared, web.Response):
            return prepared
        if call.stream:
            return await self._stream(request, call, [greq], tracked, [prepared])
        ids, lps, finish, faults = prepared.ids, prepared.logprobs, prepared.finish, prepared.faults
        produced = await self.engine.produce(tracked, len(ids), faults.token_delay_ms, faults.pause_after)
        if produced < len(ids) or tracked.aborted.is_set():
            ids, lps, finish = ids[:produced], lps[:produced], "abort"
        body = self._body(
            call, greq, ids, lps, finish, prepared.matched, prepared.cached_tokens, start, tracked.versions, faults
        )
        return json_response(body)

    def _as_started(self, call: OpenAICall, path: str) -> None:
        """The vLLM release and start flags the engine imitates (`EngineOptions.vllm_*`): the routes and options a
        missing flag closes answer as vLLM 0.32 answers them."""
        opts = self.engine.options
        call.vllm = vllm_profile(opts.vllm_version)
        call.reasoning_parser = opts.vllm_reasoning_parser
        if call.dialect == VLLM_GENERATE and call.vllm.generate_token_ids_in_logprobs:
            call.tokens_as_ids = bool(call.body.get("return_tokens_as_token_ids"))
        if path == GENERATE_PATH and not opts.vllm_scale_out:
            raise EngineHTTPError(403, vllm_error(403, SCALE_OUT_REFUSAL, "PermissionDeniedError"))
        choice = call.body.get("tool_choice")
        if (
            call.dialect == VLLM_OPENAI
            and call.tools is not None
            and not opts.vllm_auto_tool_choice
            and choice not in (None, "none")
        ):
            raise bad_request(call.dialect, AUTO_TOOL_REFUSAL.format(choice if isinstance(choice, str) else "named"))

    # ---- non-streamed bodies -----------------------------------------------------------------------
    def _seed(self, greq: GenerateRequest) -> str:
        return f"{greq.session_key}|{greq.turn_index}"

    def _text(self, call: OpenAICall, ids: list[int], finish: str, matched: Any = None) -> str:
        """The output text as the engine shows it: a matched stop token or string trimmed (`tokens.visible_text`)."""
        sglang = call.dialect == SGLANG_OPENAI
        return visible_text(
            self.tokenizer,
            ids,
            finish,
            matched,
            skip_special_tokens=call.skip_special_tokens,
            sglang=sglang,
            keep_stop=bool(
                call.body.get("no_stop_trim") if sglang else call.sampling.get("include_stop_str_in_output")
            ),
        )

    def _body(
        self,
        call: OpenAICall,
        greq: GenerateRequest,
        ids: list[int],
        lps: list[float],
        finish: str,
        matched: Any,
        cached: int,
        start: float,
        made: list[str] | None = None,
        faults: FaultSpec | None = None,
        queued: bool = False,
    ) -> dict[str, Any]:
        """A finished answer; `made`: the weight version each output token was made under; `queued`: aborted
        before it ran (no forward pass: no routes)."""
        tok, created, prompt = self.tokenizer, int(time.time()), greq.input_ids
        faults = faults or FaultSpec()
        routes: Any = vllm_bodies.UNSET
        if self.engine.channels.routes and call.dialect != SGLANG_OPENAI:
            routes = (
                None
                if queued
                else vllm_routes(self.engine.channels, prompt, ids, faults, finish, call.routed_experts_prompt_start)
            )
        if call.dialect == VLLM_GENERATE:
            _, spans = version_spans(self.engine.weights, made or [], len(ids), faults)
            return vllm_bodies.generate_body(
                tok,
                call,
                ids,
                lps,
                finish,
                prompt,
                matched,
                created=created,
                weight_versions=spans,
                routed_experts=None if routes is vllm_bodies.UNSET else routes,
            )
        if call.endpoint == "completions":
            pieces = self._pieces(call, ids, finish, matched)
            body = vllm_bodies.completion_body(tok, call, prompt, ids, lps, finish, pieces, created, matched, routes)
            if call.dialect == SGLANG_OPENAI:
                version, spans = version_spans(self.engine.weights, made or [], len(ids), faults)
                body = sglang_bodies.completion_body(body, len(prompt), len(ids), version, spans)
                if not queued:
                    body.update(self._sglext(greq, ids, faults))
            return body
        if call.dialect == SGLANG_OPENAI:
            return self._sglang_body(call, greq, ids, lps, finish, matched, cached, start, created, made or [], faults)
        parsed = vllm_chat(
            self._text(call, ids, finish, matched),
            thinking=call.thinking,
            tool_parsing=call.tool_parsing,
            seed=self._seed(greq),
            reasoning_parser=call.reasoning_parser,
            starts_in_reasoning=call.vllm.starts_in_reasoning,
        )
        if parsed.content is None and call.body.get("tool_choice") not in (None, "auto", "none"):
            parsed.content = ""  # forced tool calls: vLLM's message content is a string
        return vllm_bodies.chat_body(
            tok,
            call,
            prompt,
            ids,
            lps,
            finish,
            parsed,
            created,
            matched,
            sum(self._reasoning_at(call, greq, ids, finish)),
            routes,
        )

    def _pieces(self, call: OpenAICall, ids: list[int], finish: str, matched: Any) -> list[str]:
        """Completions' text, one piece per token, adding up to the text the engine shows (a stop trimmed)."""
        pieces = text_pieces(self.tokenizer, ids, call.skip_special_tokens)
        if finish != "stop":
            return pieces
        return clip_pieces(pieces, len(self._text(call, ids, finish, matched)))

    def _sglext(self, greq: GenerateRequest, ids: list[int], faults: FaultSpec) -> dict[str, Any]:
        """SGLang's OpenAI answers carry the routes at the root, `sglext.routed_experts` (0.5.23), when asked."""
        found = sglang_channels(self.engine.channels, greq, ids, faults, final=True).get("routed_experts")
        return {"sglext": {"routed_experts": found}} if found is not None else {}

    def _deltas(self, call: OpenAICall, greq: GenerateRequest, ids: list[int]) -> list[dict[str, Any]]:
        return vllm_chat_deltas(
            self.tokenizer,
            ids,
            tool_parsing=call.tool_parsing,
            seed=self._seed(greq),
            skip_special=call.skip_special_tokens,
            reasoning_keys=call.vllm.reasoning_keys,
            reasoning_parser=call.reasoning_parser,
            starts_in_reasoning=call.vllm.starts_in_reasoning and call.thinking,
        )

    def _reasoning_at(self, call: OpenAICall, greq: GenerateRequest, ids: list[int], finish: str) -> list[bool]:
        """Per output token: whether it went to the reasoning (the usage's `reasoning_tokens`)."""
        if call.endpoint != "chat" or not call.reasoning_parser:
            return [False] * len(ids)
        deltas = self._deltas(call, greq, ids)
        return [bool(d) and "reasoning" in d for d in deltas] + [False] * (len(ids) - len(deltas))

    def _sglang_finish(self, finish: str, matched: Any, ids: list[int]) -> dict[str, Any]:
        if finish == "stop":
            return finish_stop(matched if matched is not None else (ids[-1] if ids else None))
        return finish_length(len(ids)) if finish == "length" else finish_abort()

    def _sglang_body(
        self,
        call: OpenAICall,
        greq: GenerateRequest,
        ids: list[int],
        lps: list[float],
        finish: str,
        matched: Any,
        cached: int,
        start: float,
        created: int,
        made: list[str],
        faults: FaultSpec,
    ) -> dict[str, Any]:
        opts = self.engine.options
        fin = self._sglang_finish(finish, matched, ids)
        texts = [self.tokenizer.decode([t], skip_special_tokens=False) for t in ids]
        entries = logprob_entries(ids, lps, texts) if call.logprobs else None
        version, spans = version_spans(self.engine.weights, made, len(ids), faults)
        meta = meta_info(
            rid=call.rid,
            finish_reason=fin,
            prompt_tokens=len(greq.input_ids),
            n_output=len(ids),
            profile=get_profile(opts.version_profile),
            weight_version=version,
            logprobs=entries,
            cached_tokens=cached,
            e2e_latency=time.perf_counter() - start,
            sent_ts=time.time(),
            weight_versions=spans,
            channels=sglang_channels(self.engine.channels, greq, ids, faults, final=True),
        )
        parsed, _ = sglang_chat(
            self._text(call, ids, finish, matched), call.tools, tool_parsing=call.tool_parsing, seed=self._seed(greq)
        )
        body = sglang_bodies.chat_body(self.tokenizer, call, greq.input_ids, ids, lps, fin, parsed, meta, created)
        if not call.return_meta_info:  # with it, the routes are in the choice's meta_info instead
            body.update(self._sglext(greq, ids, faults))
        return body

    # ---- streams -----------------------------------------------------------------------------------
    async def _stream(
        self,
        request: web.Request,
        call: OpenAICall,
        greqs: list[GenerateRequest],
        tracked: Tracked,
        prepared: list[Prepared],
    ) -> web.StreamResponse:
        """One chunk per token at the fault's pace; an abort ends the stream with finish_reason `abort`, a cut
        closes the socket after N data events. `n > 1`: one choice per request and answer, their chunks
        interleaved one at a time (each carries its `index`), the usage counting all of them."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        created = int(time.time())
        many = len(prepared) > 1
        queues = [
            deque(self._chunks(call, g, p.ids, p.logprobs, p.finish, p.matched, created))
            for g, p in zip(greqs, prepared, strict=True)
        ]
        cut = prepared[0].faults.cut_stream_after
        sent = 0
        produced = [0] * len(prepared)
        aborted = False

        async def write(chunk: dict[str, Any], i: int = 0) -> None:
            nonlocal sent
            ids, faults = prepared[i].ids, prepared[i].faults
            chunk = self._with_channels(call, greqs[i], chunk, ids[: tracked.produced], tracked, faults)
            if many and chunk.get("choices"):
                chunk = {**chunk, "choices": [{**c, "index": i} for c in chunk["choices"]]}
            await resp.write(b"data: " + dumps(chunk) + b"\n\n")
            sent += 1
            if cut is not None and sent >= cut:
                drop(request)

        while not aborted and any(queues):
            for i, queue in enumerate(queues):
                if not queue:
                    continue
                n_tokens, chunk = queue.popleft()
                faults = prepared[i].faults
                if n_tokens:
                    if (
                        await self.engine.produce(tracked, n_tokens, faults.token_delay_ms, faults.pause_after)
                        < n_tokens
                        or tracked.aborted.is_set()
                    ):
                        for j in (j for j, q in enumerate(queues) if q or j == i):  # every unfinished choice
                            await write(self._abort_chunk(call, created), j)
                        aborted = True
                        break
                    produced[i] += n_tokens
                if chunk:  # an empty one: tokens decoded, nothing sent for them
                    await write(chunk, i)
        greq, first = greqs[0], prepared[0]
        sglext = (
            self._sglext(greq, first.ids, first.faults)
            if call.dialect == SGLANG_OPENAI and not aborted and not many
            else {}
        )
        if sglext:  # SGLang 0.5.23: a chunk of its own after the finish, `choices` empty
            await write(
                {
                    "id": call.rid,
                    "object": "chat.completion.chunk" if call.endpoint == "chat" else "text_completion",
                    "created": created,
                    "model": sglang_bodies.model_of(call),
                    "choices": [],
                    "usage": None,
                    **sglext,
                }
            )
        if call.include_usage:
            reasoned = sum(
                sum(self._reasoning_at(call, g, p.ids[:made], p.finish))
                for g, p, made in zip(greqs, prepared, produced, strict=True)
            )
            await write(self._usage_chunk(call, len(greq.input_ids), sum(produced), created, reasoned))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _chunks(
        self,
        call: OpenAICall,
        greq: GenerateRequest,
        ids: list[int],
        lps: list[float],
        finish: str,
        matched: Any,
        created: int,
    ) -> list[tuple[int, dict[str, Any]]]:
        """(tokens it carries, chunk) for the whole answer; the sender paces and may cut it."""
        tok, prompt, n = self.tokenizer, greq.input_ids, len(ids)
        out: list[tuple[int, dict[str, Any]]] = []
        if call.dialect == VLLM_GENERATE:
            for i in range(n):
                out.append(
                    (
                        1,
                        vllm_bodies.generate_body(
                            tok,
                            call,
                            ids[i : i + 1],
                            lps[i : i + 1],
                            finish if i == n - 1 else None,
                            prompt if i == 0 else None,
                            matched,
                            chunk=True,
                            total=i + 1,
                        ),
                    )
                )
            if not n:
                out.append((0, vllm_bodies.generate_body(tok, call, [], [], finish, prompt, matched, chunk=True)))
            return out
        if call.endpoint == "completions":
            pieces = self._pieces(call, ids, finish, matched)
            offset = 0
            for i in range(n):
                out.append(
                    (
                        1,
                        vllm_bodies.completion_chunk(
                            tok,
                            call,
                            ids[i : i + 1],
                            lps[i : i + 1],
                            pieces[i : i + 1],
                            offset,
                            created,
                            finish if i == n - 1 else None,
                            prompt if i == 0 else None,
                            matched,
                        ),
                    )
                )
                offset += len(pieces[i])
            if not n:
                out.append(
                    (0, vllm_bodies.completion_chunk(tok, call, [], [], [], 0, created, finish, prompt, matched))
                )
            if call.dialect == SGLANG_OPENAI:
                return out
            return vllm_bodies.with_stream_usage(call, out, len(prompt), [False] * n)
        sglang = call.dialect == SGLANG_OPENAI
        trim_id = finish == "stop" and not isinstance(matched, str) and not call.body.get("no_stop_trim")
        stream_ids = ids[:-1] if trim_id and ids and sglang else ids
        if sglang:
            deltas = vllm_chat_deltas(
                tok,
                stream_ids,
                tool_parsing=call.tool_parsing,
                seed=self._seed(greq),
                skip_special=call.skip_special_tokens,
                reasoning_keys=("reasoning_content",),
            )
        else:
            deltas = self._deltas(call, greq, stream_ids)
            if finish == "stop" and n and not isinstance(matched, str) and len(deltas) == n:
                deltas[-1] = {}  # a stop id's text is never sent (vLLM 0.32: its chunk's delta is empty)
        if finish == "stop" and isinstance(matched, str):  # the text stops where the engine cut it
            deltas = clip_deltas(deltas, len(self._text(call, ids, finish, matched)))
        deltas += [{}] * (n - len(deltas))
        called = any("tool_calls" in d for d in deltas)
        final = vllm_bodies.finish_reason(finish, called)
        if sglang:
            out.append((0, sglang_bodies.chat_chunk(tok, call, {"role": "assistant", "content": ""}, [], [], created)))
            for i in range(n):
                if deltas[i] or call.logprobs:
                    out.append(
                        (1, sglang_bodies.chat_chunk(tok, call, deltas[i], ids[i : i + 1], lps[i : i + 1], created))
                    )
                else:
                    out.append((1, {}))
            fin = self._sglang_finish(finish, matched, ids)
            out.append(
                (
                    0,
                    sglang_bodies.chat_chunk(
                        tok, call, {}, [], [], created, final, None if called else fin.get("matched")
                    ),
                )
            )
            return out
        out.append((0, vllm_bodies.chat_first_chunk(call, prompt, created)))
        for i in range(n):
            last = i == n - 1
            if not (deltas[i] or last or call.logprobs or call.return_token_ids):
                out.append((1, {}))  # vLLM sends nothing for a token the parser holds back
                continue
            out.append(
                (
                    1,
                    vllm_bodies.chat_chunk(
                        tok, call, deltas[i], ids[i : i + 1], lps[i : i + 1], created, final if last else None, matched
                    ),
                )
            )
        if not n:
            out.append((0, vllm_bodies.chat_chunk(tok, call, {}, [], [], created, finish, matched)))
        return vllm_bodies.with_stream_usage(call, out, len(prompt), self._reasoning_at(call, greq, ids, finish))

    def _with_channels(
        self,
        call: OpenAICall,
        greq: GenerateRequest,
        chunk: dict[str, Any],
        output: list[int],
        tracked: Tracked,
        faults: FaultSpec,
    ) -> dict[str, Any]:
        """vLLM's /inference/v1/generate stream: its last chunk's `weight_versions` are the versions the tokens were
        made under (known once they are made), and carries the routes of an engine started with them."""
        choices = chunk.get("choices") or []
        if call.dialect != VLLM_GENERATE or not choices or choices[0].get("weight_versions") is None:
            return chunk
        _, spans = version_spans(self.engine.weights, tracked.versions, tracked.produced, faults)
        choice = {**choices[0], "weight_versions": spans}
        if self.engine.channels.routes and "routed_experts" in choice:
            choice["routed_experts"] = vllm_routes(
                self.engine.channels,
                greq.input_ids,
                output,
                faults,
                choice.get("finish_reason"),
                call.routed_experts_prompt_start,
            )
        return {**chunk, "choices": [choice]}

    def _abort_chunk(self, call: OpenAICall, created: int) -> dict[str, Any]:
        tok = self.tokenizer
        if call.dialect == VLLM_GENERATE:
            return vllm_bodies.generate_body(tok, call, [], [], "abort")
        if call.endpoint == "completions":
            return vllm_bodies.completion_chunk(tok, call, [], [], [], 0, created, "abort", None)
        if call.dialect == SGLANG_OPENAI:
            return sglang_bodies.chat_chunk(tok, call, {}, [], [], created, "abort")
        return vllm_bodies.chat_chunk(tok, call, {}, [], [], created, "abort")

    def _usage_chunk(
        self, call: OpenAICall, prompt: int, completion: int, created: int, reasoned: int = 0
    ) -> dict[str, Any]:
        if call.dialect == SGLANG_OPENAI:
            return {
                "id": call.rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": sglang_bodies.model_of(call),
                "choices": [],
                "usage": sglang_bodies.usage(prompt, completion),
            }
        name = "text_completion" if call.endpoint == "completions" else "chat.completion.chunk"
        return vllm_bodies.usage_chunk(call, prompt, completion, created, name, reasoned)


def merge_choices(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer from the answers of its n choices: the first's envelope, every choice at its index, the usage
    counting every choice's tokens (the prompt once)."""
    merged = dict(bodies[0])
    merged["choices"] = [{**c, "index": i} for i, body in enumerate(bodies) for c in body.get("choices") or []]
    usage = merged.get("usage")
    if isinstance(usage, dict):
        completion = sum(int((b.get("usage") or {}).get("completion_tokens") or 0) for b in bodies)
        merged["usage"] = {
            **usage,
            "completion_tokens": completion,
            "total_tokens": usage["prompt_tokens"] + completion,
        }
    return merged


def forwarded_bearer(headers: Any) -> str | None:
    """The agent's own key, where a gateway forwards the agent's headers to the engine (rllm's does) and sends no
    routing key: a scenario's `match: {routing_key: <session id>}` then still finds the session, as the scripted
    client and tito's launchers give each session its id as its key."""
    auth = headers.get("Authorization", "")
    token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    return token or None
