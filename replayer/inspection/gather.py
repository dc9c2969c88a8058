"""What `tito inspect` shows, gathered once for the text and the HTML views: a replay's linearizations,
per-exchange facts from the cassette's records, where each decision lands on a sample's tokens, and each
sample cut into coloured runs.

Nothing here re-implements replay or linearization: the samples, spans, events and trees come from
`replay_loaded` (the real adapter app and manager), the runs from the golden renderer's span runs, and the
pairing of engine calls with agent exchanges from `plan_session`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tito_rl.cassette.format.packing import PackedIds
from tito_rl.cassette.format.records import EngineRecord, Header
from tito_rl.cassette.reader import Cassette
from tito_rl.replayer.replay.plan import PlannedExchange, SessionPlan, plan_session
from tito_rl.replayer.replay.results import CassetteResult, FinishResult
from tito_rl.trajectory.dialects.registry import is_generation, record_view
from tito_rl.trajectory.dialects.view import object_at
from tito_rl.trajectory.golden import TokenizerNames, TokenNames, span_runs
from tito_rl.trajectory.linearize import Span
from tito_rl.trajectory.manager import Linearization
from tito_rl.trajectory.records import Sample


@dataclass
class ExchangeRow:
    """One agent exchange with the engine call that answered it, as the cassette recorded them."""

    index: int  # answer order among the session's agent exchanges
    turn: int | None
    status: int
    side: bool
    retry_of: int | None
    started_s: float
    duration_s: float
    engine_s: float | None  # all its engine calls, summed; None: it made none
    prompt_tokens: int | None  # of its last /generate call
    output_tokens: int | None
    finish: str | None  # stop, length, abort, or `engine <status>` when the engine answered an error
    output_ids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Placement:
    """Where a decision touches a sample: the token it is marked at (None: nowhere on the tokens)."""

    event: int  # index into the linearization's events
    sample: int | None
    token: int | None


@dataclass(frozen=True)
class TokenRun:
    """Consecutive tokens of one kind: prompt, context, masked or trained. `label` says which turn they belong
    to, as the tooltip shows it."""

    kind: str
    start: int
    end: int
    turn: int | None
    label: str
    realigned: bool = False


@dataclass
class SessionView:
    name: str
    exchanges: list[ExchangeRow]
    finishes: list[FinishResult]
    drops: int = 0
    skipped: str | None = None
    differences: list[str] = field(default_factory=list)  # what the replay found unlike the recording
    unanswered_engine_calls: int = 0

    def notes(self) -> list[str]:
        """What a reader must know before trusting the views below (the text and the HTML page say the same)."""
        notes = []
        if self.unanswered_engine_calls:
            notes.append(f"engine calls after the last exchange (never answered): {self.unanswered_engine_calls}")
        if self.skipped:
            notes.append(f"not replayed: {self.skipped}")
        if self.differences:
            notes.append(
                f"replay differs from the recording: {len(self.differences)} difference(s), first: "
                f"{self.differences[0]} (`tito replay` reports them)"
            )
        if self.drops:
            notes.append(f"dropped through the session API: {self.drops} time(s)")
        if not self.finishes and not self.skipped:
            notes.append("no samples: the session was dropped before any finish")
        return notes

    def outputs(self) -> dict[int, ExchangeRow]:
        """The exchange that generated each turn (the last one wins: a retry answered again)."""
        return {row.turn: row for row in self.exchanges if row.turn is not None and row.output_ids}


@dataclass
class Inspection:
    path: str
    header: Header
    truncated: bool
    sessions: list[SessionView]
    names: TokenNames


def inspect_cassette(
    path: str | os.PathLike[str],
    sessions: Iterable[str] | None = None,
    tokenizer: str | None = None,
    target: str | None = None,
    trust: bool = False,
) -> Inspection:
    """Replay (not strict: differences are noted, the linearizations kept) and gather the views' facts; `target`
    and `trust` as `ReplayOptions`' (`--target`, `--trust-cassette`). Raises `ReplayInputError` for unusable
    input, as `tito replay` does."""
    from tito_rl.replayer.replay.cassette_replay import replay_loaded, run_sync
    from tito_rl.replayer.replay.loading import load_cassette
    from tito_rl.replayer.replay.options import ReplayOptions

    cassette, folder = load_cassette(path, tokenizer, verify=False)  # the stored index: read only those sessions
    rows: dict[str, PlanRows] = {}  # taken from each plan the replay makes: a long session is read once

    def keep(plan: SessionPlan) -> None:
        rows[plan.name] = plan_rows(plan)

    options = ReplayOptions(strict=False, on_plan=keep, target=target, trust_cassette=trust)
    result = run_sync(replay_loaded(cassette, str(path), folder, sessions, options))
    return inspection_of(cassette, result, folder, rows)


def inspect_folder(
    folder: str | os.PathLike[str],
    sessions: Iterable[str] | None = None,
    tokenizer: str | None = None,
    target: str | None = None,
    trust: bool = False,
) -> Inspection:
    """A run's folder of cassettes (`tito record --rotate-sessions`) as one inspection: each cassette holding a
    session asked for (every one without `sessions`), in name order, under the first one's header."""
    from tito_rl.cassette.reader import open_cassette
    from tito_rl.cassette.writer import CASSETTE_SUFFIX
    from tito_rl.replayer.replay.loading import ReplayInputError

    paths = sorted(Path(folder).glob(f"*{CASSETTE_SUFFIX}"))
    if not paths:
        raise ReplayInputError(f"{folder}: no cassettes (*{CASSETTE_SUFFIX}) in this folder")
    wanted = None if sessions is None else list(sessions)
    parts: list[Inspection] = []
    found: set[str] = set()
    for path in paths:
        names = set(open_cassette(path, verify=False).sessions) if wanted is not None else set()
        here = None if wanted is None else [s for s in wanted if s in names]
        if here is None or here:
            found.update(here or ())
            parts.append(inspect_cassette(path, here, tokenizer, target, trust))
    missing = [s for s in wanted or () if s not in found]
    if missing:
        raise ReplayInputError(f"{folder}: no session {', '.join(map(repr, missing))} in its cassettes")
    first = parts[0]
    return Inspection(
        str(folder), first.header, any(p.truncated for p in parts), [v for p in parts for v in p.sessions], first.names
    )


