"""Replay through a foreign target: a driver's gateway (started here) or a running gateway (`http://`).

The agent leg goes to the target over HTTP; the engine leg is a server on loopback (`--engine-listen`, or a free
port a driver's gateway is started with) that answers from the cassette. Its calls are attributed to the
exchange being replayed as the recording tap attributed them (`tito_rl.recorder.taps.attribution`): by the routing key,
then among that session's requests in flight by the call's prompt (`attribute`; a twin the recording gave to an
exchange not yet replayed is traded for, `_claim`); replay sends one session's requests in their recorded order and
holds each generation until its recorded end, so the order the target saw live is the order it sees again.
The checks are tito's: engine requests (first differing token, decoded), replies (the target's volatile fields
masked, everything else compared), and samples at each finish where both sides have them: a session never
finished live through a target that offers no samples (a gateway without a session API) is verified on its
replies and engine calls only; samples on one side only are a difference that says which side has what.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web

from tito_rl.cassette.answer_bytes import answer_bytes
from tito_rl.cassette.reader import Cassette
from tito_rl.recorder.taps.agent_tap import HOP_HEADERS, SSE, forwarded, split_events
from tito_rl.recorder.taps.around import samples_of, serve
from tito_rl.recorder.taps.attribution import header_value
from tito_rl.recorder.taps.recording import body_digest
from tito_rl.recorder.targets import gateway_pool
from tito_rl.recorder.targets.base import ROUTING_HEADER, TargetError, TargetFailure, TargetFinish, TargetOptions
from tito_rl.recorder.targets.registry import TargetSpec
from tito_rl.replayer.comparison.differences import Difference
from tito_rl.replayer.replay.agent_leg import REPLAY_HEADER, request_headers, request_target
from tito_rl.replayer.replay.engine_leg import CURRENT_EXCHANGE, CassetteTransport
from tito_rl.replayer.replay.harness import HarnessBase
from tito_rl.replayer.replay.loading import replay_choice
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.replayer.replay.plan import Drop, Finish, PlannedExchange, SessionPlan
from tito_rl.replayer.replay.results import FinishResult
from tito_rl.trajectory.adapters.engine.transport import EngineUnreachable
from tito_rl.trajectory.adapters.tap import AgentExchange
from tito_rl.trajectory.dialects.registry import is_generation, view_of
from tito_rl.trajectory.dialects.view import object_at
from tito_rl.trajectory.events import SessionStats
from tito_rl.trajectory.linearize import Span
from tito_rl.trajectory.manager import Linearization
from tito_rl.trajectory.records import Sample

ENGINE_BASE = "http://tito-replay-engine"
# An exchange the agent hung up on is answered (499) at once; the gateway notices and aborts its generation a
# moment later. Replay waits this long for such recorded calls before calling them missing.
LATE_CALLS_S = 5.0
Key = tuple[str, int]
_NOTED: set[tuple[str, str]] = set()  # (cassette, note) said once per process: a run borrows a gateway per cassette


def target_linearization(samples: list[dict[str, Any]], stats: Mapping[str, Any]) -> Linearization:
    """A foreign target's samples in the shape goldens and reports read: trained runs as spans (the target does
    not say which turn each came from), its own figures where its driver gives them."""
    built = [Sample.from_dict(s) for s in samples]
    spans: list[list[Span]] = []
    trained = masked = 0
    for sample in built:
        first, runs, start = sample.prompt_length, [], None
        for i, bit in enumerate([*sample.loss_mask, 0]):
            if bit and start is None:
                start = i
            elif not bit and start is not None:
                runs.append(Span(None, first + start, i - start, True))  # type: ignore[arg-type]
                start = None
        spans.append(runs)
        ones = sum(sample.loss_mask)
        trained, masked = trained + ones, masked + sample.response_length - ones
    forks = object_at(stats, "forks")
    summary = SessionStats(
        turns=int(stats.get("turns", 0) or 0),
        samples=len(built),
        forks=dict(sorted(forks.items())),
        realigns=int(stats.get("realigns", 0) or 0),
        merges=int(stats.get("merges", 0) or 0),
        masked_tokens=masked,
        trained_tokens=trained,
    )
    return Linearization(built, [], {}, summary, spans)


def _call_key(path: str, body: Any) -> Any:
    """What ties a replayed engine call to its recorded twin among requests in flight: the prompt ids where the
    call carries them, else its messages (a messages-in call); None for neither."""
    if not isinstance(body, dict):
        return None
    ids = view_of(None, path, body, None).prompt_ids
    if ids is not None:
        return ids
    messages = body.get("messages")
    return messages if isinstance(messages, list) and messages else None


class TargetHarness(HarnessBase):
    """The replay's side of a foreign target; `harness.Harness`'s counterpart for tito's own adapter."""

    late_calls_s = LATE_CALLS_S

    def __init__(
        self,
        cassette: Cassette,
        path: str,
        tokenizer: str | None,
        options: ReplayOptions,
        spec: TargetSpec,
        engine_listen: tuple[str, int] | None,
    ) -> None:
        super().__init__(cassette, path, tokenizer, options)
        self.spec = spec
        self.engine_listen = engine_listen or ("127.0.0.1", 0)
        recorded = cassette.header.target or {}
        self.transport = CassetteTransport(
            ENGINE_BASE, self.decode, self._message_start(), self.report, strict=options.strict
        )
        self.driver: Any = None
        self.routing_header = recorded.get("routing_header", ROUTING_HEADER) if recorded else ROUTING_HEADER
        self.volatile: tuple[str, ...] = tuple(recorded.get("volatile") or ())
        self.target_name = spec.text
        self.inflight: dict[Key, int] = {}  # exchanges sent and not yet answered -> send order
        self._sent = 0
        self._rids: dict[str, Key] = {}
        self._events: dict[Key, asyncio.Event] = {}
        self._replies: dict[Key, AgentExchange] = {}
        self._attempts: dict[str, dict[str, int]] = {}
        self._runners: list[web.AppRunner] = []
        self._pool: gateway_pool.GatewayPool | None = None
        self._lease: gateway_pool.Lease | None = None
        self.url = ""
        self.client: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> TargetHarness:
        try:
            if self.spec.kind == "http":
                from tito_rl.recorder.targets.http import HttpTarget

                runner, engine_url = await serve(self._engine_app(), *self.engine_listen)
                self._runners.append(runner)
                self.driver = HttpTarget(
                    self.spec.url,
                    self.volatile,
                    self.routing_header,
                    session_from=(self.cassette.header.target or {}).get("session_from") or "bearer",
                )
                self.url = (await self.driver.start(engine_url)).rstrip("/")
            else:
                await self._borrow()
        except TargetError:  # TargetUnavailable included: the caller tells the two apart
            await self._stop_servers()
            raise
        except Exception as exc:  # noqa: BLE001 - a gateway that cannot start: one line, exit 2
            await self._stop_servers()
            raise TargetError(f"target {self.spec.text!r} did not start: {type(exc).__name__}: {exc}") from None
        self.client = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
        )
        return self

    async def _borrow(self) -> None:
        """The driver's gateway: from the replay run's pool (`gateway_pool`: started once, kept between cassettes)
        where there is one and the engine leg's address is free to choose, else started for this harness alone."""
        from tito_rl.recorder.targets.registry import create_driver

        options = self._target_options()
        driver = create_driver(self.spec.text, options)
        self.volatile = tuple(dict.fromkeys((*driver.info.volatile, *self.volatile)))
        self.routing_header = driver.info.routing_header
        pool = gateway_pool.active()
        if pool is not None and self.engine_listen == ("127.0.0.1", 0):
            self._pool = pool
            self._lease = await pool.borrow(self.spec.text, options, driver, self.path, self._engine_call)
        else:
            self._lease = await gateway_pool.start_lease((), driver, *self.engine_listen)
            self._lease.holder = self._engine_call
        self.driver = self._lease.driver
        self.url = self._lease.url

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.close()
        lease, self._lease = self._lease, None
        if lease is not None and self._pool is not None:
            await self._pool.give_back(lease, quiet=exc[0] is None and not self.inflight)
        elif lease is not None:
            await lease.stop()
        elif self.driver is not None:
            with contextlib.suppress(Exception):
                await self.driver.stop()
        await self._stop_servers()

    async def _stop_servers(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    def _target_options(self) -> TargetOptions:
        header = self.cassette.header
        parsers = header.parsers or {}
        adapter = self.options.adapter
        manager = self.options.manager
        # the profile to run is the user's (or, trusted, the cassette's copy): never the header's by itself
        choice = replay_choice(header, self.options.target, self.path, self.options.trust_cassette)
        if choice.note is not None and (self.path, choice.note) not in _NOTED:
            _NOTED.add((self.path, choice.note))
            print(f"tito: note: {self.path}: {choice.note}", file=sys.stderr)
        return TargetOptions(
            extra={"profile": choice.profile} if choice.profile is not None else {},
            tokenizer_dir=self.tokenizer_dir,
            reasoning_parser=adapter.get("reasoning_parser", parsers.get("reasoning", "qwen3")),
            tool_parser=adapter.get("tool_parser", parsers.get("tool_call", "qwen25")),
            fork_threshold=manager.get(
                "fork_threshold_tokens", (header.adapter.get("manager") or {}).get("fork_threshold_tokens")
            ),
        )

    # ---- a session's run (see harness.SessionRun) ----

    def no_session(self, plan: SessionPlan) -> str | None:
        """An `anonymous` session that made no engine call, recorded around a gateway by a tito that made one of
        the requests naming no session (health checks, model lists): they are no session, and not replayed."""
        if plan.source == "anonymous" and not any(e.engine for e in plan.exchanges):
            return "requests that named no session (health checks, model lists): not a session"
        return None

    def unfinished(self, plan: SessionPlan) -> bool:
        return bool(plan.exchanges) and not isinstance(plan.steps[-1], Finish | Drop)

    async def send(self, plan: SessionPlan, exchange: PlannedExchange) -> None:
        assert self.client is not None
        record, key = exchange.record, (plan.name, exchange.index)
        headers = {
            k: v
            for k, v in request_headers(record, plan.source, plan.name, exchange.index).items()
            if k != REPLAY_HEADER
        }
        target = request_target(record, plan.source, plan.name)
        reply = AgentExchange(record.method, record.path, record.query, headers, record.body, 0, {})
        self._sent += 1
        self.inflight[key] = self._sent
        try:
            async with self.client.request(
                record.method, self.url + target, data=record.body or None, headers=forwarded(headers, HOP_HEADERS)
            ) as resp:
                reply.status = resp.status
                if resp.content_type == SSE:
                    received = bytearray()
                    try:
                        async for chunk in resp.content.iter_any():
                            received += chunk
                    finally:
                        reply.reply_events = split_events(received.decode("utf-8", errors="replace"))
                else:
                    reply.reply_body = await resp.read()
        except asyncio.CancelledError:
            reply.status = 499  # the agent hung up here live: the replay hangs up at the same point
            raise
        except aiohttp.ClientError as exc:
            reply.status, reply.reply_body = 502, f"the target did not answer: {exc}".encode()
        finally:
            self.inflight.pop(key, None)
            digest = body_digest(record.method, record.path, record.query, record.body) if record.body else None
            if digest is not None:
                attempts = self._attempts.setdefault(plan.name, {})
                reply.retry_of = attempts.get(digest)
                attempts[digest] = exchange.index
            self._replies[key] = reply
            self.answered(key).set()

    def forget(self, name: str) -> None:
        """Drop what was kept of a replayed session (see `harness.Harness.forget`)."""
        plan = self.plans.pop(name, None)
        self.results.pop(name, None)
        self._attempts.pop(name, None)
        for exchange in plan.exchanges if plan is not None else ():
            key = (name, exchange.index)
            self.transport.legs.pop(key, None)
            self._replies.pop(key, None)
            self._events.pop(key, None)
        self._rids = {rid: key for rid, key in self._rids.items() if key[0] != name}

    def answered(self, key: Key) -> asyncio.Event:
        return self._events.setdefault(key, asyncio.Event())

    def replayed(self, key: Key) -> AgentExchange:
        return self._replies[key]

    async def finish_session(self, name: str, reward: float) -> FinishResult | Difference | None:
        """The target's samples; None where it offers none (`SessionRun.finish` says whether the recording
        has some); its failure (a 500, a refused connection) is a difference of its own."""
        try:
            finished = await self.driver.finish(name, reward)
        except TargetFailure as exc:
            return Difference("error", f"the target's finish failed: {exc}")
        except Exception as exc:  # noqa: BLE001 - the target's own failure is what the replay reports
            return Difference("error", f"the target's finish failed: {type(exc).__name__}: {exc}")
        samples = samples_of(finished)
        if samples is None:
            return None
        stats = finished.stats if isinstance(finished, TargetFinish) else {}
        linearization = target_linearization(samples, stats)
        tree: dict[str, Any] = {
            "nodes": [],
            "target": self.target_name,
            "untrained_turns": stats.get("untrained_turns"),
        }
        return FinishResult(reward, None, samples, linearization, tree)

    async def drop_session(self, name: str) -> Difference | None:
        try:
            await self.driver.drop(name)
        except Exception as exc:  # noqa: BLE001
            return Difference("error", f"the target's drop failed: {type(exc).__name__}: {exc}")
        return None

    # ---- the engine leg ----

    def _engine_app(self) -> web.Application:
        app = web.Application(client_max_size=1024 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._engine_call)
        return app

    async def _engine_call(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        key = self.attribute(request.path, request.headers, data)
        if key is None:
            if is_generation(request.path):
                self._extra_generation(request.path, request.headers)
            return self._unattributed(request.path)
        token = CURRENT_EXCHANGE.set(key)
        try:
            if request.path.endswith("/generate") and isinstance(data, dict) and data.get("rid") is not None:
                self._rids[str(data["rid"])] = key
            answer = await self.transport.send(
                request.method,
                ENGINE_BASE + request.path_qs,
                data if isinstance(data, dict) else None,
                dict(request.headers),
            )
        except EngineUnreachable as exc:  # a recorded call with no HTTP answer, or a call the recording lacks
            return web.json_response({"error": {"message": f"tito: the engine did not answer: {exc.text}"}}, status=502)
        finally:
            CURRENT_EXCHANGE.reset(token)
        recorded = answer_bytes(answer.wire, answer.body)
        if recorded is not None:  # the engine's own bytes: a target passing them on sends what it sent live
            content_type = (answer.wire or {}).get("content_type")
            headers = {"Content-Type": content_type} if content_type else None
            return web.Response(status=answer.status, body=recorded, headers=headers)
        # Re-encoded: a recording that kept no bytes (before they were kept), or a call answered in another dialect.
        if isinstance(data, dict) and data.get("stream") and answer.status == 200:
            # An OpenAI-style stream was recorded chunk by chunk; SGLang's /generate as its last, cumulative chunk.
            chunks = answer.body if isinstance(answer.body, list) else [answer.body]
            text = "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            return web.Response(status=200, text=text, content_type=SSE)
        if isinstance(answer.body, dict | list):
            return web.json_response(answer.body, status=answer.status)
        return web.Response(status=answer.status, text="" if answer.body is None else str(answer.body))

    def attribute(self, path: str, headers: Mapping[str, str], body: Any) -> Key | None:
        """The replayed exchange an engine call serves: the recording's rule (`tito_rl.recorder.taps.attribution`)."""
        if path.endswith("/abort_request") and isinstance(body, dict) and str(body.get("rid")) in self._rids:
            return self._rids[str(body.get("rid"))]
        session = self._routed_session(headers)
        candidates = [
            k
            for k in sorted(self.inflight, key=self.inflight.__getitem__)
            if (session is None or k[0] == session) and self._expects(k, request_path=path)
        ]
        if not candidates:
            return None
        wanted = _call_key(path, body)
        for key in candidates:
            leg = self.transport.legs.get(key)
            nxt = next((r for r in leg.unserved if r.path == path), None) if leg else None
            if nxt is not None and wanted is not None and _call_key(path, nxt.request) == wanted:
                return key
        if wanted is not None and is_generation(path):
            self._claim(candidates[0], path, wanted)
        return candidates[0]

    def _claim(self, key: Key, path: str, wanted: Any) -> None:
        """A generation whose recorded twin the recording gave to another exchange of the session, one not in
        flight (a recorder that attributed a session's concurrent calls by their order, which a gateway's threads
        may swap): the two exchanges trade those recorded calls, so each is served the answer to its own prompt."""
        leg = self.transport.legs.get(key)
        mine = next((i for i, r in enumerate(leg.unserved) if r.path == path), None) if leg else None
        if leg is None or mine is None:
            return
        for other_key, other in self.transport.legs.items():
            if other_key[0] != key[0] or other_key == key or other_key in self.inflight or other.arrived.is_set():
                continue
            theirs = next(
                (i for i, r in enumerate(other.unserved) if r.path == path and _call_key(path, r.request) == wanted),
                None,
            )
            if theirs is not None:
                leg.unserved[mine], other.unserved[theirs] = other.unserved[theirs], leg.unserved[mine]
                return

    def _extra_generation(self, path: str, headers: Mapping[str, str]) -> None:
        """A generation the recording has none left to answer with (a target that generates where the recorded one
        did not, e.g. again for a client's re-send the recorded target answered from its first reply): a difference
        of the exchange in flight, so a report can tell the reply that follows from the target's own doing."""
        session = self._routed_session(headers)
        flights = [k for k in sorted(self.inflight, key=self.inflight.__getitem__) if session in (None, k[0])]
        if not flights:
            return
        key = flights[0]
        leg = self.transport.legs.get(key)
        self.report(
            key[0],
            Difference(
                "engine-calls",
                f"the target called POST {path}, which the recording has no (further) call of for this exchange",
                key[1],
                leg.planned.turn if leg else None,
                [
                    f"recorded calls: {', '.join(f'{r.method} {r.path}' for r in leg.planned.engine) or 'none'}"
                    if leg
                    else "recorded calls: unknown"
                ],
            ),
        )

    def _routed_session(self, headers: Mapping[str, str]) -> str | None:
        return header_value(headers, self.routing_header) if self.routing_header else None

    def _expects(self, key: Key, request_path: str) -> bool:
        leg = self.transport.legs.get(key)
        return leg is not None and any(r.path == request_path for r in leg.unserved)

    def _unattributed(self, path: str) -> web.Response:
        """Calls of no session: health checks answer, model info comes from the header, the rest is absent."""
        if path in ("/health", "/health_generate") or path.endswith("/health"):  # rllm's gateway: {worker}/health
            return web.Response(status=200)
        engine = self.cassette.header.engine or {}
        if path in ("/model_info", "/get_model_info"):
            return web.json_response(engine)
        return web.json_response(
            {"error": {"message": f"replay: no recorded engine call answers {path} here"}}, status=404
        )
