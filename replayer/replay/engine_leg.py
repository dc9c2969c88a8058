"""The engine leg of a replay: the adapter's engine calls answered from the cassette, and checked.

Plugged into the adapter as its `EngineTransport`, so the adapter's own engine client (rids, aborts, the
router fallback, error mapping, output parsing) runs as it did live; only the bytes come from the cassette.
Every call is attributed to the agent exchange being replayed (a context variable the replay sets per
request), not guessed from its content: the exchange's recorded calls are served in their order, and a
/generate is checked against its recorded twin (input_ids, and the sampling params that change results;
never the random rid) before it is answered.

A generation is held until the replay says the exchange ends (`release`), so concurrent requests of one
session end in their recorded order; an abort (SGLang's /abort_request, vLLM's /abort_requests) releases its
generation, as the engine answers an aborted request with its partial output.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tito_rl.cassette.format.packing import PackedIds
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.matching import normalize_sampling
from tito_rl.replayer.comparison.differences import (
    Decode,
    Difference,
    json_difference,
    message_at,
    short,
    token_context,
    token_divergence,
)
from tito_rl.replayer.replay.plan import PlannedExchange
from tito_rl.trajectory.adapters.engine.generate import SERVER_INFO_PATH
from tito_rl.trajectory.adapters.engine.transport import EngineAnswer, EngineUnreachable
from tito_rl.trajectory.dialects.registry import detect_dialect, endpoint_of, is_generation, record_view, view_of
from tito_rl.trajectory.dialects.view import SGLANG, EngineView

__all__ = ["CURRENT_EXCHANGE", "CassetteTransport", "is_generation"]
# Request keys that differ between two runs of the same traffic by design (random per call), in any dialect.
VOLATILE_REQUEST_KEYS = frozenset({"rid", "request_id"})

# (session name, exchange index) of the request whose handler is running; set by the replay's middleware.
CURRENT_EXCHANGE: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "tito_replay_exchange", default=None
)
STOPPED = "replay of this session stopped at an earlier difference"


@dataclass
class ExchangeLeg:
    planned: PlannedExchange
    unserved: list[EngineRecord] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # a /generate reached the engine
    release: asyncio.Event = field(default_factory=asyncio.Event)  # the exchange may end
    drained: asyncio.Event = field(default_factory=asyncio.Event)  # every recorded call was made
    stopped: bool = False

    def __post_init__(self) -> None:
        self.unserved = list(self.planned.engine)
        if not self.unserved:
            self.drained.set()

    def take(self, method: str, path: str) -> EngineRecord | None:
        for i, record in enumerate(self.unserved):
            if record.method == method and record.path == path:
                return self._taken(i)
        return None

    def take_generation(self) -> EngineRecord | None:
        """The next recorded generation of any path: a target that calls the engine in another dialect than the
        recorded one is served the generation recorded for this exchange, translated (`translated_answer`)."""
        for i, record in enumerate(self.unserved):
            if is_generation(record.path):
                return self._taken(i)
        return None

    def _taken(self, i: int) -> EngineRecord:
        taken = self.unserved.pop(i)
        if not self.unserved:
            self.drained.set()
        return taken


class CassetteTransport:
    """`EngineTransport` for a replay. `report(session, difference)` hears of every difference found;
    `strict=False` serves each exchange's recorded answers even when the request changed."""

    def __init__(
        self,
        base_url: str,
        decode: Decode,
        message_start: int | None,
        report: Callable[[str, Difference], None],
        strict: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.decode = decode
        self.message_start = message_start
        self.report = report
        self.strict = strict
        self.legs: dict[tuple[str, int], ExchangeLeg] = {}

    def add(self, session: str, planned: PlannedExchange) -> ExchangeLeg:
        leg = self.legs[(session, planned.index)] = ExchangeLeg(planned)
        return leg

    async def close(self) -> None:
        pass

    async def send(self, method: str, url: str, body: dict[str, Any] | None, headers: dict[str, str]) -> EngineAnswer:
        key = CURRENT_EXCHANGE.get()
        leg = self.legs.get(key) if key is not None else None
        if key is None or leg is None:
            raise EngineUnreachable("replay: an engine call outside any replayed agent exchange")
        session = key[0]
        path = url[len(self.base_url) :] if url.startswith(self.base_url) else url
        if method == "GET" and path == SERVER_INFO_PATH:
            return EngineAnswer(200, self.server_info(session))
        record = leg.take(method, path)
        translated = record is None and endpoint_of(path) == "generate" and detect_dialect(path, body) == SGLANG
        if translated:
            record = leg.take_generation()
        recorded = record_view(record) if translated and record is not None else None
        if record is None:
            exchange = leg.planned
            self.report(
                session,
                Difference(
                    "engine-calls",
                    f"the adapter called {method} {path}, which the recording has no (further) call "
                    f"of for this exchange",
                    exchange.index,
                    exchange.turn,
                    [f"recorded calls: {', '.join(f'{r.method} {r.path}' for r in exchange.engine) or 'none'}"],
                ),
            )
            raise EngineUnreachable(f"replay: no recorded {method} {path} for this exchange")
        if is_generation(path):
            difference = (
                self.check_translated(leg.planned, record, recorded, body)
                if recorded is not None
                else self.check_call(leg.planned, record, body)
            )
            if difference is not None:
                self.report(session, difference)
                if self.strict:
                    raise EngineUnreachable(f"replay: {difference.summary}")
            leg.arrived.set()
            await leg.release.wait()
        elif endpoint_of(path) == "abort":  # SGLang's /abort_request, vLLM's /abort_requests
            leg.release.set()
        if leg.stopped:
            raise EngineUnreachable(f"replay: {STOPPED}")
        if record.status == 0:
            error = record.error or "no answer"
            raise EngineUnreachable(error, timed_out=error.startswith("TimeoutError"))
        if recorded is not None and record.status == 200:
            return EngineAnswer(200, generate_answer(recorded, body, self.decode))
        return EngineAnswer(record.status, record.response, record.wire)

    def server_info(self, session: str) -> dict[str, Any]:
        """What tito's adapter learns from SGLang's `/get_server_info` (asked once, never recorded: not a session's
        call): whether the engine served expert routes, as the session's recorded generations show by asking."""
        asked = any(
            isinstance(record.request, dict) and record.request.get("return_routed_experts") is True
            for (name, _), leg in self.legs.items()
            if name == session
            for record in leg.planned.engine
        )
        return {"enable_return_routed_experts": asked}

    def check_translated(
        self, exchange: PlannedExchange, record: EngineRecord, recorded: EngineView, body: dict[str, Any] | None
    ) -> Difference | None:
        """A /generate served from a generation recorded in another dialect: the prompts compare as ids where
        the recording knows them (a messages-in call whose engine returned its prompt ids does); the sampling
        params are named differently across dialects and are left to `tito audit`."""
        if record.status != 200:  # an engine error: answered as recorded, nothing generated to compare
            return None
        rec_ids, rep_ids = recorded.prompt_ids, (body or {}).get("input_ids")
        if recorded.output_ids is None:
            return Difference(
                "engine-calls",
                f"the recorded {recorded.dialect} call ({record.method} {record.path}) "
                "has no output ids to answer a /generate with",
                exchange.index,
                exchange.turn,
            )
        if rec_ids is None or not isinstance(rep_ids, list | PackedIds):
            return None
        return self.prompt_difference(exchange, rec_ids, rep_ids, "input_ids", f" as {recorded.dialect}")

    def prompt_difference(
        self, exchange: PlannedExchange, rec_ids: Any, rep_ids: Any, name: str, recorded_as: str = ""
    ) -> Difference | None:
        """The first token where two prompts part, decoded on both sides, with the rendered message it is in."""
        index = token_divergence(rec_ids, rep_ids)
        if index is None:
            return None
        detail = token_context(rec_ids, rep_ids, index, self.decode)
        where = message_at(rep_ids, index, self.decode, self.message_start)
        if where:
            detail.append(f"in {where}")
        return Difference(
            "engine-request",
            f"engine request differs: {name} at token {index} (recorded "
            f"{len(rec_ids)} tokens{recorded_as}, replayed {len(rep_ids)})",
            exchange.index,
            exchange.turn,
            detail,
        )

    def check_call(
        self, exchange: PlannedExchange, record: EngineRecord, body: dict[str, Any] | None
    ) -> Difference | None:
        """A generation against its recorded twin. `/generate`: input_ids, then the sampling params that change
        results. Any other dialect: the prompt ids where both requests carry them (first differing token), then
        the rest of the request as a JSON value (first differing path; gateways re-serialise, so bytes are never
        compared), random per-call ids aside."""
        dialect = record.dialect or SGLANG
        if dialect == SGLANG and endpoint_of(record.path) == "generate":
            return self.check_generate(exchange, record, body)
        recorded, replayed = record.request or {}, body or {}
        rec_ids = view_of(dialect, record.path, recorded, None).prompt_ids
        rep_ids = view_of(dialect, record.path, replayed, None).prompt_ids
        skip = set(VOLATILE_REQUEST_KEYS)
        if rec_ids is not None and rep_ids is not None:
            difference = self.prompt_difference(exchange, rec_ids, rep_ids, "prompt ids")
            if difference is not None:
                return difference
            skip |= {k for k in ("input_ids", "token_ids", "prompt", "tokens") if k in recorded or k in replayed}
        found = json_difference(
            {k: v for k, v in recorded.items() if k not in skip}, {k: v for k, v in replayed.items() if k not in skip}
        )
        if found is None:
            return None
        where, was, now = found
        return Difference(
            "engine-request",
            f"engine request differs at {where or '$'}: recorded {short(was)}, replayed {short(now)}",
            exchange.index,
            exchange.turn,
            [f"{record.method} {record.path} ({dialect})"],
        )

    def check_generate(
        self, exchange: PlannedExchange, record: EngineRecord, body: dict[str, Any] | None
    ) -> Difference | None:
        recorded = record.request or {}
        replayed = body or {}
        rec_ids, rep_ids = recorded.get("input_ids") or [], replayed.get("input_ids") or []
        a = normalize_sampling(recorded.get("sampling_params"))
        b = normalize_sampling(replayed.get("sampling_params"))
        sampling = [
            f"{k}: recorded {a.get(k)!r}, replayed {b.get(k)!r}"
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)
        ]
        difference = self.prompt_difference(exchange, rec_ids, rep_ids, "input_ids")
        if difference is not None:
            difference.detail += [f"sampling params also differ: {line}" for line in sampling]
            return difference
        if sampling:
            return Difference(
                "engine-request", "engine request differs: sampling params", exchange.index, exchange.turn, sampling
            )
        return routes_asked_difference(exchange, recorded, replayed)


