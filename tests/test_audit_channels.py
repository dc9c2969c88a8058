"""`tito audit`'s per-token channel rules (issue 46): each on a small recording whose engine leg carries expert routes,
top-p kept sets and weight versions as SGLang (or vLLM) sends them (CHANNELS.md), built with the cassette writer; a
clean recording fires none of them, each defect fires its own rule; the JSON, the HTML page and the live metrics
name them alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.audit_support import FIRST, SECOND, SYSTEM, USER, Recording, ids, logprobs, sample, text_reply
from tests.channel_support import LAYERS, TOP_K, b64_int32, b64_npy, expert_rows, kept_for
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import CassetteReader
from tito_rl.main import main
from tito_rl.replayer.audit.live import LiveAudit
from tito_rl.replayer.audit.protocol import CHANNEL_RULES
from tito_rl.replayer.audit.report import to_json
from tito_rl.replayer.audit.runner import AuditOptions, CassetteAudit, audit, audit_cassette
from tito_rl.replayer.units import pool_dispatch

S = "sid-test"
P0, O0, CTX, O1 = ids(SYSTEM), ids(FIRST), ids(USER), ids(SECOND)
P1 = P0 + O0 + CTX
TOKENS = P1 + O1
BOUNDARY = len(P0) + len(O0) - 1  # the first turn's last generated token: its row comes from turn 1's prefill
SERVES = {"extra": {"engine_server_info": {"enable_return_routed_experts": True}, "moe": "3,2,16"}}


def fired(result: CassetteAudit) -> dict[str, int]:
    return {r: res.total for r, res in result.findings.rules.items() if res.fired}


def spans(n: int, *names: str) -> list[dict[str, Any]]:
    names = names or ("1",)
    cuts = [round(n * i / len(names)) for i in range(len(names) + 1)]
    return [{"version": v, "start": a, "end": b} for v, a, b in zip(names, cuts, cuts[1:], strict=False)]


def engine(
    rec: Recording,
    prompt: list[int],
    output: list[int],
    *,
    ask: bool = True,
    start: int = 0,
    routes: Any = True,
    kept: Any = True,
    versions: Any = None,
    finish: str = "stop",
    rid: str | None = None,
    started: float = 0.0,
    duration: float = 0.0,
    session: str = S,
) -> None:
    """One SGLang /generate call with its channels: `routes` True (the MoE's rows from `start`), an array (sent
    as is), None (none sent); `kept` True (each token's set), a (ids, offsets) pair, None; `versions` spans."""
    request: dict[str, Any] = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 1000}, "return_logprob": True}
    if rid is not None:
        request["rid"] = rid
    if ask:
        request["return_routed_experts"] = True
        request["routed_experts_start_len"] = start
    meta: dict[str, Any] = {
        "finish_reason": {"type": finish},
        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs(output), output, strict=True)],
        "weight_version": "1",
        "weight_versions": spans(len(output)) if versions is None else versions,
    }
    if routes is True:
        routes = expert_rows(prompt + output)[start : len(prompt) + len(output) - 1]
    if routes is not None:
        meta["routed_experts"] = b64_int32(routes)
    if kept is True:
        sets = kept_for(output)
        kept = (sets.ids, sets.offsets)
    if kept is not None:
        meta["top_p_token_ids"], meta["top_p_token_offsets"] = b64_int32(kept[0]), b64_int32(kept[1])
    response = {"text": "", "output_ids": output, "meta_info": meta}
    record = EngineRecord(session, 0, "POST", "/generate", request, 200, response, None)
    record.started_s, record.duration_s = started, duration
    rec.writer.write_engine(record)


def admin(rec: Recording, path: str, body: dict[str, Any] | None, answer: Any, started: float = 0.0) -> None:
    record = EngineRecord(S, 0, "POST" if body is not None else "GET", path, body, 200, answer, None)
    record.started_s = started
    rec.writer.write_engine(record)


