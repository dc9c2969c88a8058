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
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar, get_type_hints
from urllib.parse import quote

import aiohttp
import msgspec
from aiohttp import web

from recorder.cassette.format import ABSENT_ADAPTER_SETTINGS, CassetteError, Header, TokenizerMismatchError
from recorder.targets.base import TargetError, TargetUnavailable
from recorder.targets.registry import TITO, TargetSpec, parse_target
from replayer.agent_leg import ReplayTap, exchange_context, request_headers, request_target
from replayer.differences import Difference, reply_difference, samples_difference, short, turn_locator
from replayer.engine_leg import CURRENT_EXCHANGE, CassetteTransport
from replayer.plan import Drop, End, Finish, PlannedExchange, SessionPlan, Start, plan_session
from replayer.reader import Cassette, SessionLog, check_tokenizer, exchange_count, open_cassette
from replayer.results import CassetteResult, FinishResult, SessionResult
from trajectory.adapters import parser_process
from trajectory.adapters.app import ADAPTER_KEY, AdapterSettings, create_app
from trajectory.manager import Linearization, TrajectoryManager
from trajectory.tokenizer import fingerprint, load_tokenizer

STEP_TIMEOUT_S = 60.0  # a step that takes this long is a hang: reported as a difference, never waited out
LOCAL_SETTINGS = frozenset({"client_session_factory", "rid_factory", "clock", "disconnect_poll_s"})
_CREATED = re.compile(rb'"created(?:_at)?":\s*(\d+)')
T = TypeVar("T")


class ReplayInputError(Exception):
    """The input cannot be replayed at all (corrupt cassette, other tokenizer, unknown session): exit 2."""


class TargetUnavailableError(ReplayInputError):
    """The target to replay through is not installed here (a slime cassette where slime is not): tests skip."""


@dataclass
class ReplayOptions:
    strict: bool = True  # stop each session at its first difference; False: note differences and go on
    tokenizer: str | None = None  # tokenizer folder; default: the header's, else the embedded Qwen3 one
    adapter: dict[str, Any] = field(default_factory=dict)  # AdapterSettings fields over the header's
    manager: dict[str, Any] = field(default_factory=dict)  # TrajectoryManager settings over the header's
    jobs: int = 1  # sessions replayed at once (in this process: `tito replay -j` runs processes)
    on_total: Callable[[int], None] | None = None  # progress: the agent exchanges about to be replayed
    on_exchange: Callable[[], None] | None = None  # progress: called once per replayed agent exchange
    target: str | None = None  # the system to replay through (`--target`); None: the one the header names
    engine_listen: str | None = None  # HOST:PORT of the engine leg, for a foreign target (an http:// one needs it)
    on_plan: Callable[[SessionPlan], None] | None = None  # each session's plan as its replay starts (inspect reads
    # its rows there, so a session is read from the file once)


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


def load_cassette(path: str | os.PathLike[str], tokenizer: str | None = None,
                  verify: bool = True) -> tuple[Cassette, str | None]:
    """The cassette (its sessions read from the file as they are replayed) and the tokenizer folder to replay it
    with; `ReplayInputError` when it cannot be. `verify`: every frame checked first (`open_cassette`). Recorded
    prompts are read packed: replay counts, compares and slices them, and a long session's are most of its reading."""
    try:
        cassette = open_cassette(path, verify, packed_prompts=True)
    except FileNotFoundError:
        raise ReplayInputError(f"{path}: no such cassette") from None
    except (CassetteError, OSError) as exc:
        raise unreadable(path, exc) from None
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


def unreadable(path: str | os.PathLike[str], exc: Exception) -> ReplayInputError:
    return ReplayInputError(str(exc) if str(path) in str(exc) else f"{path}: {exc}")


