"""One pass over a cassette, grouped the way the rules look at it: per session, its engine calls (as the
dialect-neutral view reads them), each agent exchange with the calls it made, each finish with its samples.

The recorder writes a turn's engine calls, then its agent exchange, so the calls read since a session's previous
agent record are that exchange's. Prompts are read packed (4 bytes a token, as the file holds them) and handed to
the rules once, as the call is read; what a session keeps is each call's output, logprobs, prompt length and
prompt digest, and it lets them go at the session's finish. Memory thus follows the sessions live at once, not
the cassette's length. Samples are read packed too (ids, loss mask and logprobs viewed as arrays, never built as
lists: a sample spans its session's whole response), through the reader's public `records(...)` options.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from tito_rl.cassette.format.fastzlib import crc32
from tito_rl.cassette.format.index import SessionIndex
from tito_rl.cassette.format.packing import PackedColumn, PackedIds
from tito_rl.cassette.format.records import AgentRecord, DropRecord, EngineEvent, EngineRecord, Header, SamplesRecord
from tito_rl.cassette.reader import CassetteReader
from tito_rl.replayer.audit.protocol import Example, Findings
from tito_rl.trajectory.dialects.channel_reads import read_sglang
from tito_rl.trajectory.dialects.registry import record_view
from tito_rl.trajectory.dialects.view import EngineView, object_at

U32 = np.dtype("<u4")
EMPTY = np.zeros(0, dtype=U32)


def digest(ids: np.ndarray, start: int = 0) -> int:
    """A prompt's identity (CRC-32 of its packed ids), so a sample can be checked to start with it without the
    prompt being kept; `start`: the CRC of the ids before these, to go on from. Only a call whose output also
    matches the sample there is checked, so a 32-bit checksum cannot be fooled by chance in practice."""
    return crc32(np.ascontiguousarray(ids, dtype=U32).data, start)  # the array's buffer: no copy


def as_ids(ids: Any) -> np.ndarray:
    """Token ids as a uint32 array: a view of packed ones (`PackedIds`, as the audit reads prompts and samples),
    or built from a list (a record made in memory)."""
    if isinstance(ids, PackedIds):
        return np.frombuffer(ids.packed, dtype=U32)
    return np.asarray(ids or [], dtype=U32)


def as_mask(mask: Any) -> np.ndarray:
    """A sample's loss mask as an int8 array: from its runs where it was left packed (`PackedColumn`)."""
    if isinstance(mask, PackedColumn):
        first, runs = mask.runs()
        values = np.arange(first, first + len(runs), dtype=np.int64) % 2
        return np.repeat(values.astype(np.int8), np.asarray(runs, dtype=np.int64))
    return np.asarray(mask or [], dtype=np.int8)


def as_floats(values: Any) -> np.ndarray:
    """A sample's logprobs as a float64 array: a view of packed ones (`PackedColumn`), or built from a list."""
    if isinstance(values, PackedColumn):
        return np.frombuffer(values.packed, dtype="<f8")
    return np.asarray(values, dtype=np.float64)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids `a` and `b` share."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    same = a[:m] == b[:m]
    first = int(same.argmin())  # the first mismatch, or 0 where there is none (argmin: C, no numpy wrapper)
    return m if same[first] else first


def traced_calls(calls: list[Call], tokens: np.ndarray) -> list[tuple[int, int, int]]:
    """The calls whose output lies in a sample's `tokens`: `(p, i, n)` where the tokens start with call i's prompt
    (its `p` ids, by digest) and go on with the first `n` > 0 ids of its output; in order of `p`."""
    candidates: list[tuple[int, int, int]] = []
    for i, call in enumerate(calls):
        p = call.prompt_len
        if p is None or p >= len(tokens):
            continue
        n = common_prefix(call.output, tokens[p : p + len(call.output)])
        if n:
            candidates.append((p, i, n))
    found: list[tuple[int, int, int]] = []
    crc, done = 0, 0  # the sample's prefixes checksummed once, in order of the candidates' prompt lengths
    for p, i, n in sorted(candidates):
        crc, done = digest(tokens[done:p], crc), p
        if crc == calls[i].prompt_digest:
            found.append((p, i, n))
    return found