def channel_sample(
    tokens: list[int] = TOKENS, routes: Any = True, kept: Any = True, versions: tuple[str, ...] = ("1", "1")
) -> dict[str, Any]:
    """The two-turn session's sample with its channels: routes `[len(tokens) - 1, LAYERS, TOP_K]`, kept sets over
    the response (the context's tokens empty), one version per turn."""
    made = sample(P0, [(O0, 1, logprobs(O0)), (CTX, 0, None), (O1, 1, logprobs(O1))])
    made["tokens"] = tokens
    if routes is True:
        routes = expert_rows(tokens)[: len(tokens) - 1].reshape(-1, LAYERS, TOP_K)
    if routes is not None:
        made["rollout_routed_experts"] = np.asarray(routes).tolist()
    if kept is True:
        first, second = kept_for(O0), kept_for(O1)
        ids_ = np.concatenate([first.ids, second.ids]).tolist()
        counts = [*np.diff(first.offsets), *([0] * len(CTX)), *np.diff(second.offsets)]
        kept = (ids_, [0, *np.cumsum(counts).tolist()])
    if kept is not None:
        made["rollout_top_p_token_ids"], made["rollout_top_p_token_offsets"] = (
            [int(i) for i in kept[0]],
            [int(o) for o in kept[1]],
        )
    if versions:
        made["weight_versions"] = list(versions)
    return made


def two_turns(
    path: Path,
    *,
    first: dict[str, Any] | None = None,
    second: dict[str, Any] | None = None,
    made: dict[str, Any] | None = None,
    before: Any = None,
    **header: Any,
) -> Path:
    """A clean two-turn session with channels: turn 1 asks routes from the first turn's last token."""
    with Recording(path, **header) as rec:
        if before is not None:
            before(rec)
        engine(rec, P0, O0, **(first or {}))
        rec.agent(text_reply("Hello there."))
        engine(rec, P1, O1, **{"start": BOUNDARY, **(second or {})})
        rec.agent(text_reply("Done."))
        rec.finish([made if made is not None else channel_sample()])
    return path