PlanRows = tuple[list["ExchangeRow"], int]  # a session's exchange rows and its unanswered engine calls


def plan_rows(plan: SessionPlan) -> PlanRows:
    return [exchange_row(e) for e in plan.exchanges], plan.unanswered_engine_calls


def inspection_of(
    cassette: Cassette, result: CassetteResult, folder: str | None, rows: dict[str, PlanRows] | None = None
) -> Inspection:
    """The views' facts from a replay already made (not strict) of `cassette`; `rows`: the sessions' rows
    already taken from their plans (the others are read again)."""
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    views = []
    for session in result.sessions:
        exchanges, unanswered = (rows or {}).get(session.session) or plan_rows(
            plan_session(cassette.sessions[session.session])
        )
        found = session.differences + session.accepted
        views.append(
            SessionView(
                session.session,
                exchanges,
                session.finishes,
                session.drops,
                session.skipped,
                [f"{d.summary}" + (f" ({d.where()})" if d.where() else "") for d in found],
                unanswered,
            )
        )
    return Inspection(result.path, cassette.header, cassette.truncated, views, TokenizerNames(load_tokenizer(folder)))


def exchange_row(exchange: PlannedExchange) -> ExchangeRow:
    record = exchange.record
    calls = exchange.engine
    generates = [c for c in calls if is_generation(c.path)]
    row = ExchangeRow(
        exchange.index,
        record.turn_index,
        record.status,
        record.side,
        record.retry_of,
        record.started_s,
        record.duration_s,
        sum(c.duration_s for c in calls) if calls else None,
        None,
        None,
        None,
    )
    if generates:
        _read_generate(row, generates[-1])
    if record.method != "POST":
        row.notes.append(f"{record.method} {record.path}")
    if record.side:
        row.notes.append("side")
    if row.finish == "abort" or record.status == 499:
        row.notes.append("aborted")
    if record.retry_of is not None:
        row.notes.append(f"retry of #{record.retry_of}" + ("" if calls else ", answered from cache"))
    if len(generates) > 1:
        row.notes.append(f"{len(generates)} generate calls")
    others = sorted({c.path.rsplit("/", 1)[-1] for c in calls if not is_generation(c.path)})
    row.notes += others
    return row


