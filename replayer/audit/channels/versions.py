"""Weight versions: `version-uncovered`, `stale-tokens`, `aborted-by-update`, `version-not-current`.

Each answer says which weights generated its output (`weight_versions` spans over the output positions, or one
`weight_version`); the audit reads the spans as sent, since the dialect view falls back to the final version where
they do not cover the output. Versions are ordered as integers where they all parse, else by first appearance in
the session. A weight update is seen where the recording holds it in the session (an `/update_weight_version`
with `abort_all_requests` (SGLang's default), `/pause_generation` in abort mode, vLLM's `/pause`), where it holds
it as an engine-wide event (format version 7: a trainer's update, pause or abort made on the engine directly,
placed among the sessions' calls by the recorder's engine counter, `EngineRecord.order`), or by its mark on the
traffic: an abort the gateway did not ask for (no `/abort_request` with its rid), after which the session's next
generation names another version.

With the calls placed on that counter, each output span is also held to the updates recorded: a call that started
after an update ended runs on the version that update made current, or on one an update made while it ran; any
other version is `version-not-current`. Before the first recorded update the version is not knowable, and a call
is not judged. Events are written as they are answered, so they may come after the calls they ran beside: what
depends on them is judged at the cassette's end (at its close, live).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tito_rl.cassette.format.records import EngineEvent
from tito_rl.replayer.audit.channels.reading import generated, notes, sample_tokens, traced
from tito_rl.replayer.audit.protocol import Example, Findings, Side
from tito_rl.replayer.audit.traffic import Call, Finish, RuleFamily, SessionState
from tito_rl.trajectory.dialects.view import SGLANG, VLLM_GENERATE, VLLM_OPENAI

ABORT_PATHS = ("/abort_request", "/abort_requests")
VERSION = "weight-version"  # `SessionState.notes` key: the first version the session's calls named
# Updates that set a version (SGLang's weight loaders take `weight_version`; `abort_all_requests` defaults false)
LOADER_PATHS = (
    "/update_weights_from_disk",
    "/update_weights_from_distributed",
    "/update_weights_from_tensor",
    "/update_weights_from_ipc",
    "/update_weights",
)


@dataclass(frozen=True)
class Update:
    """A weight update, pause or abort placed on the engine counter: `[start, end]`, the version it made current
    (None: it names none), whether it aborted every request in flight, and whether it was no session's."""

    start: int
    end: int
    path: str
    version: str | None
    aborts: bool
    wide: bool


@dataclass(frozen=True)
class Placed:
    """A generation placed on the engine counter, with its output spans as sent (kept only where a version looks
    wrong when it is read: `wrong_spans`)."""

    seq: int
    start: int
    end: int
    spans: tuple[tuple[str, int, int], ...]
    length: int


def update_of(
    path: str, request: Any, status: int, order: Any, vllm: bool, wide: bool, response: Any = None
) -> Update | None:
    """What an admin call did, where it is one that changes the version or aborts everything; None otherwise."""
    if status != 200 or not isinstance(order, list | tuple) or len(order) != 2:
        return None
    body = request if isinstance(request, dict) else {}
    bare, _, query = path.partition("?")
    bare = bare.rstrip("/")
    version: Any = None
    if bare.endswith("/update_weight_version"):
        # vLLM's aborts nothing; an engine-wide one says which engine by its answer (SGLang's has a message)
        vllm_answer = vllm or (isinstance(response, dict) and "message" not in response)
        version, aborts = body.get("new_version"), body.get("abort_all_requests", True) is not False and not vllm_answer
    elif bare.endswith(LOADER_PATHS):
        version, aborts = body.get("weight_version"), body.get("abort_all_requests", False) is True
    elif bare.endswith("/pause_generation"):
        aborts = body.get("mode", "abort") == "abort"
    elif bare.endswith("/pause"):
        modes = [part.partition("=")[2] for part in query.split("&") if part.startswith("mode=")]
        aborts = (modes[-1] if modes else body.get("mode", "abort")) == "abort"
    elif bare.endswith("/abort_request"):
        aborts = body.get("abort_all") is True
    else:
        return None
    return Update(int(order[0]), int(order[1]), bare, version if isinstance(version, str) else None, aborts, wide)


