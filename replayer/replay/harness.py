"""The harness a session's replay runs in, and the run itself: tito's own adapter app in-process on a private
Unix socket with the cassette as its engine (`Harness`), the part every target shares (`HarnessBase`), and one
session's plan carried out step by step, each answer checked against the recording as it comes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from tito_rl.cassette.reader import Cassette
from tito_rl.recorder.targets.registry import TITO, same_target
from tito_rl.replayer.comparison.differences import (
    Difference,
    reply_difference,
    samples_difference,
    short,
    turn_locator,
)
from tito_rl.replayer.replay.agent_leg import (
    ReplayTap,
    adapter_target,
    exchange_context,
    request_headers,
    request_target,
)
from tito_rl.replayer.replay.engine_leg import CURRENT_EXCHANGE, CassetteTransport
from tito_rl.replayer.replay.loading import (
    ReplayInputError,
    adapter_settings,
    recorded_engine_model,
    recorded_target,
    replay_routes_layout,
    replay_target,
)
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.replayer.replay.plan import Drop, End, Finish, PlannedExchange, SessionPlan, Start
from tito_rl.replayer.replay.results import FinishResult, SessionResult
from tito_rl.trajectory.adapters.app import ADAPTER_KEY, create_app
from tito_rl.trajectory.adapters.engine.generate import DROPPED
from tito_rl.trajectory.dialects.registry import endpoint_of, is_generation, record_view
from tito_rl.trajectory.dialects.view import SGLANG
from tito_rl.trajectory.manager import Linearization, TrajectoryManager
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

UNIX_PATH_MAX = 107  # a Unix socket's path, in bytes (Linux's sun_path holds 108 with the terminating NUL)
STEP_TIMEOUT_S = 60.0  # a step that takes this long is a hang: reported as a difference, never waited out
_CREATED = re.compile(rb'"created(?:_at)?":\s*(\d+)')
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


class HarnessBase:
    """What every target's replay shares: the cassette, the tokenizer, the results, a session's run. A harness
    answers what a run asks (`send`, `answered`, `replayed`, `finish_session`, `drop_session`, `unfinished`,
    `volatile`, `transport`): `Harness` for tito's own adapter, `target_harness.TargetHarness` for any other."""

    volatile: tuple[str, ...] = ()  # reply fields compared only for being there
    same_adapter = False  # the recording and the replay are both tito's adapter: its turn flags compare too
    late_calls_s = 0.0  # how long an answered exchange waits for its recorded engine calls still to come
    transport: CassetteTransport  # the engine leg, served from the cassette

    def __init__(self, cassette: Cassette, path: str, tokenizer: str | None, options: ReplayOptions) -> None:
        self.cassette, self.path, self.options = cassette, path, options
        # through another target than the recorded one (a conformance run): replies compared by what they mean
        self.cross_target = not same_target(
            replay_target(cassette.header, options.target, path, options.trust_cassette).text,
            recorded_target(cassette.header),
        )
        self.tokenizer_dir = tokenizer
        self.tokenizer = load_tokenizer(tokenizer)
        self.results: dict[str, SessionResult] = {}
        self.plans: dict[str, SessionPlan] = {}

    def _message_start(self) -> int | None:
        """The id that opens each rendered message (ChatML's `<|im_start|>`), to name the message a token is in."""
        token_id = self.tokenizer.convert_tokens_to_ids("<|im_start|>")
        return token_id if isinstance(token_id, int) and token_id != self.tokenizer.unk_token_id else None

    def decode(self, ids: list[int]) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text

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
        result.skipped = self.no_session(plan)
        if result.skipped is not None:
            return result
        if plan.unanswered_engine_calls:
            result.notes.append(
                f"{plan.unanswered_engine_calls} engine call(s) after the last agent exchange "
                "(cut short by the recorder's end) are not replayed"
            )
        refused = self.foreign_dialect(plan)
        if refused is not None:
            result.differences.append(refused)
            return result
        runner = SessionRun(self, plan, result)
        try:
            await runner.run()
        finally:
            await runner.stop()
        if not result.differences and self.unfinished(plan):
            await runner.finish(0.0, None)  # never finished live: linearized with reward 0
        return result

    async def send(self, plan: SessionPlan, exchange: PlannedExchange) -> None:
        """Re-send a recorded request; its answer reaches `answered` and `replayed`."""
        raise NotImplementedError

    def answered(self, key: tuple[str, int]) -> asyncio.Event:
        raise NotImplementedError

    def replayed(self, key: tuple[str, int]) -> Any:
        raise NotImplementedError

    async def finish_session(self, name: str, reward: float) -> FinishResult | Difference | None:
        """The target's finish: its samples, a failure, or None where it offers no samples."""
        raise NotImplementedError

    async def drop_session(self, name: str) -> Difference | None:
        raise NotImplementedError

    def unfinished(self, plan: SessionPlan) -> bool:
        raise NotImplementedError

    def no_session(self, plan: SessionPlan) -> str | None:
        """Why a recorded "session" is none and is not replayed (None: it is one)."""
        return None

    def foreign_dialect(self, plan: SessionPlan) -> Difference | None:
        """A session whose engine calls this side cannot make: its recorded answers can serve none of them, so it
        is one difference at once rather than every call waiting out the adapter's engine retries."""
        return None