def routes_asked_difference(
    exchange: PlannedExchange, recorded: dict[str, Any], replayed: dict[str, Any]
) -> Difference | None:
    """Expert routes asked of the engine as recorded (`return_routed_experts`, then the row they start at): a
    gateway that stops asking, or asks from another row, trains other rows, which the replay names here rather
    than as the samples' `rollout_routed_experts` differing later."""
    asked = bool(recorded.get("return_routed_experts")), bool(replayed.get("return_routed_experts"))
    if asked[0] != asked[1]:
        key, was, now = "return_routed_experts", asked[0], asked[1]
    elif asked[0] and recorded.get("routed_experts_start_len", 0) != replayed.get("routed_experts_start_len", 0):
        key = "routed_experts_start_len"
        was, now = recorded.get("routed_experts_start_len", 0), replayed.get("routed_experts_start_len", 0)
    else:
        return None
    return Difference(
        "engine-request",
        f"engine request differs: {key}",
        exchange.index,
        exchange.turn,
        [f"{key}: recorded {was!r}, replayed {now!r} (the samples' rollout_routed_experts follow it)"],
    )


def generate_answer(view: EngineView, body: dict[str, Any] | None, decode: Decode) -> dict[str, Any]:
    """A recorded generation of another dialect as SGLang's /generate would have answered it: the same output ids,
    logprobs (None where the recording has none) and finish, so a /generate-calling target (tito's adapter, slime)
    replays a recording made around a gateway that calls an OpenAI-style engine. `view`: the recorded call's."""
    ids = list(view.output_ids or [])
    logprobs = list(view.logprobs or [])
    logprobs += [None] * (len(ids) - len(logprobs))
    if view.finish_reason == "length":
        finish: dict[str, Any] = {"type": "length", "length": len(ids)}
    elif view.finish_reason == "abort":
        finish = {"type": "abort", "message": "aborted"}
    else:
        finish = {"type": "stop", "matched": ids[-1] if ids else None}
    prompt = (body or {}).get("input_ids")
    return {
        "text": decode(ids),
        "output_ids": ids,
        "meta_info": {
            "id": str((body or {}).get("rid") or ""),
            "finish_reason": finish,
            "prompt_tokens": len(prompt) if isinstance(prompt, list) else len(view.prompt_ids or ()),
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids, strict=False)],
        },
    }
