"""Weight versions: `version-uncovered`, `stale-tokens`, `aborted-by-update`.

Each answer says which weights generated its output (`weight_versions` spans over the output positions, or one
`weight_version`); the audit reads the spans as sent, since the dialect view falls back to the final version where
they do not cover the output. Versions are ordered as integers where they all parse, else by first appearance in
the session. A weight update is seen where the recording holds it in the session (an `/update_weight_version`
with `abort_all_requests` (SGLang's default), `/pause_generation` in abort mode, vLLM's `/pause`), or by its mark
on the traffic: an abort the gateway did not ask for (no `/abort_request` with its rid), after which the session's
next generation names another version.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tito_rl.replayer.audit.channels.reading import generated, notes, sample_tokens, traced
from tito_rl.replayer.audit.protocol import Example, Findings, Side
from tito_rl.replayer.audit.traffic import Call, Finish, RuleFamily, SessionState
from tito_rl.trajectory.dialects.view import SGLANG, VLLM_GENERATE, VLLM_OPENAI

ABORT_PATHS = ("/abort_request", "/abort_requests")
VERSION = "weight-version"  # `SessionState.notes` key: the first version the session's calls named


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

    def call(self, state: SessionState, call: Call, prompt: np.ndarray | None) -> None:
        record = call.record
        if not call.generates:
            if record is not None:
                self._admin(state, call)
            return
        view = call.view
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
        example = None
        if self.findings.wants_example("stale-tokens"):
            example = Example(
                state.name,
                None,
                seq,
                None,
                f"sample {number}: tokens of versions {oldest} to {newest}, {staleness} apart (--max-staleness "
                f"{self.max_staleness})",
                [Side("versions", ", ".join(sorted(versions, key=placed.__getitem__)))],
            )
        self.findings.add("stale-tokens", state.name, 1, None, example)

    def _aborts(self, state: SessionState) -> None:
        """Each abort judged once the session's finish (or the cassette's end) is read: the update may be
        recorded after the aborted answer, and the next generation names the version it was made with."""
        mine = notes(state)
        pending, mine.aborted = mine.aborted, []
        for call, started, ended, rid in pending:
            if rid is not None and rid in mine.gateway_aborts:
                continue
            update = next((u for u in mine.updates if started <= u[0] <= ended), None)
            before = mine.last_version.get(call.index)
            after = next((v for i, v in sorted(mine.first_version.items()) if i > call.index), None)
            if update is not None:
                kind, detail = "update recorded", f"{update[2]} (abort all) made while it ran"
            elif before is not None and after is not None and after != before:
                kind, detail = "version changed", f"the session's next generation is of version {after}, not {before}"
            else:
                continue
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
        mine.first_version, mine.last_version = {}, {}  # judged: an abort after this finish needs later calls only