@dataclass(eq=False)  # compared by identity: it holds arrays
class Call:
    """One engine call as the rules need it after it was read: its output and logprobs, not its prompt."""

    seq: int
    index: int  # among the session's engine calls
    path: str
    status: int
    error: str | None
    view: EngineView  # prompt_ids dropped (`prompt_len`, `prompt_digest` stand for them)
    prompt_len: int | None
    prompt_digest: int | None
    output: np.ndarray
    logprobs: np.ndarray | None  # float64, NaN where the engine returned none; None: no logprobs at all
    exchange: int | None = None  # index among the session's agent exchanges, once its record is read
    side: bool = False
    examples: list[Example] = field(default_factory=list)  # told their exchange when it is known
    record: EngineRecord | None = None  # the raw record, while the families are fed it (then let go)
    order: tuple[int, int] | None = None  # `EngineRecord.order`: its place among every engine call and event
    # Aborted by the engine (a weight update), then continued by the session's next call, whose prompt is this
    # call's prompt and output (tito's adapter, slime's partial rollout): its output was sampled and sent on.
    continued: bool = False

    @property
    def generates(self) -> bool:
        return self.view.generates

    @property
    def aborted(self) -> bool:
        return self.view.finish_reason == "abort"

    @property
    def failed(self) -> bool:
        return self.view.generates and (self.status != 200 or self.error is not None)

    @property
    def generated(self) -> bool:
        """A generation the engine completed and returned (an aborted one is not, unless it was continued)."""
        return self.generates and not self.failed and (not self.aborted or self.continued) and len(self.output) > 0

    def continued_by(self, prompt: np.ndarray) -> bool:
        """Whether `prompt` (a later call's) is this aborted call's prompt and output: a continuation of it."""
        p = self.prompt_len
        if not self.aborted or self.failed or p is None or len(prompt) != p + len(self.output):
            return False
        return bool(np.array_equal(prompt[p:], self.output)) and digest(prompt[:p]) == self.prompt_digest


@dataclass
class Exchange:
    """One agent exchange and the engine calls it made; `retry_of`: the exchange whose identical body it
    re-sends (as the recorder found it); `regenerated`: that one was answered by a generation and this
    one generated again."""

    index: int
    record: AgentRecord | None  # let go once the rules saw it: a body holds the whole conversation
    calls: list[Call]
    retry_of: int | None = None
    regenerated: bool = False
    seq: int = 0  # the agent record's

    @property
    def answer(self) -> Call | None:
        """The generation the reply was built from: the exchange's last completed one."""
        return next((c for c in reversed(self.calls) if c.generated), None)


@dataclass
class Finish:
    """A finish (its samples) or a drop (`record` None), with the session's calls since its previous one."""

    record: SamplesRecord | None
    calls: list[Call]
    exchanges: dict[int, Exchange]  # the exchanges of those calls, by index

    @property
    def dropped(self) -> bool:
        return self.record is None


@dataclass
class SessionState:
    """What one session holds while the cassette streams; rule families keep their own notes in `notes`."""

    name: str
    header: Header
    exchanges: int = 0
    calls: int = 0
    pending: list[Call] = field(default_factory=list)  # read since the session's last agent record
    since_finish: list[Call] = field(default_factory=list)
    finish_exchanges: dict[int, Exchange] = field(default_factory=dict)
    answered: dict[int, tuple[int, np.ndarray]] = field(default_factory=dict)  # exchange -> (seq, output head)
    breaks: dict[int, str] = field(default_factory=dict)  # call index -> kind: a later prompt drops its output
    notes: dict[str, Any] = field(default_factory=dict)
    channels: Any = None  # the per-token channel rules' notes (`audit.channels`), kept past a finish


@dataclass
class StreamResult:
    header: Header
    truncated: bool
    sessions: int


class RuleFamily:
    """A module's rules, fed one cassette as it streams: each engine call as it is read, each agent exchange with
    the calls it made, each finish with its samples. A family overrides the hooks it needs, adds findings to the
    `Findings` it was given and keeps nothing beyond the session it looks at (in `SessionState.notes`), so an
    audit's memory does not grow with the cassette."""

    rules: tuple[str, ...] = ()

    def call(self, state: SessionState, call: Call, prompt: np.ndarray | None) -> None:
        """An engine call as it is read; `prompt` is its prompt ids, which the stream does not keep."""

    def exchange(self, state: SessionState, exchange: Exchange) -> None:
        """An agent exchange, with the engine calls it made, once its record is read."""

    def finish(self, state: SessionState, finish: Finish) -> None:
        """A finish (samples) or a drop, with the calls made since the session's previous finish."""

    def end(self, state: SessionState) -> None:
        """The cassette ended: the session's calls after its last finish are still in `state`."""

    def engine_event(self, event: EngineEvent) -> None:
        """An engine call of no session (a trainer's weight update, pause or abort; format version 7), as it is
        read: it may come before or after the calls it ran beside (each is written when answered), so a family
        judges against the events at the cassette's `end`."""