class Harness(HarnessBase):
    """One adapter app for a cassette, served on a private Unix socket, with the cassette as its engine."""

    def foreign_dialect(self, plan: SessionPlan) -> Difference | None:
        """tito's adapter calls SGLang's /generate: a generation recorded in another dialect serves it translated
        (`engine_leg.generate_answer`) where it holds output ids; one that does not has nothing to serve it."""
        other = next(
            (
                r
                for e in plan.exchanges
                for r in e.engine
                if is_generation(r.path)
                and r.status == 200
                and r.dialect not in (None, SGLANG)
                and record_view(r).output_ids is None
            ),
            None,
        )
        if other is None:
            return None
        recorded = (self.cassette.header.target or {}).get("name") or "the target it was recorded around"
        return Difference(
            "engine-calls",
            f"the recording's engine calls are {other.dialect} ({other.method} "
            f"{other.path}) without output ids (the gateway did not ask for them): nothing can answer "
            f"tito's adapter's /generate from them; replay it through {recorded} (--target)",
        )

    def __init__(self, cassette: Cassette, path: str, tokenizer: str | None, options: ReplayOptions) -> None:
        super().__init__(cassette, path, tokenizer, options)
        self.settings = adapter_settings(cassette.header, tokenizer, options.adapter)
        if self.settings.engine_dialect != SGLANG and not self.settings.engine_model:
            self.settings.engine_model = recorded_engine_model(cassette)
        if "engine_routes_layout" not in options.adapter:  # a unit's worker gets the planner's, from every session
            self.settings.engine_routes_layout = replay_routes_layout(cassette, self.settings)
        self.settings.clock = self._created
        self.manager = CapturingManager(**{**(cassette.header.adapter.get("manager") or {}), **options.manager})
        self.tap = ReplayTap()
        self.transport = CassetteTransport(
            self.settings.engine_url, self.decode, self._message_start(), self.report, strict=options.strict
        )
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
        self._dir = tempfile.mkdtemp(prefix="tito-replay-", dir=_socket_parent())
        socket_path = os.path.join(self._dir, "adapter.sock")
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, socket_path).start()
        self.client = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=socket_path, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None),
        )
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
        target = adapter_target(request_target(record, plan.source, plan.name), plan.source, plan.name)
        await self.request(record.method, target, data=record.body or None, headers=headers)

    def answered(self, key: tuple[str, int]) -> asyncio.Event:
        return self.tap.event(key)

    def replayed(self, key: tuple[str, int]) -> Any:
        return self.tap.exchanges[key]

    async def finish_session(self, name: str, reward: float) -> FinishResult | Difference:
        status, body = await self.request(
            "POST", f"/tito/sessions/{quote(name, safe='')}/finish", json={"reward": reward}
        )
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