def read_session(cassette: Cassette, path: str, name: str) -> SessionLog:
    """A session's records, read from the file now; `ReplayInputError` for a damaged one."""
    try:
        return cassette.sessions[name]
    except (CassetteError, OSError) as exc:
        raise unreadable(path, exc) from None


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
    values = {**ABSENT_ADAPTER_SETTINGS, **{k: v for k, v in header.adapter.items() if k in known}}
    if "tool_call" in header.parsers:
        values["tool_parser"] = header.parsers["tool_call"]
    if "reasoning" in header.parsers:
        values["reasoning_parser"] = header.parsers["reasoning"]
    values.update(overrides)
    values["tokenizer_dir"] = tokenizer
    return AdapterSettings(**values, disconnect_poll_s=0.002)


class HarnessBase:
    """What every target's replay shares: the cassette, the tokenizer, the results, a session's run. A harness
    answers what a run asks (`send`, `answered`, `replayed`, `finish_session`, `drop_session`, `unfinished`,
    `volatile`, `transport`): `Harness` for tito's own adapter, `target_replay.TargetHarness` for any other."""

    volatile: tuple[str, ...] = ()  # reply fields compared only for being there
    same_adapter = False  # the recording and the replay are both tito's adapter: its turn flags compare too
    late_calls_s = 0.0  # how long an answered exchange waits for its recorded engine calls still to come

    def __init__(self, cassette: Cassette, path: str, tokenizer: str | None, options: ReplayOptions) -> None:
        self.cassette, self.path, self.options = cassette, path, options
        # through another target than the recorded one (a conformance run): replies compared by what they mean
        self.cross_target = replay_target(cassette.header, options.target, path).text != recorded_target(
            cassette.header)
        self.tokenizer_dir = tokenizer
        self.tokenizer = load_tokenizer(tokenizer)
        self.results: dict[str, SessionResult] = {}
        self.plans: dict[str, SessionPlan] = {}

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
        if not result.differences and self.unfinished(plan):
            await runner.finish(0.0, None)  # never finished live: linearized with reward 0
        return result

    def unfinished(self, plan: SessionPlan) -> bool:
        raise NotImplementedError