def records(reader: CassetteReader) -> Iterator[Any]:
    """The cassette's records in file order, /generate prompts and samples' tokens left packed (`PackedIds`): a
    session's prompts and samples each hold its whole history, and a pass that builds them as lists spends most of
    its time doing so. A finished session's delta bases are let go, so memory follows the live sessions."""
    return reader.records(packed_prompts=True, packed_samples=True, release_finished=True)


def records_of(reader: CassetteReader, sessions: Iterable[SessionIndex]) -> Iterator[tuple[int, Any]]:
    """The records of some sessions (a work unit's) with their byte offsets, in file order, read as `records`
    reads them: no other session's frame is read."""
    return reader.records_at(sessions, packed_prompts=True, packed_samples=True)


def _call(record: EngineRecord, index: int) -> tuple[Call, np.ndarray | None]:
    request = record.request
    packed = request.get("input_ids") if isinstance(request, dict) else None
    if isinstance(packed, PackedIds) and isinstance(request, dict):  # the view would build the list; the audit
        record.request = {**request, "input_ids": None}  # reads the bytes
    view = record_view(record)
    if isinstance(packed, PackedIds):
        prompt: np.ndarray | None = np.frombuffer(packed.packed, dtype=U32)
        if view.channel_error and isinstance(request, dict):  # routes need the prompt's length: read them again
            view.prompt_ids, view.channel_error = prompt, ""  # type: ignore[assignment]  # only its length is read
            response = record.response if isinstance(record.response, dict) else {}
            read_sglang(view, request, object_at(response, "meta_info"))
        view.prompt_ids = None
    else:
        prompt = np.asarray(view.prompt_ids, dtype=U32) if view.prompt_ids is not None else None
        view.prompt_ids = None
    output = np.asarray(view.output_ids, dtype=U32) if view.output_ids else EMPTY
    view.output_ids = None
    logprobs = None
    if view.logprobs is not None:
        logprobs = np.array(view.logprobs, dtype=np.float64)  # a None (no logprob) becomes NaN
    view.logprobs = None
    call = Call(
        record.seq,
        index,
        record.path,
        record.status,
        record.error,
        view,
        None if prompt is None else len(prompt),
        None if prompt is None else digest(prompt),
        output,
        logprobs,
    )
    if record.order is not None and len(record.order) == 2:
        call.order = (record.order[0], record.order[1])
    return call, prompt


HELD_CALL = "feed:held-chat-call"  # in `SessionState.notes`: a chat call waiting for its `/tokenize`
TOKENIZE_PATH = "/tokenize"


def awaits_tokenize(record: EngineRecord) -> bool:
    """A chat call answered with no prompt ids, whose prompt the gateway asks next from vLLM's `/tokenize` (NeMo
    Gym's default: `return_tokens_as_token_ids` names the output, `/tokenize` the prompt)."""
    response, request = record.response, record.request
    return (
        record.path.rstrip("/").endswith("/chat/completions")
        and record.status == 200
        and isinstance(request, dict)
        and isinstance(request.get("messages"), list)
        and bool(request.get("return_tokens_as_token_ids"))
        and isinstance(response, dict)
        and response.get("prompt_token_ids") is None
    )


def tokenized_prompt(record: Any, held: EngineRecord) -> np.ndarray | None:
    """The prompt ids `record` names for `held`: the answer of a `/tokenize` of the same messages, else None."""
    if not (isinstance(record, EngineRecord) and record.path.rstrip("/").endswith(TOKENIZE_PATH)):
        return None
    request, response = record.request, record.response
    if record.status != 200 or not isinstance(request, dict) or not isinstance(response, dict):
        return None
    tokens = response.get("tokens")
    if request.get("messages") != (held.request or {}).get("messages") or not isinstance(tokens, list):
        return None
    try:
        return np.asarray(tokens, dtype=U32)
    except (TypeError, ValueError, OverflowError):
        return None


