"""`replay_cassette`: a cassette's sessions through the real adapter app and manager, verified as they go.

In-process and offline: the adapter app is built with the settings, parsers and tokenizer the cassette's
header names (another tokenizer is refused), serves on a private Unix socket, and its engine leg is the
cassette (`engine_leg`). Each session's agent exchanges are re-sent in the order the live run answered
them (`plan`), its session-API finishes and drops at their places. Verification is not optional: engine
requests, replies, samples at every finish, each against the recording; a session stops at its first
difference. `strict=False` (for `--update-goldens`) keeps going past differences and only notes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints
from urllib.parse import quote

import aiohttp
import msgspec
from aiohttp import web

from recorder.cassette.format import CassetteError, Header, TokenizerMismatchError
from replayer.agent_leg import ReplayTap, exchange_context, request_headers, request_target
from replayer.differences import Difference, reply_difference, samples_difference, short, turn_locator
from replayer.engine_leg import CURRENT_EXCHANGE, CassetteTransport
from replayer.plan import Drop, End, Finish, PlannedExchange, SessionPlan, Start, plan_session
from replayer.reader import Cassette, check_tokenizer, read_cassette
from replayer.results import CassetteResult, FinishResult, SessionResult
from trajectory.adapters.app import AdapterSettings, create_app
from trajectory.manager import Linearization, TrajectoryManager
from trajectory.tokenizer import fingerprint, load_tokenizer

STEP_TIMEOUT_S = 60.0  # a step that takes this long is a hang: reported as a difference, never waited out
LOCAL_SETTINGS = frozenset({"client_session_factory", "rid_factory", "clock", "disconnect_poll_s"})
_CREATED = re.compile(rb'"created(?:_at)?":\s*(\d+)')


class ReplayInputError(Exception):
    """The input cannot be replayed at all (corrupt cassette, other tokenizer, unknown session): exit 2."""


@dataclass
class ReplayOptions:
    strict: bool = True  # stop each session at its first difference; False: note differences and go on
    tokenizer: str | None = None  # tokenizer folder; default: the header's, else the embedded Qwen3 one
    adapter: dict[str, Any] = field(default_factory=dict)  # AdapterSettings fields over the header's
    manager: dict[str, Any] = field(default_factory=dict)  # TrajectoryManager settings over the header's
    jobs: int = 1  # sessions replayed at once
    on_total: Callable[[int], None] | None = None  # progress: the agent exchanges about to be replayed
    on_exchange: Callable[[], None] | None = None  # progress: called once per replayed agent exchange


@dataclass
class Finished:
    reward: float
    linearization: Linearization
    tree: dict[str, Any]


class CapturingManager(TrajectoryManager):
    """The real manager; a finish also keeps its linearization and tree, which goldens render."""

    def __init__(self, **settings: Any) -> None:
        super().__init__(**settings)
        self.captured: dict[str, list[Finished]] = {}

    def finish(self, session_id: str, reward: float) -> list[Any]:
        result = self.linearize(session_id, reward)
        tree = self.export_tree(session_id, result) if session_id in self.sessions() else {"nodes": []}
        self.captured.setdefault(session_id, []).append(Finished(reward, result, tree))
        self.drop(session_id)
        return result.samples


def load_cassette(path: str | os.PathLike[str], tokenizer: str | None = None) -> tuple[Cassette, str | None]:
    """The cassette and the tokenizer folder to replay it with; `ReplayInputError` when it cannot be."""
    try:
        cassette = read_cassette(path)
    except FileNotFoundError:
        raise ReplayInputError(f"{path}: no such cassette") from None
    except (CassetteError, OSError) as exc:
        raise ReplayInputError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
    problem = settings_problem(cassette.header)
    if problem:
        raise ReplayInputError(f"{path}: header {problem}")
    folder = tokenizer or cassette.header.adapter.get("tokenizer_dir")
    if folder and not Path(folder).is_dir():
        raise ReplayInputError(f"{path}: recorded with the tokenizer in {folder}, which is not on this machine; "
                               "pass --tokenizer DIR")
    try:
        check_tokenizer(cassette.header, fingerprint(folder), path)
    except TokenizerMismatchError as exc:
        raise ReplayInputError(str(exc)) from None
    except FileNotFoundError as exc:
        raise ReplayInputError(f"{path}: {exc}") from None
    return cassette, folder


def settings_problem(header: Header) -> str | None:
    """What is wrong with the settings a header gives the adapter and the manager (a cassette can come from a
    pull request): a value of another type than the setting's, or a manager setting that does not exist."""
    adapter_types = get_type_hints(AdapterSettings)
    manager_types = {k: v for k, v in get_type_hints(TrajectoryManager.__init__).items() if k != "return"}
    manager = header.adapter.get("manager", {})
    if not isinstance(manager, dict):
        return f"adapter.manager: expected a map, got {type(manager).__name__}"
    checks = [(f"adapter.{k}", v, adapter_types[k]) for k, v in header.adapter.items()
              if k in adapter_types and k not in LOCAL_SETTINGS]
    for key, value in manager.items():
        if key not in manager_types:
            return f"adapter.manager.{key}: not a setting of this tito's manager"
        checks.append((f"adapter.manager.{key}", value, manager_types[key]))
    checks += [(f"parsers.{k}", header.parsers[k], str | None) for k in ("tool_call", "reasoning")
               if k in header.parsers]
    for where, value, hint in checks:
        try:
            msgspec.convert(value, hint)
        except msgspec.ValidationError as exc:
            return f"{where}: {exc}"
    try:
        TrajectoryManager(**manager)
    except ValueError as exc:
        return f"adapter.manager: {exc}"
    return None


