"""A session's records as replay steps, in an order that reproduces what the live adapter saw.

The cassette writes agent exchanges in the order they were *answered* (that is when the adapter assigns
turn indices, so leaf order depends on it), and each exchange's engine calls just before it. Requests of
one session can overlap (a sub-agent, a retry sent while its original was in flight), and what the adapter
does at a request's start (restoring echoes, checking the retry cache) depends on which others had ended.
So each exchange becomes two steps, `Start` at its recorded start time and `End` at its recorded end, and
the steps are merged by time: ends keep the answer order, starts keep the start order, and an exchange
always starts before it ends. Replaying in that order re-creates the live interleaving with one request
between start and end at a time, and is deterministic: it depends only on the cassette.

A session-API finish or drop is a barrier: every exchange recorded before it has ended first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tito_rl.cassette.format.records import AgentRecord, DropRecord, EngineRecord, SamplesRecord
from tito_rl.cassette.reader import SessionLog


@dataclass
class PlannedExchange:
    index: int  # among the session's agent exchanges: the answer order
    record: AgentRecord
    engine: list[EngineRecord] = field(default_factory=list)  # calls it made, in recorded order

    @property
    def end_s(self) -> float:
        return self.record.started_s + self.record.duration_s

    @property
    def turn(self) -> int | None:
        return self.record.turn_index


@dataclass(frozen=True)
class Start:
    exchange: PlannedExchange


@dataclass(frozen=True)
class End:
    exchange: PlannedExchange


@dataclass(frozen=True)
class Finish:
    record: SamplesRecord


@dataclass(frozen=True)
class Drop:
    record: DropRecord


Step = Start | End | Finish | Drop


@dataclass
class SessionPlan:
    name: str
    source: str
    exchanges: list[PlannedExchange]
    steps: list[Step]
    unanswered_engine_calls: int = 0  # engine records after the last agent exchange (recorder killed mid-turn)

    @property
    def finishes(self) -> list[SamplesRecord]:
        return [s.record for s in self.steps if isinstance(s, Finish)]

    @property
    def engine_only(self) -> bool:
        """Engine records with no agent leg (the vcrpy integration): nothing to re-send."""
        return not self.exchanges and self.unanswered_engine_calls > 0


def plan_session(log: SessionLog) -> SessionPlan:
    exchanges: list[PlannedExchange] = []
    steps: list[Step] = []
    pending_engine: list[EngineRecord] = []
    segment: list[PlannedExchange] = []
    for record in log.records:
        if isinstance(record, EngineRecord):
            pending_engine.append(record)
        elif isinstance(record, AgentRecord):
            exchange = PlannedExchange(len(exchanges), record, pending_engine)
            pending_engine = []
            exchanges.append(exchange)
            segment.append(exchange)
        elif isinstance(record, SamplesRecord | DropRecord):
            steps += _interleave(segment)
            segment = []
            steps.append(Finish(record) if isinstance(record, SamplesRecord) else Drop(record))
    steps += _interleave(segment)
    return SessionPlan(log.name, log.source, exchanges, steps, len(pending_engine))


def _interleave(exchanges: list[PlannedExchange]) -> list[Step]:
    """Starts by start time, ends in answer order, merged by time; a start wins a tie only if earlier."""
    starts = sorted(exchanges, key=lambda e: (e.record.started_s, e.index))
    started: set[int] = set()
    steps: list[Step] = []
    s = 0
    for ending in exchanges:  # answer order
        while s < len(starts) and (ending.index not in started or starts[s].record.started_s < ending.end_s):
            steps.append(Start(starts[s]))
            started.add(starts[s].index)
            s += 1
        steps.append(End(ending))
    return steps
