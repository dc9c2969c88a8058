"""The contract's requests sent through tito's own engine tap, and the answers taken from what the tap recorded.

The tap (`recorder/taps/engine_tap.EngineTap`) runs on loopback in front of the engine, as it does in front of a
user's engine in `tito record`; each request carries a routing key naming it, so the tap records every call (a
model list and `/tokenize` too, not only generations) as that request's, with the dialect it read from the call.
The answer committed is the tap's record: its status and body, or, for a stream, every data event the tap
relayed (`[DONE]` included), parsed as the direct client parses them (`exchange.parse_events`).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tito_rl.recorder.engine_contract.exchange import Answer, Unreachable, parse_events, send
from tito_rl.recorder.engine_contract.fake import running_app
from tito_rl.recorder.taps.engine_tap import EngineTap
from tito_rl.recorder.taps.recording import Recording
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange

ROUTING_HEADER = "X-Tito-Contract"  # the request's name: the tap's routing key, so every call is recorded
WAIT_S = 60.0  # how long the tap may take to record a call after its last byte reached the client


class ContractTap(EngineTap):
    """The engine tap, keeping each stream's whole text as events beside what it records of it."""

    def __init__(self, recording: Recording, engine_url: str, dialect: str | None) -> None:
        super().__init__(recording, engine_url, dialect)
        self.events: dict[int, list[Any]] = {}  # id of the EngineExchange -> its stream's data events

    def streamed(self, exchange: EngineExchange, text: str) -> Any:
        self.events[id(exchange)] = parse_events(text.splitlines())
        return super().streamed(exchange, text)


class Collected:
    """The `TrafficTap` the contract's tap writes to: each engine call, by the routing key it carried."""

    def __init__(self) -> None:
        self.calls: queue.Queue[tuple[str, EngineExchange]] = queue.Queue()

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        pass

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        pass

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        self.calls.put((session, exchange))

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        pass

    def session_dropped(self, session: str, source: str) -> None:
        pass


class TappedEngine:
    """Sends a request through the tap and answers with what the tap recorded of it."""

    def __init__(self, url: str, tap: ContractTap, collected: Collected) -> None:
        self.url = url
        self.tap = tap
        self.collected = collected

    def send(self, key: str, method: str, path: str, body: Any = None) -> Answer:
        send(self.url, method, path, body, headers={ROUTING_HEADER: key})  # read whole: the tap then records
        try:
            session, exchange = self.collected.calls.get(timeout=WAIT_S)
        except queue.Empty:
            raise Unreachable(f"{method} {path}: the engine tap recorded no call") from None
        if session != key:
            raise ValueError(f"{method} {path}: the engine tap recorded {session!r}'s call, not {key!r}'s")
        if exchange.status == 0:
            raise Unreachable(f"{method} {self.tap.engine_url}{path}: {exchange.error}")
        return answer_of(exchange, self.tap.events.pop(id(exchange), None))


def answer_of(exchange: EngineExchange, events: list[Any] | None) -> Answer:
    """The contract's answer from the tap's record of one call (`events`: the stream's, where it streamed)."""
    if events is not None:
        return Answer(status=exchange.status, chunks=events, streamed=True, dialect=exchange.dialect)
    if isinstance(exchange.response, (dict, list)):
        return Answer(status=exchange.status, body=exchange.response, dialect=exchange.dialect)
    text = exchange.response if isinstance(exchange.response, str) else ""
    return Answer(status=exchange.status, text=text, dialect=exchange.dialect)


@contextmanager
def tapped_engine(engine_url: str, dialect: str | None) -> Iterator[TappedEngine]:
    """tito's engine tap on a free loopback port in front of `engine_url`; `dialect`: the engine's own (the tap's
    `--engine-dialect`), which the tap keeps for the paths that do not say theirs."""
    collected = Collected()
    tap = ContractTap(Recording(collected, ROUTING_HEADER), engine_url, dialect)
    with running_app(tap.app()) as url:
        yield TappedEngine(url, tap, collected)