class Harness(HarnessBase):
    """One adapter app for a cassette, served on a private Unix socket, with the cassette as its engine."""

    def __init__(self, cassette: Cassette, path: str, tokenizer: str | None, options: ReplayOptions) -> None:
        super().__init__(cassette, path, tokenizer, options)
        self.settings = adapter_settings(cassette.header, tokenizer, options.adapter)
        self.settings.clock = self._created
        self.manager = CapturingManager(**{**(cassette.header.adapter.get("manager") or {}), **options.manager})
        self.tap = ReplayTap()
        self.transport = CassetteTransport(self.settings.engine_url, self.decode, self._message_start(),
                                           self.report, strict=options.strict)
        self.adapter: Any = None
        self._dir = ""
        self._runner: web.AppRunner | None = None
        self.client: aiohttp.ClientSession | None = None
        self.same_adapter = not (cassette.header.target and cassette.header.target.get("kind", TITO) != TITO)

    def unfinished(self, plan: SessionPlan) -> bool:
        return plan.name in self.manager.sessions()

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
            app = create_app(self.settings, self.manager, self.tap, self.transport, warm=False)
        except ValueError as exc:  # an unknown parser name, a template the tokenizer rejects
            raise ReplayInputError(f"{self.path}: {exc}") from None
        self.adapter = app[ADAPTER_KEY]
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

    def forget(self, name: str) -> None:
        """Drop everything kept of a replayed session (its records, replies, samples, the adapter's and the
        manager's state), so that replaying many sessions holds only those in flight."""
        plan = self.plans.pop(name, None)
        self.results.pop(name, None)
        self.manager.captured.pop(name, None)
        self.manager.drop(name)
        self.adapter.sessions.pop(name, None)
        self.tap.forget(name)
        for exchange in plan.exchanges if plan is not None else ():
            self.transport.legs.pop((name, exchange.index), None)

    async def request(self, method: str, target: str, **kwargs: Any) -> tuple[int, bytes]:
        assert self.client is not None
        async with self.client.request(method, "http://tito-replay" + target, **kwargs) as resp:
            return resp.status, await resp.read()

    # ---- what a session's run asks of its harness ----

    async def send(self, plan: SessionPlan, exchange: PlannedExchange) -> None:
        """Re-send a recorded request; its answer reaches `answered`/`replayed` through the adapter's tap."""
        record = exchange.record
        headers = request_headers(record, plan.source, plan.name, exchange.index)
        target = request_target(record, plan.source, plan.name)
        await self.request(record.method, target, data=record.body or None, headers=headers)

    def answered(self, key: tuple[str, int]) -> asyncio.Event:
        return self.tap.event(key)

    def replayed(self, key: tuple[str, int]) -> Any:
        return self.tap.exchanges[key]

    async def finish_session(self, name: str, reward: float) -> FinishResult | Difference:
        status, body = await self.request("POST", f"/tito/sessions/{quote(name, safe='')}/finish",
                                          json={"reward": reward})
        if status != 200:
            return Difference("samples", f"finish answered {status}: {short(body.decode(errors='replace'))}")
        captured = self.manager.captured[name][-1]
        _, samples = self.tap.finished[name][-1]
        return FinishResult(reward, None, samples, captured.linearization, captured.tree)

    async def drop_session(self, name: str) -> Difference | None:
        status, body = await self.request("DELETE", f"/tito/sessions/{quote(name, safe='')}")
        if status != 200:
            return Difference("error", f"drop answered {status}: {short(body.decode())}")
        return None


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
        self.clients[exchange.index] = task = asyncio.ensure_future(self.h.send(self.plan, exchange))
        leg = self.legs[exchange.index]
        waits = {asyncio.ensure_future(leg.arrived.wait()),
                 asyncio.ensure_future(self.h.answered((self.plan.name, exchange.index)).wait())}
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
        answered = self.h.answered(key)
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
        if leg.unserved and self.h.late_calls_s:  # a foreign gateway's abort follows the hang-up it noticed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(leg.drained.wait(), self.h.late_calls_s)
        self.result.exchanges += 1
        self.result.generations_not_made += sum(r.path.endswith("/generate") for r in leg.unserved)
        if self.h.options.on_exchange is not None:
            self.h.options.on_exchange()
        if self.h.cross_target:  # another gateway's bytes: what an agent would notice is the difference
            difference = meaning_difference(exchange, self.h.replayed(key))
        else:
            difference = exchange_difference(exchange, self.h.replayed(key), self.h.volatile, self.h.same_adapter)
        if difference is None and leg.unserved:
            missing = ", ".join(f"{r.method} {r.path}" for r in leg.unserved)
            difference = Difference("engine-calls", f"the replay did not make the recorded engine call(s): {missing}",
                                    exchange.index, exchange.turn)
        if difference is not None:
            self.found(difference)
            return
        event = wire_event(exchange, turns_known=self.h.cassette.header.target is None)
        if event is not None:
            self.result.wire_events.append(event)

    async def finish(self, reward: float, live: list[dict[str, Any]] | None) -> None:
        outcome = await self.h.finish_session(self.plan.name, reward)
        if isinstance(outcome, Difference):
            self.found(outcome)
            return
        outcome.live = live
        self.result.finishes.append(outcome)
        if live is None:
            return
        spans = outcome.linearization.spans if outcome.linearization is not None else []
        found = samples_difference(live, outcome.samples, self.h.decode, turn_locator(spans), ("live", "replayed"))
        if found is not None:
            summary, detail, turn = found
            decisions = [e for e in outcome.linearization.events if e.kind in ("fork", "realign", "merge")] \
                if outcome.linearization is not None else []
            if decisions:  # what the replay's manager decided: usually why the samples changed
                detail.append("the replay decided: " + "; ".join(e.describe() for e in decisions[:4]))
                turn = decisions[0].turn if turn is None else turn
            self.found(Difference("samples", f"samples differ at finish {len(self.result.finishes)}: {summary}",
                                  turn=turn, detail=detail))

    async def drop(self) -> None:
        self.result.drops += 1
        difference = await self.h.drop_session(self.plan.name)
        if difference is not None:
            self.found(difference)

    def stall(self, exchange: PlannedExchange, what: str) -> None:
        self.found(Difference(
            "stall", f"the request did not {what} within {STEP_TIMEOUT_S:g} s", exchange.index, exchange.turn))

    async def stop(self) -> None:
        """Let every held generation go and every request end, so nothing outlives the session's replay."""
        for leg in self.legs.values():
            if not self.h.answered((self.plan.name, leg.planned.index)).is_set():
                leg.stopped = True
            leg.release.set()
        pending = [t for t in self.clients.values() if not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def exchange_difference(exchange: PlannedExchange, replayed: Any, volatile: tuple[str, ...] = (),
                        adapter_flags: bool = True) -> Difference | None:
    """The first way the target's answer differs from the recorded one: status, reply bytes (the `volatile`
    fields aside: values the target draws at random or from the clock), then flags (`adapter_flags`: the turn
    index and side flag tito's adapter reports, when both sides of the comparison are tito's adapter)."""
    recorded = exchange.record
    if recorded.status != replayed.status:
        detail = [f"recorded: {short(_reply_text(recorded.reply_body, recorded.reply_events))}",
                  f"replayed: {short(_reply_text(replayed.reply_body, replayed.reply_events))}"]
        return Difference("reply", f"reply status: recorded {recorded.status}, replayed {replayed.status}",
                          exchange.index, exchange.turn, detail)
    lines = reply_difference(recorded.reply_body, recorded.reply_events, replayed.reply_body, replayed.reply_events,
                             volatile)
    if lines is not None:
        return Difference("reply", "reply to the agent differs", exchange.index, exchange.turn, lines)
    flags = (("turn_index", "turn index"), ("side", "side request"), ("retry_of", "retry of"))
    for name, label in flags if adapter_flags else flags[2:]:
        a, b = getattr(recorded, name), getattr(replayed, name)
        if a != b:
            return Difference("reply", f"{label}: recorded {a!r}, replayed {b!r}", exchange.index, exchange.turn)
    return None


def meaning_difference(exchange: PlannedExchange, replayed: Any) -> Difference | None:
    """A reply from another target than the recorded one, compared by what an agent reads in it."""
    from replayer.reply_meaning import meaning

    record = exchange.record
    a = meaning(record.path, record.status, record.reply_body, record.reply_events)
    b = meaning(record.path, replayed.status, replayed.reply_body, replayed.reply_events)
    lines = a.differences(b)
    if not lines:
        return None
    return Difference("reply", "the reply differs for the agent (recorded vs replayed): "
                      + ", ".join(line.split(":")[0] for line in lines),
                      exchange.index, exchange.turn, lines)


def wire_event(exchange: PlannedExchange, turns_known: bool = True) -> str | None:
    """What an exchange did that the tree can not show (a failure, a retry, an abort), as the golden's line;
    None for a plain answer. Read from the recording, which a clean replay has just reproduced. `turns_known`:
    the recording knows each exchange's turn (tito's adapter); around another target it does not say."""
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
    turn = f" -> turn {record.turn_index}" if record.turn_index is not None else ", no turn" if turns_known else ""
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
    if parser_process.active() is not None:  # a short run keeps parsing through the helper
        parser_process.settle(sum(exchange_count(cassette, n) for n in names))
    spec = replay_target(cassette.header, options.target, path)
    done = CassetteResult(path, cassette.header, [], cassette.truncated, all_sessions=list(cassette.sessions),
                          tokenizer_dir=tokenizer, target=spec.text, recorded_target=recorded_target(cassette.header))
    done.sessions = [result async for result in replay_each(cassette, path, tokenizer, names, options, spec)]
    return done


def recorded_target(header: Header) -> str:
    """The target a cassette was recorded around, as `--target` names it."""
    target = header.target or {}
    return str(target.get("ref") or target.get("name") or TITO) if target.get("kind", TITO) != TITO else TITO


def replay_target(header: Header, chosen: str | None, path: str) -> TargetSpec:
    """`--target` when given, else the target the header names (tito's adapter for every older cassette)."""
    try:
        return parse_target(chosen or recorded_target(header))
    except TargetError as exc:
        raise ReplayInputError(f"{path}: {exc}") from None


def harness_for(cassette: Cassette, path: str, tokenizer: str | None, options: ReplayOptions,
                spec: TargetSpec) -> Any:
    """What replays the cassette's sessions: tito's own adapter in-process, or the harness around a foreign
    target (`target_replay`). An async context manager with `replay_session(plan)` and `forget(name)` (drop
    what it kept of a session once its result is taken)."""
    if spec.kind == TITO:
        return Harness(cassette, path, tokenizer, options)
    from replayer.target_replay import TargetHarness
    from trajectory.adapters.serve import parse_listen

    if spec.kind == "http" and not options.engine_listen:
        raise ReplayInputError(f"{path}: replaying through {spec.text} needs --engine-listen HOST:PORT, the engine "
                               "URL that gateway was started with (replay serves the engine leg there)")
    listen = parse_listen(options.engine_listen) if options.engine_listen else None
    return _GuardedTarget(TargetHarness(cassette, path, tokenizer, options, spec, listen))


class _GuardedTarget:
    """A target that cannot be found or started is unusable input (exit 2), said in one line."""

    def __init__(self, harness: Any) -> None:
        self.harness = harness

    async def __aenter__(self) -> Any:
        try:
            return await self.harness.__aenter__()
        except TargetUnavailable as exc:
            raise TargetUnavailableError(f"{self.harness.path}: {exc}") from None
        except TargetError as exc:
            raise ReplayInputError(f"{self.harness.path}: {exc}") from None
        except OSError as exc:  # the engine leg's port is taken
            raise ReplayInputError(f"{self.harness.path}: cannot serve the engine leg: {exc}") from None

    async def __aexit__(self, *exc: object) -> None:
        await self.harness.__aexit__(*exc)


async def replay_each(cassette: Cassette, path: str, tokenizer: str | None, names: list[str],
                      options: ReplayOptions, spec: TargetSpec | None = None) -> AsyncIterator[SessionResult]:
    """The named sessions replayed, `options.jobs` at once, each yielded in the order named as soon as it and
    those before it are done. A session's records are read from the file when its replay starts and forgotten
    once it is yielded: memory holds the sessions in flight, however many the cassette has."""
    if not names:
        return
    if options.on_total is not None:
        options.on_total(sum(exchange_count(cassette, n) for n in names))
    spec = spec or replay_target(cassette.header, options.target, path)
    async with harness_for(cassette, path, tokenizer, options, spec) as harness:
        waiting = iter(names)
        running: deque[asyncio.Task[SessionResult]] = deque()

        def start_next() -> None:
            name = next(waiting, None)
            if name is not None:
                plan = plan_session(read_session(cassette, path, name))
                if options.on_plan is not None:
                    options.on_plan(plan)
                running.append(asyncio.ensure_future(harness.replay_session(plan)))

        for _ in range(max(1, options.jobs)):
            start_next()
        try:
            while running:
                result = await running.popleft()
                harness.forget(result.session)
                start_next()
                yield result
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)


def replay_cassette(path: str | os.PathLike[str], sessions: Iterable[str] | None = None,
                    options: ReplayOptions | None = None) -> CassetteResult:
    """Replay and verify; sessions in cassette order (or as named). Raises `ReplayInputError`."""
    return run_sync(replay_cassette_async(path, sessions, options))


def run_sync(replaying: Awaitable[T]) -> T:
    """`asyncio.run`, without handing it the result: on its way out, CPython 3.11's runner asks for the
    SIGINT handler, whose repr holds the main task and so the repr of its result. For a long session's
    result (150k-token samples) that cost a third of a second."""
    from trajectory.server_process import new_event_loop

    box: list[T] = []

    async def main() -> None:
        box.append(await replaying)

    with asyncio.Runner(loop_factory=new_event_loop) as runner:  # uvloop, as tito's servers run on
        runner.run(main())
    return box[0]
