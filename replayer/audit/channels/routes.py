"""Expert routes (MoE routing replay): `routes-never-asked`, `routes-missing`, `routes-misaligned`,
`routes-differ`, `routes-invalid`.

An engine call's rows are read by the dialect view (`trajectory.channels`: SGLang's flat int32 from the request's
`routed_experts_start_len`, vLLM's `.npy`); a sample's `rollout_routed_experts` is `[len(tokens) - 1, layers,
top_k]`. A sample's row t is checked against the engine's row for t where a call traced into the sample (its prompt
and output are the sample's tokens there, `traffic.traced_calls`) routed t: a row depends on its token's prefix
only, so every call over the same prefix routed it alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tito_rl.replayer.audit.channels.reading import (
    ASKING_DIALECTS,
    NO_ROW,
    ROUTES_FLAG,
    SERVER_INFO_PATHS,
    EngineRows,
    bad_rows,
    experts_of,
    generated,
    header_serves_routes,
    notes,
    placed_rows,
    sample_routes,
    sample_tokens,
    top_k_of,
    traced,
)
from tito_rl.replayer.audit.protocol import Example, Findings, Side
from tito_rl.replayer.audit.traffic import Call, Finish, RuleFamily, SessionState
from tito_rl.trajectory.channels import ChannelError, int32_array
from tito_rl.trajectory.dialects.view import SGLANG, VLLM_GENERATE, VLLM_OPENAI

UNASKED = "routes-unasked"  # `SessionState.notes` key: generations that did not ask, until the engine is known


def _row_text(row: np.ndarray) -> str:
    return "[" + " ".join(str(int(v)) for v in row[:16]) + (" …]" if len(row) > 16 else "]")


class RouteRules(RuleFamily):
    rules = ("routes-never-asked", "routes-missing", "routes-misaligned", "routes-differ", "routes-invalid")

    def __init__(self, findings: Findings) -> None:
        self.findings = findings
        self.header_known: bool | None = None
        self.experts: int | None = None
        self.top_k: int | None = None  # the model's experts per token, where the header says it

    # ---- engine calls ----

    def call(self, state: SessionState, call: Call, prompt: np.ndarray | None) -> None:
        view = call.view
        if self.header_known is None:
            self.header_known = header_serves_routes(state.header)
            self.experts, self.top_k = experts_of(state.header), top_k_of(state.header)
        if not call.generates:
            if call.path.endswith(SERVER_INFO_PATHS) and call.record is not None:
                info = call.record.response
                if isinstance(info, dict) and info.get(ROUTES_FLAG) is True:
                    self._serves(state, f"its {call.path} (seq {call.seq}) says {ROUTES_FLAG}")
            return
        routes_error = "routed_experts" in view.channel_error
        if view.routes is None and not view.routes_asked and not routes_error:
            if view.dialect in ASKING_DIALECTS and not call.failed:
                self._unasked(state, call)
            return
        self.findings.channels = True
        mine = notes(state)
        if view.routes is not None and not view.routes_asked and view.dialect in (VLLM_GENERATE, VLLM_OPENAI):
            self._serves(state, f"it answered routes unasked (seq {call.seq})")
        if view.routes is None:
            if "negative expert id" in view.channel_error:
                self._negative(state, call)
            elif routes_error:
                self._misaligned_engine(state, call)
            elif not call.failed and not view.channel_error and not (call.aborted and not len(call.output)):
                expected = (call.prompt_len or 0) + len(call.output) - 1 - _start(call)
                self.findings.add(
                    "routes-missing",
                    state.name,
                    max(expected, 1),
                    "engine",
                    self._call_example("routes-missing", state, call, "routes asked, the engine's answer has none"),
                )
            return
        routes = view.routes
        rows = routes.rows.astype(np.int64)
        if mine.width is None:
            mine.width = routes.width
        elif routes.width != mine.width and self._misaligned_engine(state, call):
            return
        self._check_rows(state, call, rows, routes.top_k or self.top_k, routes.start, "engine")
        mine.rows[call.index] = EngineRows(routes.start, rows, routes.top_k)

    def _serves(self, state: SessionState, why: str) -> None:
        self.findings.channels = True
        mine = notes(state)
        if mine.serves_routes is None:
            mine.serves_routes = why
            for call, asked in state.notes.pop(UNASKED, ()):
                self._never_asked(state, call, why, asked)

    def _unasked(self, state: SessionState, call: Call) -> None:
        asked = _asked(call)
        if self.header_known:
            self.findings.channels = True
            self._never_asked(state, call, "the recording's engine info says " + ROUTES_FLAG, asked)
            return
        mine = state.channels
        if mine is not None and mine.serves_routes is not None:
            self._never_asked(state, call, mine.serves_routes, asked)
        else:  # in the session's notes, let go at its finish with its calls
            state.notes.setdefault(UNASKED, []).append((call, asked))

    def _never_asked(self, state: SessionState, call: Call, why: str, asked: str) -> None:
        example = None
        if self.findings.wants_example("routes-never-asked"):
            example = Example(
                state.name,
                call.exchange,
                call.seq,
                None,
                f"engine call seq {call.seq} did not ask return_routed_experts; the engine serves routes ({why})",
                [Side("asked", asked)],
            )
            call.examples.append(example)
        self.findings.add("routes-never-asked", state.name, 1, None, example)

    def _misaligned_engine(self, state: SessionState, call: Call) -> bool:
        """An answer's rows that do not fit the call's tokens from its start; True when it was one."""
        mine = notes(state)
        start = _start(call)
        expected = (call.prompt_len or 0) + len(call.output) - 1 - start
        detail = call.view.channel_error or "rows of another width than the session's"
        kind = "engine rows"
        flat = _raw_flat(call)
        if flat is not None and mine.width:
            if flat.size % mine.width:
                return False if not call.view.channel_error else self._add_misaligned(state, call, kind, detail)
            got = flat.size // mine.width
            if got == expected:
                return False
            if start and got == expected + start:
                kind = "start ignored"
                detail = (
                    f"{got} rows from token 0 where routed_experts_start_len={start} asks for {expected}: the "
                    "engine ignored the start, a reader appending at it holds the prefix twice"
                )
                mine.rows[call.index] = EngineRows(0, flat.reshape(got, mine.width).astype(np.int64), None)
            else:
                detail = f"{got} rows where the call's tokens from {start} call for {expected}"
                if got > expected:  # rows past the tokens: padding for the never-forwarded last token, or uncut
                    self._check_rows(
                        state,
                        call,
                        flat.reshape(got, mine.width)[expected:].astype(np.int64),
                        self.top_k,
                        start + expected,
                        "engine",
                    )
        return self._add_misaligned(state, call, kind, detail)

    def _negative(self, state: SessionState, call: Call) -> None:
        """An answer with an id below 0 (the decoder refuses it): its rows out of range, where they can be told."""
        flat, width = _raw_flat(call), notes(state).width
        if flat is not None and width and flat.size % width == 0:
            self._check_rows(state, call, flat.reshape(-1, width).astype(np.int64), self.top_k, _start(call), "engine")
            return
        example = self._call_example("routes-invalid", state, call, f"engine: {call.view.channel_error}")
        self.findings.add("routes-invalid", state.name, 1, "out of range", example)

    def _add_misaligned(self, state: SessionState, call: Call, kind: str, detail: str) -> bool:
        self.findings.add(
            "routes-misaligned",
            state.name,
            1,
            kind,
            self._call_example("routes-misaligned", state, call, f"engine call seq {call.seq}: {detail}"),
        )
        return True

    def _check_rows(
        self,
        state: SessionState,
        call: Call | None,
        rows: np.ndarray,
        top_k: int | None,
        start: int,
        where: str,
        seq: int | None = None,
        exchange: int | None = None,
    ) -> None:
        for kind, mask in bad_rows(rows, top_k, self.experts).items():
            at = int(np.flatnonzero(mask)[0])
            example = None
            if self.findings.wants_example("routes-invalid"):
                example = Example(
                    state.name,
                    call.exchange if call is not None else exchange,
                    call.seq if call is not None else seq,
                    start + at,
                    f"{where}: {int(mask.sum())} route row(s) {kind}, first for token {start + at}",
                    [Side(f"{where} row", _row_text(rows[at]))],
                )
                if call is not None:
                    call.examples.append(example)
            self.findings.add("routes-invalid", state.name, int(mask.sum()), kind, example)

    def _call_example(self, rule: str, state: SessionState, call: Call, detail: str) -> Example | None:
        if not self.findings.wants_example(rule):
            return None
        example = Example(state.name, call.exchange, call.seq, None, detail)
        call.examples.append(example)
        return example

    # ---- samples ----

    def finish(self, state: SessionState, finish: Finish) -> None:
        mine = state.channels
        rows_of = mine.rows if mine is not None else {}
        record = finish.record
        if record is not None and isinstance(record.samples, list):
            calls = None
            for number, sample in enumerate(record.samples):
                if not isinstance(sample, dict):
                    continue
                raw = sample.get("rollout_routed_experts")
                if raw is None and not rows_of:
                    continue
                if calls is None:
                    calls = generated(finish.calls)
                self._sample(state, record.seq, number, sample, raw, calls, rows_of)
        if mine is not None:
            mine.rows = {}

    def _sample(
        self,
        state: SessionState,
        seq: int,
        number: int,
        sample: dict[str, Any],
        raw: Any,
        calls: list[Call],
        rows_of: dict[int, Any],
    ) -> None:
        self.findings.channels = True
        tokens = sample_tokens(sample)
        n_rows = max(len(tokens) - 1, 0)
        found = traced(calls, tokens)
        width = notes(state).width
        placed = placed_rows(calls, found, rows_of, n_rows, width) if width else None
        routed = placed[:, 0] != NO_ROW if placed is not None and placed.size else np.zeros(n_rows, dtype=bool)
        if raw is None:
            if routed.any():
                count = int(routed.sum())
                self.findings.add(
                    "routes-missing",
                    state.name,
                    count,
                    "sample",
                    self._sample_example(
                        "routes-missing",
                        state,
                        seq,
                        int(np.flatnonzero(routed)[0]),
                        f"sample {number} has no rollout_routed_experts; the engine routed {count} of its tokens",
                    ),
                )
            return
        read = sample_routes(raw)
        if read is None:
            self._sample_misaligned(state, seq, number, "rollout_routed_experts is not an integer array")
            return
        rows, top_k = read
        if len(rows) != n_rows:
            more = "more: not cut with the tokens" if len(rows) > n_rows else "fewer"
            self._sample_misaligned(
                state,
                seq,
                number,
                f"{len(rows)} route rows for {len(tokens)} tokens (len(tokens) - 1 = {n_rows}; {more})",
            )
        m = min(len(rows), n_rows)
        if width and rows.shape[1] not in (width, 0) and m:
            self._sample_misaligned(state, seq, number, f"{rows.shape[1]} ids a row where the engine sent {width}")
            return
        rows = rows[:m]
        self._check_rows(state, None, rows, top_k or self._top_k(rows_of) or self.top_k, 0, f"sample {number}", seq)
        if placed is None or not m:
            return
        engine, routed = placed[:m], routed[:m]
        unknown = (rows == -1).all(axis=1)
        missing = routed & unknown
        if missing.any():
            at = int(np.flatnonzero(missing)[0])
            self.findings.add(
                "routes-missing",
                state.name,
                int(missing.sum()),
                "rows",
                self._sample_example(
                    "routes-missing",
                    state,
                    seq,
                    at,
                    f"sample {number}: {int(missing.sum())} row(s) -1 where the engine routed the token, first {at}",
                    [Side("engine row", _row_text(engine[at]))],
                ),
            )
        differ = routed & ~unknown & (rows != engine).any(axis=1)
        if differ.any():
            self._differ(state, seq, number, rows, engine, differ, found, calls, routed)

    def _differ(
        self,
        state: SessionState,
        seq: int,
        number: int,
        rows: np.ndarray,
        engine: np.ndarray,
        differ: np.ndarray,
        found: list[tuple[int, int, int]],
        calls: list[Call],
        routed: np.ndarray,
    ) -> None:
        lasts = {p + n - 1 for p, i, n in found if n == len(calls[i].output)}  # a turn's last generated token
        known = {engine[t].tobytes(): t for t in np.flatnonzero(routed)[::-1]}
        kinds: dict[str, list[int]] = {}
        for t in (int(t) for t in np.flatnonzero(differ)):
            if t in lasts:
                kind = "last row"
            elif known.get(rows[t].tobytes(), t) != t:
                kind = "shifted"
            else:
                kind = "other"
            kinds.setdefault(kind, []).append(t)
        for kind, where in kinds.items():
            at = where[0]
            detail = (
                f"sample {number}: {len(where)} route row(s) other than the engine's ({kind}), first for token {at}"
            )
            if kind == "shifted":
                detail += f", the engine's row for token {known[rows[at].tobytes()]}"
            elif kind == "last row":
                detail += ", a turn's last generated token (its row comes from the next turn's prefill)"
            self.findings.add(
                "routes-differ",
                state.name,
                len(where),
                kind,
                self._sample_example(
                    "routes-differ",
                    state,
                    seq,
                    at,
                    detail,
                    [Side("sample row", _row_text(rows[at])), Side("engine row", _row_text(engine[at]))],
                ),
            )

    def _sample_misaligned(self, state: SessionState, seq: int, number: int, detail: str) -> None:
        self.findings.add(
            "routes-misaligned",
            state.name,
            1,
            "sample rows",
            self._sample_example("routes-misaligned", state, seq, None, f"sample {number}: {detail}"),
        )

    def _sample_example(
        self, rule: str, state: SessionState, seq: int, token: int | None, detail: str, sides: list[Side] | None = None
    ) -> Example | None:
        if not self.findings.wants_example(rule):
            return None
        return Example(state.name, None, seq, token, detail, sides or [])

    @staticmethod
    def _top_k(rows_of: dict[int, Any]) -> int | None:
        return next((r.top_k for r in rows_of.values() if r.top_k), None)


def _asked(call: Call) -> str:
    """What the request asked the engine to return beside the tokens (its top-level `return_*` flags set)."""
    request = call.record.request if call.record is not None else None
    flags = [k for k, v in request.items() if k.startswith("return_") and v] if isinstance(request, dict) else []
    return ", ".join(flags) or "(nothing beside the tokens)"


def _start(call: Call) -> int:
    request = call.record.request if call.record is not None else None
    value = request.get("routed_experts_start_len") if isinstance(request, dict) else None
    return value if type(value) is int and value >= 0 else 0


def _raw_flat(call: Call) -> np.ndarray | None:
    """SGLang's routes as sent (flat int32), for an answer the view could not place."""
    record = call.record
    response = record.response if record is not None else None
    if call.view.dialect not in (SGLANG, None) or not isinstance(response, dict):
        return None
    meta = response.get("meta_info")
    value = meta.get("routed_experts") if isinstance(meta, dict) else None
    if value is None:
        return None
    try:
        return int32_array(value, "routed_experts")
    except ChannelError:
        return None