def test_clean_channels_fire_nothing_and_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = two_turns(tmp_path / "clean.tito", **SERVES)
    result = audit_cassette(path, options=AuditOptions(max_staleness=0))
    assert fired(result) == {} and result.coverage == 1.0
    assert result.findings.channels  # the report lists the channel rules: this recording carries channels
    assert main(["audit", str(path), "--json", "--fail-on", ",".join(CHANNEL_RULES)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(CHANNEL_RULES) <= set(out["rules"]) and set(CHANNEL_RULES) <= set(out["cassettes"][0]["rules"])
    assert main(["audit", str(path)]) == 0
    assert "routes-differ" in capsys.readouterr().out  # among the rules not fired


def test_a_recording_without_channels_lists_no_channel_rule(tmp_path: Path) -> None:
    from tests.audit_support import two_turns as plain

    result = audit([str(plain(tmp_path / "plain.tito"))])
    assert not result.cassettes[0].findings.channels
    out = to_json(result)
    assert not set(CHANNEL_RULES) & set(out["rules"]) and not set(CHANNEL_RULES) & set(out["cassettes"][0]["rules"])


# ---- routes ----


def test_routes_never_asked_from_an_engine_that_serves_them(tmp_path: Path) -> None:
    unasked = {"ask": False, "routes": None}
    path = two_turns(
        tmp_path / "unasked.tito", first=unasked, second=unasked, made=channel_sample(routes=None), **SERVES
    )
    result = audit_cassette(path)
    assert fired(result) == {"routes-never-asked": 2}
    example = result.findings.rules["routes-never-asked"].examples[0]
    assert (example.exchange, example.seq) == (0, 1) and "engine info" in example.detail
    # the engine's /get_server_info recorded in the session says so too, wherever it is in the session
    info = two_turns(
        tmp_path / "info.tito",
        first=unasked,
        second=unasked,
        made=channel_sample(routes=None),
        before=lambda rec: None,
    )
    assert fired(audit_cassette(info)) == {}  # nothing says the engine serves routes: asking was not possible
    with Recording(tmp_path / "late.tito") as rec:
        engine(rec, P0, O0, ask=False, routes=None)
        admin(rec, "/get_server_info", None, {"enable_return_routed_experts": True, "tp_size": 1})
        rec.agent(text_reply("Hello there."))
        rec.finish([channel_sample(tokens=P0 + O0, routes=None, kept=None, versions=())])
    assert fired(audit_cassette(tmp_path / "late.tito"))["routes-never-asked"] == 1


def test_routes_missing_from_the_answer_and_from_the_sample(tmp_path: Path) -> None:
    engine_none = audit_cassette(two_turns(tmp_path / "engine.tito", second={"routes": None}))
    assert engine_none.findings.rules["routes-missing"].kinds == {"engine": len(P1) + len(O1) - 1 - BOUNDARY}
    # the engine sent them, the gateway's sample has none
    lost = audit_cassette(two_turns(tmp_path / "lost.tito", made=channel_sample(routes=None)))
    assert fired(lost) == {"routes-missing": len(TOKENS) - 1}
    assert lost.findings.rules["routes-missing"].kinds == {"sample": len(TOKENS) - 1}
    # rows -1 where the engine routed them: the first turn's rows never carried into the sample
    rows = expert_rows(TOKENS)[: len(TOKENS) - 1].copy()
    rows[: len(P0)] = -1
    unknown = audit_cassette(two_turns(tmp_path / "unknown.tito", made=channel_sample(routes=rows.reshape(-1, 3, 2))))
    assert fired(unknown) == {"routes-missing": len(P0)}
    assert unknown.findings.rules["routes-missing"].examples[0].token == 0


def test_routes_misaligned_in_the_sample_and_the_answer(tmp_path: Path) -> None:
    uncut = expert_rows(TOKENS + [11])[: len(TOKENS)]  # one row per token: the last one's never-forwarded row too
    result = audit_cassette(two_turns(tmp_path / "uncut.tito", made=channel_sample(routes=uncut.reshape(-1, 3, 2))))
    assert fired(result) == {"routes-misaligned": 1}
    assert "more: not cut" in result.findings.rules["routes-misaligned"].examples[0].detail
    # the engine ignored routed_experts_start_len: every row from 0
    whole = expert_rows(P1 + O1)[: len(P1) + len(O1) - 1]
    ignored = audit_cassette(two_turns(tmp_path / "ignored.tito", second={"routes": whole}))
    assert ignored.findings.rules["routes-misaligned"].kinds == {"start ignored": 1}
    assert not ignored.findings.rules["routes-differ"].fired  # its rows, read from 0, are the model's


def test_routes_differ_names_the_stale_last_row_and_a_shift(tmp_path: Path) -> None:
    rows = expert_rows(TOKENS)[: len(TOKENS) - 1].copy()
    rows[BOUNDARY] = rows[BOUNDARY - 1]  # the first turn's last token keeps a stale row, not the prefill's
    stale = audit_cassette(two_turns(tmp_path / "stale.tito", made=channel_sample(routes=rows.reshape(-1, 3, 2))))
    assert fired(stale) == {"routes-differ": 1}
    assert stale.findings.rules["routes-differ"].kinds == {"last row": 1}
    example = stale.findings.rules["routes-differ"].examples[0]
    assert example.token == BOUNDARY and [s.label for s in example.sides] == ["sample row", "engine row"]
    # the prefix concatenated twice, cut to len(tokens) - 1: the rows after it are the engine's for earlier tokens
    rows = expert_rows(TOKENS)[: len(TOKENS) - 1]
    doubled = np.concatenate([rows[:BOUNDARY], rows[:BOUNDARY], rows])[: len(TOKENS) - 1]
    shifted = audit_cassette(two_turns(tmp_path / "twice.tito", made=channel_sample(routes=doubled.reshape(-1, 3, 2))))
    # rows BOUNDARY.. hold the engine's rows from token 0: the boundary's is its last row, the rest shifted
    assert shifted.findings.rules["routes-differ"].kinds == {"last row": 1, "shifted": len(TOKENS) - 2 - BOUNDARY}
    assert "the engine's row for token 1" in shifted.findings.rules["routes-differ"].examples[1].detail


def test_routes_invalid_ids_repeats_and_zero_padding(tmp_path: Path) -> None:
    rows = expert_rows(TOKENS)[: len(TOKENS) - 1].copy()
    rows[2, 0] = 16  # 16 experts: ids 0..15
    rows[3, 0:2] = rows[3, 0]  # one expert twice in a layer's top_k
    rows[-1] = 0  # expert 0 padding
    result = audit_cassette(
        two_turns(tmp_path / "invalid.tito", made=channel_sample(routes=rows.reshape(-1, 3, 2)), **SERVES)
    )
    assert result.findings.rules["routes-invalid"].kinds == {"out of range": 1, "repeated": 1, "zero padding": 1}
    assert result.findings.rules["routes-differ"].total == 3  # each also differs from the engine's row
    # the engine's own dummy row (the previous turn's last token all expert 0)
    answer = expert_rows(P1 + O1)[BOUNDARY : len(P1) + len(O1) - 1].copy()
    answer[0] = 0
    dummy = audit_cassette(two_turns(tmp_path / "dummy.tito", second={"routes": answer}))
    assert dummy.findings.rules["routes-invalid"].kinds == {"zero padding": 1}
    assert dummy.findings.rules["routes-invalid"].examples[0].token == BOUNDARY


def test_engine_answers_with_padding_negative_or_repeated_ids(tmp_path: Path) -> None:
    """The fake engine's route faults as the audit sees them: a padding row of expert 0 for the never-forwarded last
    token (one row too many), an id below -1 (the decoder refuses it), a layer naming one expert twice."""
    answer = expert_rows(P1 + O1)[BOUNDARY : len(P1) + len(O1) - 1]
    padded = np.concatenate([answer, np.zeros((1, LAYERS * TOP_K), dtype=answer.dtype)])
    result = audit_cassette(two_turns(tmp_path / "padded.tito", second={"routes": padded}, **SERVES))
    assert result.findings.rules["routes-misaligned"].kinds == {"engine rows": 1}
    assert result.findings.rules["routes-invalid"].kinds == {"zero padding": 1}
    assert result.findings.rules["routes-invalid"].examples[0].token == len(P1) + len(O1) - 1
    negative = answer.copy()
    negative[1, 0] = -3
    result = audit_cassette(two_turns(tmp_path / "negative.tito", second={"routes": negative}, **SERVES))
    assert fired(result) == {"routes-invalid": 1}
    assert result.findings.rules["routes-invalid"].kinds == {"out of range": 1}
    assert result.findings.rules["routes-invalid"].examples[0].token == BOUNDARY + 1
    twice = answer.copy()
    twice[1, 1] = twice[1, 0]
    result = audit_cassette(two_turns(tmp_path / "twice.tito", second={"routes": twice}, **SERVES))
    assert result.findings.rules["routes-invalid"].kinds == {"repeated": 1}  # top_k 2 from the header's moe shape


def test_vllm_routes_sent_unasked_and_lost_by_the_gateway(tmp_path: Path) -> None:
    """vLLM sends routes with every answer (`.npy`): an engine that does so serves them; a sample without is missing
    them."""
    with Recording(tmp_path / "vllm.tito") as rec:
        for prompt, output in ((P0, O0), (P1, O1)):
            rows = expert_rows(prompt + output)[: len(prompt) + len(output) - 1].reshape(-1, LAYERS, TOP_K)
            request = {"token_ids": prompt, "sampling_params": {"max_tokens": 100}}
            response = {
                "choices": [
                    {"token_ids": output, "finish_reason": "stop", "routed_experts": b64_npy(rows.astype(np.uint8))}
                ]
            }
            rec.writer.write_engine(
                EngineRecord(
                    S, 0, "POST", "/inference/v1/generate", request, 200, response, None, dialect="vllm-generate"
                )
            )
            rec.agent(text_reply("Hello there." if output is O0 else "Done."))
        rec.finish([channel_sample(routes=None, kept=None, versions=())])
    result = audit_cassette(tmp_path / "vllm.tito")
    assert result.findings.rules["routes-missing"].kinds == {"sample": len(TOKENS) - 1}
    assert not result.findings.rules["routes-never-asked"].fired  # vLLM cannot be asked: it sends them


# ---- kept sets ----


def test_kept_set_offsets_and_sampled_tokens(tmp_path: Path) -> None:
    good = channel_sample()
    short = dict(good, rollout_top_p_token_offsets=good["rollout_top_p_token_offsets"][:-1])
    result = audit_cassette(two_turns(tmp_path / "offsets.tito", made=short))
    assert fired(result) == {"kept-set-invalid": 1} and result.findings.rules["kept-set-invalid"].kinds == {
        "offsets": 1
    }
    # a trained token whose set lacks it (the first output token's set is itself alone)
    ids_ = list(good["rollout_top_p_token_ids"])
    ids_[0] = 99999
    outside = audit_cassette(two_turns(tmp_path / "outside.tito", made=dict(good, rollout_top_p_token_ids=ids_)))
    assert outside.findings.rules["kept-set-invalid"].kinds == {"sampled outside": 1}
    assert outside.findings.rules["kept-set-invalid"].examples[0].token == len(P0)
    # the engine's own set without its sampled token
    sets = kept_for(O0)
    wrong = sets.ids.copy()
    wrong[0] = 99999
    engine_side = audit_cassette(two_turns(tmp_path / "engine.tito", first={"kept": (wrong, sets.offsets)}))
    assert engine_side.findings.rules["kept-set-invalid"].kinds == {"engine": 1}
    assert engine_side.findings.rules["kept-set-invalid"].examples[0].sides[1].text == str([99999])


# ---- weight versions ----


def test_stale_tokens_beyond_max_staleness(tmp_path: Path) -> None:
    path = two_turns(
        tmp_path / "stale.tito",
        second={"versions": spans(len(O1), "3")},
        made=channel_sample(versions=("1", "3")),
    )
    assert fired(audit_cassette(path)) == {}  # not checked without --max-staleness
    assert fired(audit_cassette(path, options=AuditOptions(max_staleness=2))) == {}
    stale = audit_cassette(path, options=AuditOptions(max_staleness=1))
    assert fired(stale) == {"stale-tokens": 1}
    assert "versions 1 to 3, 2 apart" in stale.findings.rules["stale-tokens"].examples[0].detail
    # versions that are not integers: ordered by first appearance in the session (a, then b, then c)
    named = two_turns(
        tmp_path / "named.tito",
        first={"versions": spans(len(O0), "a", "b")},
        second={"versions": spans(len(O1), "c")},
        made=channel_sample(versions=("b", "c")),
    )
    assert fired(audit_cassette(named, options=AuditOptions(max_staleness=1))) == {"stale-tokens": 1}
    assert fired(audit_cassette(named, options=AuditOptions(max_staleness=2))) == {}


def test_version_uncovered_output_tokens(tmp_path: Path) -> None:
    gap = [{"version": "1", "start": 0, "end": 2}, {"version": "2", "start": 4, "end": len(O0)}]
    result = audit_cassette(two_turns(tmp_path / "gap.tito", first={"versions": gap}))
    assert fired(result) == {"version-uncovered": 2}
    assert result.findings.rules["version-uncovered"].examples[0].seq == 1


def test_aborted_by_a_weight_update(tmp_path: Path) -> None:
    def recording(name: str, update: bool, gateway_abort: bool = False, after: str = "2") -> Path:
        with Recording(tmp_path / name) as rec:
            engine(rec, P0, O0[:3], finish="abort", rid="r1", started=1.0, duration=2.0, kept=None)
            if update:
                admin(rec, "/update_weight_version", {"new_version": "2"}, {"success": True}, started=1.5)
            if gateway_abort:
                admin(rec, "/abort_request", {"rid": "r1"}, {}, started=1.5)
            engine(rec, P0, O0, versions=spans(len(O0), after), started=4.0)
            rec.agent(text_reply("Hello there."))
            rec.finish([channel_sample(tokens=P0 + O0, routes=None, kept=None, versions=(after,))])
        return tmp_path / name

    result = audit_cassette(recording("update.tito", update=True))
    assert result.findings.rules["aborted-by-update"].kinds == {"update recorded": 1}
    assert result.findings.rules["aborted-by-update"].examples[0].seq == 1
    assert audit_cassette(recording("seen.tito", update=False)).findings.rules["aborted-by-update"].kinds == {
        "version changed": 1
    }
    assert (
        not audit_cassette(recording("asked.tito", update=False, gateway_abort=True))
        .findings.rules["aborted-by-update"]
        .fired
    )  # the gateway aborted it itself
    assert not audit_cassette(recording("same.tito", update=False, after="1")).findings.rules["aborted-by-update"].fired


# ---- reports ----


def defects(path: Path) -> Path:
    """Three sessions, each with its own defect, and a clean one: the report's fixture."""
    rows = expert_rows(TOKENS)[: len(TOKENS) - 1].copy()
    rows[BOUNDARY] = rows[BOUNDARY - 1]
    with Recording(path, **SERVES) as rec:
        for session, made, second in (
            ("sid-a", channel_sample(routes=rows.reshape(-1, 3, 2)), {}),
            ("sid-b", channel_sample(routes=None), {"ask": False, "routes": None}),
            ("sid-c", channel_sample(), {"versions": spans(len(O1), "1", "4")}),
            ("sid-d", channel_sample(), {}),
        ):
            engine(rec, P0, O0, session=session)
            rec.agent(text_reply("Hello there."), session=session)
            extra: dict[str, Any] = {"start": BOUNDARY, **second}
            engine(rec, P1, O1, session=session, **extra)
            rec.agent(text_reply("Done."), session=session)
            rec.finish([made], session=session)
    return path


def test_json_html_and_units_name_the_channel_rules(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = defects(tmp_path / "defects.tito")
    assert main(["audit", str(path), "--json", "--max-staleness", "2", "--fail-on", "routes-differ"]) == 1
    out = json.loads(capsys.readouterr().out)
    rules = out["cassettes"][0]["rules"]
    assert rules["routes-differ"]["sessions"] == {"sid-a": 1} and rules["routes-differ"]["kinds"] == {"last row": 1}
    assert rules["routes-never-asked"]["sessions"] == {"sid-b": 1}
    assert rules["routes-missing"]["kinds"] == {"sample": BOUNDARY}  # the rows its first turn's answer held
    assert rules["stale-tokens"]["sessions"] == {"sid-c": 1}
    assert out["rules"]["routes-differ"]["description"].startswith("a sample's route row")
    assert out["cassettes"][0]["failing"] == ["routes-differ"]
    figures = {f["session"]: f["rules"] for f in out["cassettes"][0]["session_figures"]}
    assert figures["sid-d"] == {} and figures["sid-a"] == {"routes-differ": 1}
    example = rules["routes-differ"]["examples"][0]
    assert example["token"] == BOUNDARY and example["sides"][0]["label"] == "sample row"
    html = tmp_path / "audit.html"
    assert main(["audit", str(path), "--html", str(html), "--fail-on", ""]) == 0
    page = html.read_text()
    for rule in CHANNEL_RULES:
        assert f">{rule}</a>" in page
    assert "id='c0-routes-differ'" in page
    assert main(["audit", str(path), "--max-staleness", "-1"]) == 2
    # units: the same report in parts as in one pass
    one = to_json(audit([str(path)], options=AuditOptions(2)))
    parts = to_json(audit([str(path)], dispatch=pool_dispatch(1), unit_most=1, options=AuditOptions(2)))
    assert json.dumps(parts) == json.dumps(one)


def test_live_metrics_count_what_the_audit_counts(tmp_path: Path) -> None:
    from tito_rl.recorder.metrics import RecordMetrics

    path = defects(tmp_path / "defects.tito")
    metrics = RecordMetrics("t")
    with CassetteReader(path) as reader:
        live = LiveAudit(reader.header, metrics.writer_event)
        for record in reader.records():
            live.record(record)
    live.close()
    audited = audit_cassette(path)
    for rule in CHANNEL_RULES:
        value = metrics.registry.get_sample_value("tito_audit_findings_total", {"target": "t", "rule": rule})
        assert value == audited.findings.rules[rule].total, rule
    assert audited.findings.rules["routes-differ"].total == 1 and audited.findings.rules["routes-never-asked"].total


# ---- slime's recording, and where the recording keeps the engine's start arguments ----

SLIME = Path(__file__).resolve().parent.parent / "cassettes" / "targets" / "slime_mixed.tito"


def test_slimes_adapters_never_ask_an_engine_that_serves_routes(tmp_path: Path) -> None:
    """slime_mixed's own traffic (slime's agent adapters around the fake engine), its header saying what a recording
    of an engine started with `--enable-return-routed-experts` says: every generation asked `return_logprob` only."""
    from dataclasses import replace

    from tito_rl.cassette.writer import CassetteWriter

    copy = tmp_path / "slime_routes.tito"
    with CassetteReader(SLIME) as reader:
        header = replace(reader.header, extra={"engine_server_info": {"enable_return_routed_experts": True}})
        with CassetteWriter(copy, header) as writer:
            for record in reader.records():
                writer.append_redacted(record)
    generations = 0
    with CassetteReader(SLIME) as reader:
        for record in reader.records():
            if isinstance(record, EngineRecord) and record.path == "/generate" and record.status == 200:
                assert (
                    record.request is not None
                    and "return_routed_experts" not in record.request
                    and record.request["return_logprob"] is True
                )
                generations += 1
    assert generations == 15  # 17 calls, 2 answered 529
    result = audit_cassette(copy)
    assert result.findings.rules["routes-never-asked"].total == generations
    assert len(result.findings.rules["routes-never-asked"].sessions) == 4
    example = result.findings.rules["routes-never-asked"].examples[0]
    assert "engine info says enable_return_routed_experts" in example.detail
    assert example.sides[0].text == "return_logprob"  # all slime's adapter asked beside the tokens
    assert audit_cassette(SLIME).findings.rules["routes-never-asked"].total == 0  # its engine did not serve them


def test_the_recorder_keeps_the_engines_routes_flag(tmp_path: Path) -> None:
    """`tito record` asks the engine's /server_info (SGLang's start arguments) and keeps the routes flag, only when it
    is set: a recording of an engine without routes has the header it had before."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from tito_rl.recorder.taps.proxy import fetch_server_args

    async def asked(info: dict[str, Any] | None, path: str = "/server_info") -> dict[str, Any]:
        async def answer(request: web.Request) -> web.Response:
            return web.json_response(info)

        app = web.Application()
        if info is not None:
            app.router.add_get(path, answer)
        server = TestServer(app)
        await server.start_server()
        try:
            return await fetch_server_args(str(server.make_url("")))
        finally:
            await server.close()

    assert asyncio.run(asked({"enable_return_routed_experts": True, "tp_size": 1})) == {
        "enable_return_routed_experts": True
    }
    assert asyncio.run(asked({"enable_return_routed_experts": True}, "/get_server_info")) == {
        "enable_return_routed_experts": True
    }
    assert asyncio.run(asked({"enable_return_routed_experts": False})) == {}
    assert asyncio.run(asked(None)) == {}  # no such route (vLLM)


def test_titos_adapter_in_front_of_an_engine_serving_channels_audits_clean(tmp_path: Path) -> None:
    """A recording made in-process through tito's adapter and the cassette writer, in front of the SGLang double that
    serves routes, kept sets and versions (tests/channel_support.py): the samples tito made carry the engine's rows
    through three spliced turns, so no channel rule fires, and the report lists them."""
    import asyncio

    from tests.channel_support import ChannelEngine, script, stack, tool_loop
    from tito_rl.cassette.writer import CassetteWriter
    from tito_rl.recorder.taps.proxy import build_header
    from tito_rl.trajectory.adapters.app import AdapterSettings
    from tito_rl.trajectory.manager import TrajectoryManager
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    path = tmp_path / "routed.tito"
    engine = ChannelEngine(load_tokenizer(), script())

    async def record() -> list[dict[str, Any]]:
        manager = TrajectoryManager()
        writer = CassetteWriter(path, build_header(AdapterSettings(), None, {"client": "test"}, manager=manager))
        try:
            async with stack(engine, writer, manager) as url:
                return await tool_loop(url, "routed-session-token-0001", top_p=0.9)
        finally:
            writer.close()

    samples = asyncio.run(record())
    assert samples and all("rollout_routed_experts" in s for s in samples)
    result = audit_cassette(path, options=AuditOptions(max_staleness=0))
    assert result.findings.channels and fired(result) == {} and result.coverage == 1.0
    # the same traffic, its sample's row of the first turn's last token left as the previous token's (a stale row)
    from tito_rl.cassette.format.records import SamplesRecord

    stale = tmp_path / "stale_row.tito"
    with CassetteReader(path) as reader, CassetteWriter(stale, reader.header) as writer:
        first = None
        for item in reader.records():
            if isinstance(item, EngineRecord) and first is None and item.path == "/generate":
                first = len(item.request["input_ids"]) + len(item.response["output_ids"]) - 1
            if isinstance(item, SamplesRecord):
                routes = item.samples[0]["rollout_routed_experts"]
                assert first is not None and routes[first] != routes[first - 1]
                routes[first] = routes[first - 1]
            writer.append_redacted(item)
    result = audit_cassette(stale)
    assert fired(result) == {"routes-differ": 1} and result.findings.rules["routes-differ"].kinds == {"last row": 1}