class SessionRun:
    """Carries out one session's plan; see `plan` for the order and `engine_leg` for the holds."""

    def __init__(self, harness: HarnessBase, plan: SessionPlan, result: SessionResult) -> None:
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
        waits = {
            asyncio.ensure_future(leg.arrived.wait()),
            asyncio.ensure_future(self.h.answered((self.plan.name, exchange.index)).wait()),
        }
        try:
            done, _ = await asyncio.wait({task, *waits}, timeout=STEP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if not done:
            self.stall(exchange, "reach the engine or be answered")
        elif task in done and task.exception() is not None:
            self.found(
                Difference("error", f"the request could not be sent: {task.exception()}", exchange.index, exchange.turn)
            )

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
        self.result.generations_not_made += sum(is_generation(r.path) for r in leg.unserved)
        if self.h.options.on_exchange is not None:
            self.h.options.on_exchange()
        if self.h.cross_target:  # another gateway's bytes: what an agent would notice is the difference
            difference = meaning_difference(exchange, self.h.replayed(key))
        else:
            difference = exchange_difference(exchange, self.h.replayed(key), self.h.volatile, self.h.same_adapter)
        if difference is None and leg.unserved:
            missing = ", ".join(f"{r.method} {r.path}" for r in leg.unserved)
            difference = Difference(
                "engine-calls",
                f"the replay did not make the recorded engine call(s): {missing}",
                exchange.index,
                exchange.turn,
            )
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
        if outcome is None:  # the target offers no samples (a gateway without a session API)
            n = len(self.result.finishes) + self.result.unsampled_finishes + 1
            if live is not None:  # one side has samples: say which has what
                self.found(
                    Difference(
                        "samples",
                        f"finish {n}: the recording has {len(live)} sample(s), the "
                        "target offered none (it answered no samples at its finish)",
                    )
                )
                return
            self.result.unsampled_finishes += 1  # neither side has samples: replies and engine calls verified
            return
        outcome.live = live
        self.result.finishes.append(outcome)
        if live is None:
            return
        spans = outcome.linearization.spans if outcome.linearization is not None else []
        found = samples_difference(live, outcome.samples, self.h.decode, turn_locator(spans), ("live", "replayed"))
        if found is not None:
            summary, detail, turn = found
            decisions = (
                [e for e in outcome.linearization.events if e.kind in ("fork", "realign", "merge")]
                if outcome.linearization is not None
                else []
            )
            if decisions:  # what the replay's manager decided: usually why the samples changed
                detail.append("the replay decided: " + "; ".join(e.describe() for e in decisions[:4]))
                turn = decisions[0].turn if turn is None else turn
            self.found(
                Difference(
                    "samples",
                    f"samples differ at finish {len(self.result.finishes)}: {summary}",
                    turn=turn,
                    detail=detail,
                )
            )

    async def drop(self) -> None:
        self.result.drops += 1
        difference = await self.h.drop_session(self.plan.name)
        if difference is not None:
            self.found(difference)

    def stall(self, exchange: PlannedExchange, what: str) -> None:
        self.found(
            Difference(
                "stall", f"the request did not {what} within {STEP_TIMEOUT_S:g} s", exchange.index, exchange.turn
            )
        )

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


def exchange_difference(
    exchange: PlannedExchange, replayed: Any, volatile: tuple[str, ...] = (), adapter_flags: bool = True
) -> Difference | None:
    """The first way the target's answer differs from the recorded one: status, reply bytes (the `volatile`
    fields aside: values the target draws at random or from the clock), then flags (`adapter_flags`: the turn
    index and side flag tito's adapter reports, when both sides of the comparison are tito's adapter)."""
    recorded = exchange.record
    if recorded.status != replayed.status:
        detail = [
            f"recorded: {short(_reply_text(recorded.reply_body, recorded.reply_events))}",
            f"replayed: {short(_reply_text(replayed.reply_body, replayed.reply_events))}",
        ]
        return Difference(
            "reply",
            f"reply status: recorded {recorded.status}, replayed {replayed.status}",
            exchange.index,
            exchange.turn,
            detail,
        )
    lines = reply_difference(
        recorded.reply_body, recorded.reply_events, replayed.reply_body, replayed.reply_events, volatile
    )
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
    from tito_rl.replayer.comparison.reply_meaning import meaning

    record = exchange.record
    a = meaning(record.path, record.status, record.reply_body, record.reply_events)
    b = meaning(record.path, replayed.status, replayed.reply_body, replayed.reply_events)
    lines = a.differences(b)
    if not lines:
        return None
    return Difference(
        "reply",
        "the reply differs for the agent (recorded vs replayed): " + ", ".join(line.split(":")[0] for line in lines),
        exchange.index,
        exchange.turn,
        lines,
    )


def wire_event(exchange: PlannedExchange, turns_known: bool = True) -> str | None:
    """What an exchange did that the tree can not show (a failure, a retry, an abort), as the golden's line;
    None for a plain answer. Read from the recording, which a clean replay has just reproduced. `turns_known`:
    the recording knows each exchange's turn (tito's adapter); around another target it does not say."""
    record = exchange.record
    generates = [c for c in exchange.engine if is_generation(c.path)]
    failed = [
        f"engine {c.path} call dropped"
        if c.status == 0 and c.error == DROPPED
        else f"engine {c.path} {c.status or 'no answer'}"
        for c in generates
        if c.status != 200
    ]
    aborts = sum(endpoint_of(c.path) == "abort" for c in exchange.engine)
    parts: list[str] = []
    if record.retry_of is not None:
        parts.append(
            f"retry of #{record.retry_of} (identical body): "
            + ("generated again" if generates else "answered from the first reply, no engine call")
        )
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


def _socket_parent() -> str | None:
    """Where the adapter's socket folder goes: the temp folder, unless a deep TMPDIR would make the socket's path
    longer than a Unix socket's may be (the replay failed with `AF_UNIX path too long`); then /tmp."""
    longest = os.path.join(tempfile.gettempdir(), "tito-replay-" + "x" * 8, "adapter.sock")
    return "/tmp" if len(os.fsencode(longest)) > UNIX_PATH_MAX and os.path.isdir("/tmp") else None