def adapter_settings(header: Header, tokenizer: str | None, overrides: dict[str, Any]) -> AdapterSettings:
    known = {f.name for f in fields(AdapterSettings)} - LOCAL_SETTINGS
    values = {k: v for k, v in header.adapter.items() if k in known}
    if "tool_call" in header.parsers:
        values["tool_parser"] = header.parsers["tool_call"]
    if "reasoning" in header.parsers:
        values["reasoning_parser"] = header.parsers["reasoning"]
    values.update(overrides)
    values["tokenizer_dir"] = tokenizer
    return AdapterSettings(**values, disconnect_poll_s=0.002)


class Harness:
    """One adapter app for a cassette, served on a private Unix socket, with the cassette as its engine."""

    def __init__(self, cassette: Cassette, path: str, tokenizer: str | None, options: ReplayOptions) -> None:
        self.cassette, self.path, self.options = cassette, path, options
        self.settings = adapter_settings(cassette.header, tokenizer, options.adapter)
        self.settings.clock = self._created
        self.manager = CapturingManager(**{**(cassette.header.adapter.get("manager") or {}), **options.manager})
        self.tap = ReplayTap()
        self.tokenizer = load_tokenizer(tokenizer)
        self.transport = CassetteTransport(self.settings.engine_url, self.decode, self._message_start(),
                                           self.report, strict=options.strict)
        self.results: dict[str, SessionResult] = {}
        self.plans: dict[str, SessionPlan] = {}
        self._dir = ""
        self._runner: web.AppRunner | None = None
        self.client: aiohttp.ClientSession | None = None

    def _message_start(self) -> int | None:
        """The id that opens each rendered message (ChatML's `<|im_start|>`), to name the message a token is in."""
        token_id = self.tokenizer.convert_tokens_to_ids("<|im_start|>")
        return token_id if isinstance(token_id, int) and token_id != self.tokenizer.unk_token_id else None

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def report(self, session: str, difference: Difference) -> None:
        """A difference from the recording: a failure that stops the session, or (not strict) a note."""
        result = self.results[session]
        (result.differences if self.options.strict else result.accepted).append(difference)

    def _created(self) -> float:
        """The adapter's clock (only `created` fields read it): the recorded reply's value, never wall time."""
        key = CURRENT_EXCHANGE.get()
        plan = self.plans.get(key[0]) if key else None
        if plan is None or key is None or key[1] >= len(plan.exchanges):
            return 0.0
        record = plan.exchanges[key[1]].record
        first = record.reply_events[0].encode() if record.reply_events else record.reply_body or b""
        found = _CREATED.search(first)  # a JSON reply, or the first SSE event (the response shell)
        return float(found.group(1)) if found else 0.0

    async def __aenter__(self) -> Harness:
        try:
            app = create_app(self.settings, self.manager, self.tap, self.transport)
        except ValueError as exc:  # an unknown parser name, a template the tokenizer rejects
            raise ReplayInputError(f"{self.path}: {exc}") from None
        app.middlewares.append(exchange_context)
        self._dir = tempfile.mkdtemp(prefix="tito-replay-")
        socket_path = os.path.join(self._dir, "adapter.sock")
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, socket_path).start()
        self.client = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path, force_close=True),
                                            timeout=aiohttp.ClientTimeout(total=None))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.client is not None:
            await self.client.close()
        if self._runner is not None:
            await self._runner.cleanup()
        shutil.rmtree(self._dir, ignore_errors=True)

    # ---- one session ----

    async def replay_session(self, plan: SessionPlan) -> SessionResult:
        result = self.results[plan.name] = SessionResult(self.path, plan.name)
        result.live_samples = [s for record in plan.finishes for s in record.samples]
        self.plans[plan.name] = plan
        if plan.engine_only:
            result.skipped = f"engine leg only: {plan.unanswered_engine_calls} engine call(s), no agent exchange"
            return result
        if plan.unanswered_engine_calls:
            result.notes.append(f"{plan.unanswered_engine_calls} engine call(s) after the last agent exchange "
                                "(cut short by the recorder's end) are not replayed")
        runner = _SessionRun(self, plan, result)
        try:
            await runner.run()
        finally:
            await runner.stop()
        if not result.differences and plan.name in self.manager.sessions():
            await runner.finish(0.0, None)  # never finished live: linearized with reward 0
        return result

    async def request(self, method: str, target: str, **kwargs: Any) -> tuple[int, bytes]:
        assert self.client is not None
        async with self.client.request(method, "http://tito-replay" + target, **kwargs) as resp:
            return resp.status, await resp.read()