def _read_generate(row: ExchangeRow, call: EngineRecord) -> None:
    """Through the dialect's view; a /generate prompt read packed is only counted (a long session's prompts
    are millions of ids)."""
    request = call.request or {}
    ids = request.get("input_ids")
    response = call.response if isinstance(call.response, dict) else {}
    meta = response.get("meta_info") or {}
    prompt_tokens = meta.get("prompt_tokens")
    if isinstance(ids, PackedIds):
        row.prompt_tokens, view = len(ids), record_view(replace(call, request={**request, "input_ids": []}))
    else:
        view = record_view(call)
        usage = object_at(response, "usage")
        prompt_tokens = prompt_tokens if type(prompt_tokens) is int else usage.get("prompt_tokens")
        row.prompt_tokens = (
            len(view.prompt_ids)
            if view.prompt_ids is not None
            else prompt_tokens
            if type(prompt_tokens) is int
            else None
        )
    if call.status != 200:
        row.finish = f"engine {call.status}"
        return
    row.output_ids = list(view.output_ids or [])
    row.output_tokens = len(row.output_ids)
    row.finish = view.finish_reason  # the recorded engine's answer: any shape


# --- decisions on tokens -----------------------------------------------------------------------------------


def place_events(lin: Linearization) -> list[Placement]:
    """Each decision at the first sample (of its leaf, when it names one) that holds its turn: at its token
    index when tokens decided (the incoming prompt's first divergent token, which that sample holds at the
    same index), else where the turn's output starts. Decisions with no turn (side turns) touch no tokens."""
    placements = []
    for i, event in enumerate(lin.events):
        candidates: Iterable[int] = (
            lin.leaf_samples.get(event.leaf, []) if event.leaf is not None else range(len(lin.samples))
        )
        sample = token = None
        if event.turn is not None:
            for s in candidates:
                span = next((sp for sp in _spans(lin, s) if sp.turn_index == event.turn), None)
                if span is not None:
                    sample, token = s, event.token_index if event.token_index is not None else span.start
                    break
        if sample is not None and token is not None and not 0 <= token < len(lin.samples[sample].tokens):
            token = None
        placements.append(Placement(i, sample, token))
    return placements


def _spans(lin: Linearization, index: int) -> list[Span]:
    return lin.spans[index] if index < len(lin.spans) else []


# --- token runs --------------------------------------------------------------------------------------------


def token_runs(
    sample: Sample, spans: Sequence[Span], outputs: dict[int, ExchangeRow], breaks: Iterable[int] = ()
) -> list[TokenRun]:
    """The golden's runs (prompt, context, masked, trained), each context run labelled with the turn whose
    prompt brought it, realigned replies shown as masked, and runs split at `breaks` (decision markers)."""
    ordered = sorted((s for s in spans if s.length), key=lambda s: s.start)
    first_turn = min(spans, key=lambda s: s.start).turn_index if spans else None
    realigned = _realigned(sample, spans, ordered, outputs)
    runs: list[TokenRun] = []
    for kind, start, end, turn in span_runs(sample, spans):
        if kind in ("trained", "masked"):
            label = f"turn {turn} output" + ("" if kind == "trained" else ", not trained")
            runs.append(TokenRun(kind, start, end, turn, label))
            continue
        at = start
        for r_start, r_end, r_turn in realigned:
            if r_end <= at or r_start >= end:
                continue
            if r_start > at:
                runs.append(_context(kind, at, r_start, ordered, first_turn))
            by = _next_turn(ordered, r_start)
            runs.append(
                TokenRun(
                    "masked",
                    max(r_start, at),
                    min(r_end, end),
                    r_turn,
                    f"turn {r_turn} reply, realigned"
                    + (f" (re-tokenised in turn {by}'s prompt)" if by is not None else ""),
                    True,
                )
            )
            at = min(r_end, end)
        if at < end:
            runs.append(_context(kind, at, end, ordered, first_turn))
    return _split(runs, sorted(set(breaks)))


def _context(kind: str, start: int, end: int, ordered: list[Span], first_turn: int | None) -> TokenRun:
    turn = first_turn if kind == "prompt" else _next_turn(ordered, start)
    return TokenRun(kind, start, end, turn, f"turn {turn} prompt" if turn is not None else kind)


def _next_turn(ordered: list[Span], index: int) -> int | None:
    """The turn whose prompt brought a context token: the first (non-empty) output after it."""
    return next((s.turn_index for s in ordered if s.start > index), None)