class Feed:
    """The rule families fed one cassette's records in file order (module docstring): by `stream` from a file, or
    by a recording as it writes them (`tito_rl.replayer.audit.live`), so both count the same findings."""

    def __init__(self, header: Header, families: list[RuleFamily], findings: Findings) -> None:
        self.header, self.families, self.findings = header, families, findings
        self.states: dict[str, SessionState] = {}

    def state_of(self, name: str) -> SessionState:
        found = self.states.get(name)
        if found is None:
            found = self.states[name] = SessionState(name, self.header)
            self.findings.figure(name)
        return found

    def feed(self, record: Any) -> None:
        if isinstance(record, EngineEvent):  # no session's: every family may judge its sessions by it
            for family in self.families:
                family.engine_event(record)
            return
        state = self.states.get(getattr(record, "session", None) or "")
        held = state.notes.pop(HELD_CALL, None) if state is not None else None
        if held is not None:  # a chat call with no prompt ids: the `/tokenize` of its messages (next) names them
            self._engine(held, tokenized_prompt(record, held))
        if isinstance(record, EngineRecord) and awaits_tokenize(record):
            self.state_of(record.session).notes[HELD_CALL] = record
            return
        self._feed(record)

    def _engine(self, record: EngineRecord, tokenized: np.ndarray | None = None) -> None:
        state = self.state_of(record.session)
        call, prompt = _call(record, state.calls)
        if prompt is None and tokenized is not None:
            prompt, call.prompt_len, call.prompt_digest = tokenized, len(tokenized), digest(tokenized)
        state.calls += 1
        self.findings.figure(state.name).engine_calls += 1
        if prompt is not None and call.generates:  # an abort this call continues is a generation after all
            before = next((c for c in reversed(state.pending) if c.generates), None)
            if before is not None and before.continued_by(prompt):
                before.continued = True
        call.record = record  # read by the channel rules while the call is fed (replayer/audit/channels)
        for family in self.families:
            family.call(state, call, prompt)
        call.record = None
        state.pending.append(call)
        state.since_finish.append(call)

    def _feed(self, record: Any) -> None:
        families, findings = self.families, self.findings
        if isinstance(record, EngineRecord):
            self._engine(record)
        elif isinstance(record, AgentRecord):
            state = self.state_of(record.session)
            exchange = Exchange(state.exchanges, record, state.pending, seq=record.seq)
            state.exchanges += 1
            findings.figure(state.name).exchanges += 1
            state.pending = []
            for call in exchange.calls:
                call.exchange, call.side = exchange.index, record.side
                for example in call.examples:
                    example.exchange = exchange.index
                call.examples = []
            exchange.retry_of = record.retry_of
            answer = exchange.answer
            exchange.regenerated = (
                exchange.retry_of is not None and answer is not None and exchange.retry_of in state.answered
            )
            if answer is not None and exchange.index not in state.answered:
                state.answered[exchange.index] = (answer.seq, answer.output[:48].copy())
            for family in families:
                family.exchange(state, exchange)
            exchange.record = None
            state.finish_exchanges[exchange.index] = exchange
        elif isinstance(record, SamplesRecord | DropRecord):
            state = self.state_of(record.session)
            finish = Finish(
                record if isinstance(record, SamplesRecord) else None, state.since_finish, state.finish_exchanges
            )
            for family in families:
                family.finish(state, finish)
            # a finished session's chains and calls are let go: memory follows the sessions live at once
            state.since_finish, state.finish_exchanges, state.answered = [], {}, {}
            state.breaks, state.notes = {}, {}
        else:  # a session's start
            self.state_of(record.session)

    def end(self, before: Callable[[SessionState], None] | None = None) -> None:
        """The cassette ended: each session's calls after its last finish go to the families' `end`; `before(state)`
        is told each session first."""
        for state in list(self.states.values()):
            held = state.notes.pop(HELD_CALL, None)
            if held is not None:  # the cassette ended before its `/tokenize`
                self._engine(held)
        for state in self.states.values():
            if before is not None:
                before(state)
            for family in self.families:
                family.end(state)


def stream(
    path: str | Path, families: list[RuleFamily], findings: Findings, progress: Callable[[int], None] | None = None
) -> StreamResult:
    """Read `path` once, feeding each record to every rule family (module docstring). `progress(bytes_read)` hears
    how far the pass has got at each session's end."""
    with CassetteReader(path) as reader:
        feed = Feed(reader.header, families, findings)
        for record in records(reader):
            feed.feed(record)
            if progress is not None and isinstance(record, SamplesRecord | DropRecord):
                progress(reader.bytes_read)
        feed.end()
        if progress is not None:
            progress(reader.bytes_read)
        return StreamResult(reader.header, reader.truncated, len(feed.states))


class _Sampling(msgspec.Struct):
    """The top-level keys of an agent's request that say how to sample (`requests.client_sampling` reads them)."""

    generationConfig: Any = None  # noqa: N815 - Gemini's name
    max_tokens: Any = None
    max_completion_tokens: Any = None
    max_output_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    stop: Any = None
    stop_sequences: Any = None


_SAMPLING = msgspec.json.Decoder(_Sampling)


def request_sampling(record: AgentRecord) -> dict[str, Any]:
    """The agent's request body's sampling keys that are set (not null); {} when it is not a JSON object. A body
    holds the whole conversation: msgspec skips every other key without building it, where a whole parse (orjson)
    was an eighth of an audit's time, and the stdlib's a fifth before that."""
    try:
        found = _SAMPLING.decode(bytes(record.body) or b"{}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}
    return {k: v for k in found.__struct_fields__ if (v := getattr(found, k)) is not None}