def sent_spans(raw: Any) -> tuple[tuple[str, int, int], ...]:
    """The well-formed spans of an answer, as sent."""
    if not isinstance(raw, list):
        return ()
    out = []
    for span in raw:
        if isinstance(span, dict) and isinstance(span.get("version"), str):
            start, end = span.get("start"), span.get("end")
            if type(start) is int and type(end) is int and end > start:
                out.append((span["version"], start, end))
    return tuple(out)


def raw_spans(call: Call) -> Any:
    """The `weight_versions` spans as the answer sent them (None: it sent none)."""
    record = call.record
    response = record.response if record is not None else None
    if isinstance(response, list):  # an OpenAI-style stream, kept chunk by chunk: its last says the most
        response = next((c for c in reversed(response) if isinstance(c, dict)), None)
    if not isinstance(response, dict):
        return None
    dialect = call.view.dialect
    if dialect in (SGLANG, None):
        meta = response.get("meta_info")
        return meta.get("weight_versions") if isinstance(meta, dict) else None
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    if "weight_versions" in choice:
        return choice["weight_versions"]
    metadata = response.get("metadata")
    return metadata.get("weight_versions") if isinstance(metadata, dict) else None


def uncovered(spans: Any, n: int) -> int:
    """Output positions `[0, n)` no well-formed span covers (plain Python: one span or two, on every call)."""
    if not isinstance(spans, list):
        return n
    pieces = []
    for span in spans:
        if isinstance(span, dict) and isinstance(span.get("version"), str):
            start, end = span.get("start"), span.get("end")
            if type(start) is int and type(end) is int and end > start:
                pieces.append((max(start, 0), min(end, n)))
    covered, reach = 0, 0
    for start, end in sorted(pieces):
        start = max(start, reach)
        if end > start:
            covered, reach = covered + end - start, end
    return n - covered


def ranks(versions: set[str], order: dict[str, int]) -> dict[str, int]:
    """Each version's place: its integer value where every one parses, else its first appearance in the session."""
    try:
        return {v: int(v) for v in versions}
    except ValueError:
        return {v: order.get(v, len(order)) for v in versions}