def _realigned(
    sample: Sample, spans: Sequence[Span], ordered: list[Span], outputs: dict[int, ExchangeRow]
) -> list[tuple[int, int, int]]:
    """(start, end, turn) of each reply a realign re-tokenised: a span emptied by the realign (its turn did
    generate tokens), up to the reply's closing stop token (for a reply that ended at `stop`), else as many
    tokens as the engine generated; never past the next output."""
    found = []
    for span in spans:
        row = outputs.get(span.turn_index)
        if span.length or row is None or not row.output_ids or span.start >= len(sample.tokens):
            continue
        limit = next((s.start for s in ordered if s.start > span.start), len(sample.tokens))
        end = min(span.start + len(row.output_ids), limit)
        if row.finish == "stop":
            stop = row.output_ids[-1]
            end = next((j + 1 for j in range(span.start, limit) if sample.tokens[j] == stop), end)
        found.append((span.start, end, span.turn_index))
    return sorted(found)


def _split(runs: list[TokenRun], breaks: list[int]) -> list[TokenRun]:
    out: list[TokenRun] = []
    for run in runs:
        at = run.start
        for b in breaks:
            if at < b < run.end:
                out.append(TokenRun(run.kind, at, b, run.turn, run.label, run.realigned))
                at = b
        out.append(TokenRun(run.kind, at, run.end, run.turn, run.label, run.realigned))
    return out


def logprob_at(sample: Sample, index: int) -> float | None:
    """The sample's logprob for a token; None in the prompt (outside the response region)."""
    first = sample.prompt_length
    return sample.rollout_log_probs[index - first] if index >= first else None


SHOWN_LAYERS = 4  # a token's route on hover: its first layers (a large MoE has dozens), then the count


def channel_tip(sample: Sample, index: int, turn: int | None, output: bool) -> list[str]:
    """A token's channels for its tooltip: its experts per layer (or why it has no row), its top-p kept set's size,
    and, for a turn's output, the weight version that generated it. Nothing where the sample has no channels."""
    lines: list[str] = []
    routes = sample.rollout_routed_experts
    if routes is not None:
        if index >= len(routes):
            lines.append("experts: no row (the sample's last token was never forwarded)")
        elif bool((routes[index] == -1).all()):
            lines.append("experts: unknown (no engine answer covered this token)")
        else:
            layers = [",".join(map(str, layer.tolist())) for layer in routes[index][:SHOWN_LAYERS]]
            more = f" … ({len(routes[index])} layers)" if len(routes[index]) > SHOWN_LAYERS else ""
            lines.append("experts " + " · ".join(f"L{n}: {e}" for n, e in enumerate(layers)) + more)
    offsets = sample.rollout_top_p_token_offsets
    first = sample.prompt_length
    if offsets is not None and index >= first:
        kept = int(offsets[index - first + 1] - offsets[index - first])
        lines.append(f"top-p kept set: {kept} ids" if kept else "top-p kept set: none (not trained)")
    turns = sample.metadata.get("turns")
    if output and turn is not None and sample.weight_versions and isinstance(turns, list) and turn in turns:
        version = sample.weight_versions[turns.index(turn)]
        changes = [c for c in sample.metadata.get("weight_version_changes") or [] if c.get("turn") == turn]
        if changes:
            version = " → ".join(str(span[0]) for span in changes[0]["spans"]) + " (changed during the turn)"
        lines.append(f"weight version {version or '?'}")
    return lines


def describe_finish(finish: FinishResult) -> str:
    live = "none (never finished live)" if finish.live is None else str(len(finish.live))
    return f"reward {finish.reward:g}, live samples {live}"


def sample_line(index: int, sample: Sample, spans: Sequence[Span]) -> str:
    trained = sum(sample.loss_mask)
    turns = sorted({s.turn_index for s in spans})
    leaf = sample.metadata.get("leaf")
    return (
        f"sample {index}: {len(sample.tokens)} tokens, prompt {sample.prompt_length}, trained {trained}, "
        f"masked {sample.response_length - trained}, turns {','.join(map(str, turns)) or '-'}"
        + (f", leaf n{leaf}" if leaf is not None else "")
    )


def header_facts(header: Header) -> list[tuple[str, Any]]:
    agent = header.agent or {}
    return [
        ("created", header.created),
        ("tito version", header.tito_version),
        ("tokenizer", header.tokenizer_fingerprint),
        ("agent", " ".join(str(v) for v in (agent.get("client"), agent.get("version")) if v) or "-"),
    ]