class _SessionRun:
    """Carries out one session's plan; see `plan` for the order and `engine_leg` for the holds."""

    def __init__(self, harness: Harness, plan: SessionPlan, result: SessionResult) -> None:
        self.h, self.plan, self.result = harness, plan, result
        self.legs = {e.index: harness.transport.add(plan.name, e) for e in plan.exchanges}
        self.clients: dict[int, asyncio.Task[Any]] = {}

    def found(self, difference: Difference) -> None:
        self.h.report(self.plan.name, difference)

    @property
    def stopped(self) -> bool:
        return bool(self.result.differences)

    async def run(self) -> None:
        for step in self.plan.steps:
            if self.stopped:
                return
            if isinstance(step, Start):
                await self.start(step.exchange)
            elif isinstance(step, End):
                await self.end(step.exchange)
            elif isinstance(step, Finish):
                await self.finish(step.record.reward, step.record.samples)
            elif isinstance(step, Drop):
                await self.drop()

    async def start(self, exchange: PlannedExchange) -> None:
        """Send the request; wait until it reaches the engine or is answered without it."""
        record = exchange.record
        headers = request_headers(record, self.plan.source, self.plan.name, exchange.index)
        target = request_target(record, self.plan.source, self.plan.name)
        self.clients[exchange.index] = task = asyncio.ensure_future(self.h.request(
            record.method, target, data=record.body or None, headers=headers))
        leg = self.legs[exchange.index]
        waits = {asyncio.ensure_future(leg.arrived.wait()),
                 asyncio.ensure_future(self.h.tap.event((self.plan.name, exchange.index)).wait())}
        try:
            done, _ = await asyncio.wait({task, *waits}, timeout=STEP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if not done:
            self.stall(exchange, "reach the engine or be answered")
        elif task in done and task.exception() is not None:
            self.found(Difference(
                "error", f"the request could not be sent: {task.exception()}", exchange.index, exchange.turn))

    async def end(self, exchange: PlannedExchange) -> None:
        leg = self.legs[exchange.index]
        key = (self.plan.name, exchange.index)
        answered = self.h.tap.event(key)
        client = self.clients[exchange.index]
        if exchange.record.status == 499 and leg.arrived.is_set() and not answered.is_set():
            client.cancel()  # the agent hangs up mid-generation: the adapter aborts the engine
        else:
            leg.release.set()
        try:
            await asyncio.wait_for(answered.wait(), STEP_TIMEOUT_S)
        except TimeoutError:
            self.stall(exchange, "be answered")
            return
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await client
        self.result.exchanges += 1
        if self.h.options.on_exchange is not None:
            self.h.options.on_exchange()
        difference = exchange_difference(exchange, self.h.tap.exchanges[key])
        if difference is None and leg.unserved:
            missing = ", ".join(f"{r.method} {r.path}" for r in leg.unserved)
            difference = Difference("engine-calls", f"the replay did not make the recorded engine call(s): {missing}",
                                    exchange.index, exchange.turn)
        if difference is not None:
            self.found(difference)
            return
        event = wire_event(exchange)
        if event is not None:
            self.result.wire_events.append(event)

    async def finish(self, reward: float, live: list[dict[str, Any]] | None) -> None:
        name = self.plan.name
        status, body = await self.h.request("POST", f"/tito/sessions/{quote(name, safe='')}/finish",
                                            json={"reward": reward})
        if status != 200:
            self.found(Difference(
                "samples", f"finish answered {status}: {short(body.decode(errors='replace'))}"))
            return
        captured = self.h.manager.captured[name][-1]
        _, samples = self.h.tap.finished[name][-1]
        self.result.finishes.append(FinishResult(reward, live, samples, captured.linearization, captured.tree))
        if live is None:
            return
        found = samples_difference(live, samples, self.h.decode, turn_locator(captured.linearization.spans),
                                   ("live", "replayed"))
        if found is not None:
            summary, detail, turn = found
            decisions = [e for e in captured.linearization.events if e.kind in ("fork", "realign", "merge")]
            if decisions:  # what the replay's manager decided: usually why the samples changed
                detail.append("the replay decided: " + "; ".join(e.describe() for e in decisions[:4]))
                turn = decisions[0].turn if turn is None else turn
            self.found(Difference("samples", f"samples differ at finish {len(self.result.finishes)}: {summary}",
                                  turn=turn, detail=detail))

    async def drop(self) -> None:
        status, body = await self.h.request("DELETE", f"/tito/sessions/{quote(self.plan.name, safe='')}")
        self.result.drops += 1
        if status != 200:
            self.found(Difference("error", f"drop answered {status}: {short(body.decode())}"))

    def stall(self, exchange: PlannedExchange, what: str) -> None:
        self.found(Difference(
            "stall", f"the request did not {what} within {STEP_TIMEOUT_S:g} s", exchange.index, exchange.turn))

    async def stop(self) -> None:
        """Let every held generation go and every request end, so nothing outlives the session's replay."""
        for leg in self.legs.values():
            if not self.h.tap.event((self.plan.name, leg.planned.index)).is_set():
                leg.stopped = True
            leg.release.set()
        pending = [t for t in self.clients.values() if not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def exchange_difference(exchange: PlannedExchange, replayed: Any) -> Difference | None:
    """The first way the adapter's answer differs from the recorded one: status, reply bytes, then flags."""
    recorded = exchange.record
    if recorded.status != replayed.status:
        detail = [f"recorded: {short(_reply_text(recorded.reply_body, recorded.reply_events))}",
                  f"replayed: {short(_reply_text(replayed.reply_body, replayed.reply_events))}"]
        return Difference("reply", f"reply status: recorded {recorded.status}, replayed {replayed.status}",
                          exchange.index, exchange.turn, detail)
    lines = reply_difference(recorded.reply_body, recorded.reply_events, replayed.reply_body, replayed.reply_events)
    if lines is not None:
        return Difference("reply", "reply to the agent differs", exchange.index, exchange.turn, lines)
    for name, label in (("turn_index", "turn index"), ("side", "side request"), ("retry_of", "retry of")):
        a, b = getattr(recorded, name), getattr(replayed, name)
        if a != b:
            return Difference("reply", f"{label}: recorded {a!r}, replayed {b!r}", exchange.index, exchange.turn)
    return None


def wire_event(exchange: PlannedExchange) -> str | None:
    """What an exchange did that the tree can not show (a failure, a retry, an abort), as the golden's line;
    None for a plain answer. Read from the recording, which a clean replay has just reproduced."""
    record = exchange.record
    generates = [c for c in exchange.engine if c.path.endswith("/generate")]
    failed = [f"engine /generate {c.status or 'no answer'}" for c in generates if c.status != 200]
    aborts = sum(c.path.endswith("/abort_request") for c in exchange.engine)
    parts: list[str] = []
    if record.retry_of is not None:
        parts.append(f"retry of #{record.retry_of} (identical body): " + (
            "generated again" if generates else "answered from the first reply, no engine call"))
    if record.status == 499:
        parts.append("client gone mid-generation")
    elif record.status != 200:
        parts.append(f"answered {record.status}")
    parts += failed
    if aborts:
        parts.append("engine request aborted" + (f" ({aborts} /abort_request calls)" if aborts > 1 else ""))
    if not parts:
        return None
    method = "" if record.method == "POST" else f" {record.method} {record.path}"
    turn = f" -> turn {record.turn_index}" if record.turn_index is not None else ", no turn"
    return f"#{exchange.index}{method} " + ", ".join(parts) + turn


def _reply_text(body: bytes | None, events: list[str] | None) -> str:
    if events is not None:
        return "".join(events)
    return (body or b"").decode("utf-8", errors="replace")


# ---- cassettes ----


def select_sessions(cassette: Cassette, path: str, names: Iterable[str] | None,
                    missing_ok: bool = False) -> list[str]:
    """The sessions to replay, in cassette order; `missing_ok` skips names this cassette lacks."""
    available = list(cassette.sessions)
    if names is None:
        return available
    wanted = set(names)
    unknown = sorted(wanted - set(available))
    if unknown and not missing_ok:
        raise ReplayInputError(f"{path}: no session {', '.join(map(repr, unknown))}; it has "
                               f"{', '.join(available) or 'none'}")
    return [n for n in available if n in wanted]


async def replay_cassette_async(path: str | os.PathLike[str], sessions: Iterable[str] | None = None,
                                options: ReplayOptions | None = None, missing_ok: bool = False) -> CassetteResult:
    options = options or ReplayOptions()
    cassette, tokenizer = load_cassette(path, options.tokenizer)
    return await replay_loaded(cassette, str(path), tokenizer, sessions, options, missing_ok)


async def replay_loaded(cassette: Cassette, path: str, tokenizer: str | None, sessions: Iterable[str] | None,
                        options: ReplayOptions, missing_ok: bool = False) -> CassetteResult:
    """Replay a cassette already read by `load_cassette` (which checked its tokenizer)."""
    names = select_sessions(cassette, path, sessions, missing_ok)
    plans = [plan_session(cassette.sessions[n]) for n in names]
    done = CassetteResult(path, cassette.header, [], cassette.truncated, all_sessions=list(cassette.sessions),
                          tokenizer_dir=tokenizer)
    if not plans:
        return done
    if options.on_total is not None:
        options.on_total(sum(len(p.exchanges) for p in plans))
    async with Harness(cassette, path, tokenizer, options) as harness:
        gate = asyncio.Semaphore(max(1, options.jobs))

        async def one(plan: SessionPlan) -> SessionResult:
            async with gate:
                return await harness.replay_session(plan)

        done.sessions = list(await asyncio.gather(*(one(p) for p in plans)))
    return done


def replay_cassette(path: str | os.PathLike[str], sessions: Iterable[str] | None = None,
                    options: ReplayOptions | None = None) -> CassetteResult:
    """Replay and verify; sessions in cassette order (or as named). Raises `ReplayInputError`."""
    return run_sync(replay_cassette_async(path, sessions, options))


def run_sync(replaying: Awaitable[CassetteResult]) -> CassetteResult:
    """`asyncio.run`, without handing it the result: on its way out, CPython 3.11's runner asks for the
    SIGINT handler, whose repr holds the main task and so the repr of its result. For a long session's
    result (150k-token samples) that cost a third of a second."""
    box: list[CassetteResult] = []

    async def main() -> None:
        box.append(await replaying)

    asyncio.run(main())
    return box[0]