class VersionRules(RuleFamily):
    rules = ("version-uncovered", "stale-tokens", "aborted-by-update")

    def __init__(self, findings: Findings, max_staleness: int | None = None) -> None:
        self.findings = findings
        self.max_staleness = max_staleness
        self.updates: list[Update] = []  # every update of the cassette placed on the engine counter
        self.placed: dict[str, list[Placed]] = {}  # session -> generations wrong when read, judged at the end
        self.deferred: dict[str, list[tuple[Call, str | None, str, str | None, str | None]]] = {}
        self.stale_tokens: dict[str, int] = {}  # session -> tokens beyond --max-staleness (live metrics)

    def engine_event(self, event: EngineEvent) -> None:
        self.findings.channels = True  # a recording of a trainer's updates: the version rules are listed
        update = update_of(event.path, event.request, event.status, event.order, False, True, event.response)
        if update is not None:
            self.updates.append(update)

    def call(self, state: SessionState, call: Call, prompt: np.ndarray | None) -> None:
        record = call.record
        if not call.generates:
            if record is not None:
                self._admin(state, call)
            return
        view = call.view
        if call.order is not None and record is not None and self.updates:
            placed = Placed(call.seq, call.order[0], call.order[1], sent_spans(raw_spans(call)), len(call.output))
            if wrong_spans(placed, self.updates) is not None:  # judged at the end, with the updates read by then
                self.placed.setdefault(state.name, []).append(placed)
        spans = view.weight_versions
        first = state.notes.get(VERSION)
        if spans and first is None:
            first = state.notes[VERSION] = spans[0].version
        if state.channels is not None or call.aborted or any(s.version != first for s in spans):
            mine = notes(state)  # past here only once a session shows more than one version, or an abort
            if first is not None:
                mine.order.setdefault(first, len(mine.order))
            if view.dialect in (VLLM_GENERATE, VLLM_OPENAI):
                mine.vllm = True
            for span in spans:
                mine.order.setdefault(span.version, len(mine.order))
            if spans:
                if not call.aborted:
                    mine.first_version[call.index] = spans[0].version
                mine.last_version[call.index] = spans[-1].version
        raw = raw_spans(call)
        if raw is not None and len(call.output):
            missing = uncovered(raw, len(call.output))
            if missing:
                self.findings.channels = True
                example = None
                if self.findings.wants_example("version-uncovered"):
                    example = Example(
                        state.name,
                        None,
                        call.seq,
                        None,
                        f"engine call seq {call.seq}: {missing} of {len(call.output)} output token(s) in no "
                        "weight-version span",
                        [Side("spans", str(raw)[:120])],
                    )
                    call.examples.append(example)
                self.findings.add("version-uncovered", state.name, missing, None, example)
        if call.aborted and record is not None:
            request = record.request if isinstance(record.request, dict) else {}
            rid = request.get("rid")
            notes(state).aborted.append(
                (call, record.started_s, record.started_s + record.duration_s, str(rid) if rid else None)
            )

    def _admin(self, state: SessionState, call: Call) -> None:
        record = call.record
        assert record is not None
        path, request = call.path, record.request if isinstance(record.request, dict) else {}
        mine = notes(state)
        if path.endswith(ABORT_PATHS):
            rids = [request.get("rid"), *(request.get("request_ids") or [])]
            mine.gateway_aborts.update(str(r) for r in rids if r)
            return
        if path.endswith("/update_weight_version"):
            aborts = request.get("abort_all_requests", True) is not False and not mine.vllm
        elif path.endswith("/pause_generation") or path.endswith("/pause"):
            aborts = request.get("mode", "abort") == "abort"
        else:
            return
        self.findings.channels = True
        if aborts and record.status == 200:
            mine.updates.append((record.started_s, record.started_s + record.duration_s, path))
        placed = update_of(path, request, record.status, record.order, mine.vllm, False, record.response)
        if placed is not None:  # a session's own update changes the version for every session
            self.updates.append(placed)

    def finish(self, state: SessionState, finish: Finish) -> None:
        mine = state.channels
        if mine is None:
            return
        self._aborts(state)
        record = finish.record
        if self.max_staleness is None or record is None or len(mine.order) < 2 or not isinstance(record.samples, list):
            return
        calls = generated(finish.calls)
        for number, sample in enumerate(record.samples):
            if isinstance(sample, dict):
                self._stale(state, record.seq, number, sample, calls)

    def end(self, state: SessionState) -> None:
        if state.channels is not None:
            self._aborts(state)
        for call, kind, detail, before, after in self.deferred.pop(state.name, []):
            assert call.order is not None
            wide = next((u for u in self.updates if u.wide and u.aborts and overlaps(u, *call.order)), None)
            if wide is not None:
                what = "engine-wide abort" if wide.path.endswith("/abort_request") else "engine-wide update"
                kind, detail = what, f"{wide.path} (engine-wide, no session's) made while it ran"
            if kind is not None:
                self._aborted(state, call, kind, detail, before, after)
        self._not_current(state, self.placed.pop(state.name, []))

    def _not_current(self, state: SessionState, placed: list[Placed]) -> None:
        """Each placed generation's spans held to the versions the recorded updates made current (module
        docstring)."""
        for call in placed:
            judged = wrong_spans(call, self.updates)
            if judged is None:
                continue
            wrong, current, allowed = judged
            count = sum(min(b, call.length) - a for _, a, b in wrong)
            example = None
            if self.findings.wants_example("version-not-current"):
                example = Example(
                    state.name,
                    None,
                    call.seq,
                    wrong[0][1],
                    f"engine call seq {call.seq}: {count} output token(s) of version {wrong[0][0]}, where the "
                    f"recorded updates made {current} current",
                    [Side("versions allowed", ", ".join(sorted(v for v in allowed if v is not None)))],
                )
            self.findings.add("version-not-current", state.name, count, None, example)

    def _stale(self, state: SessionState, seq: int, number: int, sample: dict[str, Any], calls: list[Call]) -> None:
        assert self.max_staleness is not None
        mine = notes(state)
        versions: set[str] = {v for v in sample.get("weight_versions") or () if isinstance(v, str) and v}
        for _, i, n in traced(calls, sample_tokens(sample)):
            versions.update(s.version for s in calls[i].view.weight_versions if s.start < n)
        if len(versions) < 2:
            return
        placed = ranks(versions, mine.order)
        oldest, newest = min(versions, key=placed.__getitem__), max(versions, key=placed.__getitem__)
        staleness = placed[newest] - placed[oldest]
        if staleness <= self.max_staleness:
            return
        self.findings.channels = True
        behind = 0  # the sample's traced tokens of versions more than --max-staleness behind its newest
        for _, i, n in traced(calls, sample_tokens(sample)):
            for span in calls[i].view.weight_versions:
                if span.start < n and placed.get(span.version, placed[newest]) < placed[newest] - self.max_staleness:
                    behind += min(span.end, n) - span.start
        self.stale_tokens[state.name] = self.stale_tokens.get(state.name, 0) + behind
        example = None
        if self.findings.wants_example("stale-tokens"):
            example = Example(
                state.name,
                None,
                seq,
                None,
                f"sample {number}: tokens of versions {oldest} to {newest}, {staleness} apart (--max-staleness "
                f"{self.max_staleness}; {behind} token(s) beyond it)",
                [Side("versions", ", ".join(sorted(versions, key=placed.__getitem__)))],
            )
        self.findings.add("stale-tokens", state.name, 1, None, example)

    def _aborts(self, state: SessionState) -> None:
        """Each abort judged once the session's finish (or the cassette's end) is read: the update may be
        recorded after the aborted answer, and the next generation names the version it was made with."""
        mine = notes(state)
        pending, mine.aborted = mine.aborted, []
        for call, started, ended, rid in pending:
            if (rid is not None and rid in mine.gateway_aborts) or call.continued:
                continue  # the gateway's own abort, or one it continued: no work thrown away
            update = next((u for u in mine.updates if started <= u[0] <= ended), None)
            before = mine.last_version.get(call.index)
            after = next((v for i, v in sorted(mine.first_version.items()) if i > call.index), None)
            kind: str | None = None
            detail = ""
            if update is not None:
                kind, detail = "update recorded", f"{update[2]} (abort all) made while it ran"
            elif before is not None and after is not None and after != before:
                kind, detail = "version changed", f"the session's next generation is of version {after}, not {before}"
            if call.order is not None and update is None:  # an engine-wide update may be read later: at the end
                self.deferred.setdefault(state.name, []).append((call, kind, detail, before, after))
            elif kind is not None:
                self._aborted(state, call, kind, detail, before, after)
        mine.first_version, mine.last_version = {}, {}  # judged: an abort after this finish needs later calls only

    def _aborted(
        self, state: SessionState, call: Call, kind: str, detail: str, before: str | None, after: str | None
    ) -> None:
        example = None
        if self.findings.wants_example("aborted-by-update"):
            example = Example(
                state.name,
                call.exchange,
                call.seq,
                None,
                f"engine call seq {call.seq} aborted after {len(call.output)} token(s): {detail}",
                [Side("version", f"{before or '?'} → {after or '?'}")],
            )
        self.findings.add("aborted-by-update", state.name, 1, kind, example)


def wrong_spans(call: Placed, updates: list[Update]) -> tuple[list[tuple[str, int, int]], str, set[str]] | None:
    """The call's spans of a version no recorded update made current while it ran, with the version current at
    its start and the versions allowed; None where none is wrong, or where no update ended before it started (not
    knowable). An update that ended before the call started was written before the call's record (each is written
    once answered), so a call judged wrong when read can only be cleared by an update read later that ran beside
    it: the rules keep only those calls, and judge them again at the end."""
    before = max((u for u in updates if u.version is not None and u.end < call.start), key=_ended, default=None)
    if before is None or before.version is None:
        return None
    allowed = {before.version} | {
        u.version for u in updates if u.version is not None and overlaps(u, call.start, call.end)
    }
    wrong = [(v, a, b) for v, a, b in call.spans if v not in allowed and a < call.length]
    return (wrong, before.version, allowed) if wrong else None


def _ended(update: Update) -> tuple[int, int]:
    return (update.end, update.start)


def overlaps(update: Update, start: int, end: int) -> bool:
    """Whether the update ran while the call did (their spans on the engine counter meet)."""
    return update.start < end and update.end > start
