"""Engine-wide events (issue 46, format version 7): a trainer's weight updates, pauses and aborts made on the engine
directly, outside every session, recorded in the cassette in their order among the sessions' engine calls, and
audited: tito's adapter continues the turns an update aborted (`aborted-by-update` names them only where a gateway
passed the abort on: a copy with the continuations left out), a sample spanning more versions than
`--max-staleness` is named by `stale-tokens` (live too), a token of a version the recorded updates had not made
current by `version-not-current`.

The recording is real HTTP on loopback: the fake engine, tito's adapter as the target between the recorder's two
taps (`TapsAround`), four agent sessions and a "trainer" client that calls the engine through the engine tap, as a
trainer pointed at the recorder's engine URL does. Nothing waits on time: the test waits for the engine's own
state (paused, requests in flight) before the trainer acts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from tests.audit_support import Recording
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.frames import encode_frame
from tito_rl.cassette.format.records import ENGINE_WIDE, FORMAT_VERSION, EngineEvent, EngineRecord
from tito_rl.cassette.reader import CassetteReader, open_cassette, read_cassette, summarize
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.cassette.writer_process import Layout, _observer
from tito_rl.fake_engine.app import ENGINE_KEY, EngineOptions
from tito_rl.fake_engine.app import create_app as engine_app
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.main import main
from tito_rl.recorder.taps.around import TapsAround
from tito_rl.recorder.taps.proxy import build_header
from tito_rl.recorder.targets.base import TargetOptions
from tito_rl.recorder.targets.tito import TitoDriver
from tito_rl.replayer.audit.live import LiveAudit, observer
from tito_rl.replayer.audit.report import to_json
from tito_rl.replayer.audit.runner import AuditOptions, audit, audit_cassette
from tito_rl.replayer.units import pool_dispatch
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.tap import EngineExchange
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
A, B, C, D = (f"agent-{x}-session-token-0001" for x in "abcd")
SCENARIO = {
    "name": "trainer",
    "sessions": [
        {  # A and B: the engine pauses itself after 2 tokens of their first turn, so the trainer's update finds them
            "match": {"prompt_contains": "paused agent"},
            "turns": [
                {"text": "Let me look at the files first.", "faults": {"pause_after": 2}, "fault_attempts": 1},
                {"text": "There are three files."},
            ],
        },
        {  # D: its first turn answered with the version before the current one (a stale-version engine)
            "match": {"prompt_contains": "stale agent"},
            "turns": [{"text": "Counting them now.", "faults": {"stale_weight_version": True}}, {"text": "Three."}],
        },
        {"turns": [{"text": "Let me look at the files first."}, {"text": "There are three files."}]},  # C
    ],
}


async def _turn(http: aiohttp.ClientSession, url: str, sid: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One chat turn; the reply appended to `messages`, then the next user message."""
    body = {"model": "tito", "messages": messages}
    async with http.post(url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {sid}"}) as r:
        assert r.status == 200, await r.text()
        reply: dict[str, Any] = (await r.json())["choices"][0]["message"]
    messages += [{"role": "assistant", "content": reply.get("content") or ""}, {"role": "user", "content": "Count."}]
    return reply


async def _finish(http: aiohttp.ClientSession, url: str, sid: str) -> None:
    async with http.post(url + f"/tito/sessions/{sid}/finish", json={"reward": 1.0}) as r:
        assert r.status == 200, await r.text()


async def _until(condition: Any, what: str) -> None:
    """Wait for the engine's state to say so (it changes as requests arrive): an event, never a fixed delay."""
    for _ in range(3000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine never got there: {what}")


async def _record(path: Path) -> None:
    tokenizer = load_tokenizer()
    policy = ScriptedPolicy(parse_scenario(SCENARIO), tokenizer)
    app = engine_app(policy, EngineOptions(tokenizer=tokenizer, weight_version="1"))
    engine = TestServer(app, host="127.0.0.1")
    await engine.start_server()
    writer = CassetteWriter(path, build_header(AdapterSettings(), None, {"client": "test"}))
    taps = TapsAround(writer, TitoDriver(TargetOptions()), str(engine.make_url("")).rstrip("/"))
    ends = await taps.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    state = app[ENGINE_KEY]
    # distinct prompts: each of A and B has its own `pause_after` attempt, so whichever reaches the engine second is
    # held too (by the engine's pause, or its own at 2 tokens), in either order
    chats = {
        sid: [
            {"role": "system", "content": f"You are the {kind}, {sid[:7]}."},
            {"role": "user", "content": "List files."},
        ]
        for sid, kind in ((A, "paused agent"), (B, "paused agent"), (C, "plain"), (D, "stale agent"))
    }

    async def trainer(path: str, body: dict[str, Any]) -> None:
        async with http.post(ends.engine_url + path, json=body) as r:
            assert r.status == 200, await r.text()

    try:
        async with aiohttp.ClientSession() as http:
            # A and B in flight, the engine paused in the middle of A's answer; the trainer's update aborts both
            first = [asyncio.ensure_future(_turn(http, ends.agent_url, s, chats[s])) for s in (A, B)]
            await _until(lambda: state.paused.is_set() and len(state.tracked) == 2, "A and B in flight, paused")
            await trainer("/update_weight_version", {"new_version": "2"})  # abort_all_requests: SGLang's default
            await trainer("/continue_generation", {})
            replies = await asyncio.gather(*first)  # each answered once, whole: the adapter continued the abort
            assert [r["content"] for r in replies] == ["Let me look at the files first."] * 2
            for sid in (A, B):
                await _turn(http, ends.agent_url, sid, chats[sid])
                await _finish(http, ends.agent_url, sid)
            # C: a turn at version 2, two updates that abort nothing, a turn at version 4: 2 versions apart
            await _turn(http, ends.agent_url, C, chats[C])
            await trainer("/update_weight_version", {"new_version": "3", "abort_all_requests": False})
            await trainer("/update_weight_version", {"new_version": "4", "abort_all_requests": False})
            await _turn(http, ends.agent_url, C, chats[C])
            await _finish(http, ends.agent_url, C)
            # D: answered with version 3 while 4 is current
            await _turn(http, ends.agent_url, D, chats[D])
            await _turn(http, ends.agent_url, D, chats[D])
            await _finish(http, ends.agent_url, D)
    finally:
        await taps.stop()
        await engine.close()
        writer.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("trainer") / "trainer.tito"
    asyncio.run(_record(path))
    return path


def names(path: Path) -> dict[str, str]:
    """Live session id -> its name in the cassette (the recorder digests bearer ids)."""
    from tito_rl.cassette.redaction import Redactor

    return {sid: Redactor().session_name(sid, "bearer") for sid in (A, B, C, D)}


def test_the_trainers_calls_are_kept_in_order_among_the_sessions_calls(recorded: Path) -> None:
    cassette = read_cassette(recorded)
    assert cassette.header.format_version == FORMAT_VERSION == 7
    events = cassette.events
    assert [(e.path, (e.request or {}).get("new_version")) for e in events] == [
        ("/update_weight_version", "2"),
        ("/continue_generation", None),
        ("/update_weight_version", "3"),
        ("/update_weight_version", "4"),
    ]
    assert [e.seq for e in events] == [0, 1, 2, 3] and all(e.session == ENGINE_WIDE for e in events)
    assert ENGINE_WIDE not in cassette.sessions and len(cassette.sessions) == 4  # no session of its own
    named = names(recorded)
    calls = {sid: [r for r in cassette.sessions[named[sid]].engine if r.path == "/generate"] for sid in named}
    update = events[0].order
    for sid in (A, B):  # in flight when the update came: started before it, answered (aborted) after it started
        aborted, continued = calls[sid][:2]
        assert aborted.order is not None and aborted.order[0] < update[0] < aborted.order[1]
        assert aborted.response["meta_info"]["finish_reason"]["type"] == "abort"
        # tito's adapter continued it: the prompt and the partial output sent again, after the update
        assert continued.request["input_ids"] == aborted.request["input_ids"] + aborted.response["output_ids"]
        assert continued.order is not None and update[0] < continued.order[0]
    assert len(calls[A][0].response["output_ids"]) == 2 and calls[B][0].response["output_ids"] == []
    c_first, c_second = (r.order for r in calls[C])
    assert c_first is not None and c_second is not None
    assert c_first[1] < events[2].order[0] and events[3].order[1] < c_second[0]  # C's turns on either side
    every = sorted([tuple(e.order) for e in events] + [tuple(r.order or ()) for rs in calls.values() for r in rs])
    flat = [n for pair in every for n in pair]
    assert len(set(flat)) == len(flat) == 2 * len(every)  # one counter: no two starts or answers share a place
    # the index keeps the events apart, and a reader of sessions never sees them
    opened = open_cassette(recorded)
    assert list(opened.sessions) == list(cassette.sessions) and len(opened.events) == 4
    assert summarize(recorded).to_dict()["engine_events"] == 4
    assert summarize(recorded, verify=False).events == 4


def test_the_audit_names_the_aborted_sessions_the_stale_sample_and_the_version_not_current(
    recorded: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    named = names(recorded)
    result = audit_cassette(recorded, options=AuditOptions(max_staleness=1))
    rules = result.findings.rules
    # A and B were aborted by the update, and tito's adapter continued both: nothing thrown away, nothing trained
    # that no engine call emitted (A's partial output is the first call's, the rest the continuation's)
    assert not rules["aborted-by-update"].fired and not rules["trained-not-emitted"].fired
    # the same traffic with the continuations left out (a gateway that passed the abort on) names both
    passed_on = recorded.parent / "passed_on.tito"
    continuations = {(named[sid], 2) for sid in (A, B)}  # each session's second engine call
    with CassetteReader(recorded) as reader, CassetteWriter(passed_on, reader.header, header_redacted=True) as writer:
        for record in reader.records():
            if not (isinstance(record, EngineRecord) and (record.session, record.seq) in continuations):
                writer.append_redacted(record)
    given_up = audit_cassette(passed_on, options=AuditOptions(max_staleness=1)).findings.rules
    assert given_up["aborted-by-update"].sessions == {named[A]: 1, named[B]: 1}
    assert given_up["aborted-by-update"].kinds == {"engine-wide update": 2}
    assert (
        "/update_weight_version (engine-wide, no session's) made while it ran"
        in given_up["aborted-by-update"].examples[0].detail
    )
    assert rules["stale-tokens"].sessions == {named[C]: 1}
    assert "versions 2 to 4, 2 apart" in rules["stale-tokens"].examples[0].detail
    assert list(rules["version-not-current"].sessions) == [named[D]]
    example = rules["version-not-current"].examples[0]
    assert "of version 3, where the recorded updates made 4 current" in example.detail
    assert rules["version-not-current"].total == rules["version-not-current"].sessions[named[D]] > 0
    assert not rules["version-uncovered"].fired
    # JSON, text and the HTML page say the same; parts (-j) give the same report as one pass
    assert main(["audit", str(recorded), "--json", "--max-staleness", "1", "--fail-on", "version-not-current"]) == 1
    out = json.loads(capsys.readouterr().out)
    json_rules = out["cassettes"][0]["rules"]
    assert json_rules["stale-tokens"]["sessions"] == {named[C]: 1} and not json_rules["aborted-by-update"]["sessions"]
    assert json_rules["version-not-current"]["sessions"] == {named[D]: rules["version-not-current"].total}
    assert out["rules"]["version-not-current"]["description"].startswith("an output token of a weight version")
    assert main(["audit", str(recorded), "--max-staleness", "1", "--fail-on", ""]) == 0
    text = capsys.readouterr().out
    assert "stale-tokens" in text and "version-not-current" in text and named[C] in text
    page = Path(recorded.parent / "audit.html")
    assert main(["audit", str(recorded), "--html", str(page), "--fail-on", ""]) == 0
    assert ">version-not-current</a>" in page.read_text() and ">stale-tokens</a>" in page.read_text()
    one = to_json(audit([str(recorded)], options=AuditOptions(1)))
    parts = to_json(audit([str(recorded)], dispatch=pool_dispatch(1), unit_most=1, options=AuditOptions(1)))
    assert json.dumps(parts) == json.dumps(one)
    # the same traffic without the trainer's events (as a recorder before version 7 kept it): one abort is seen
    # only by its mark on the session's next version, the other not at all, and no version is knowable
    blind = recorded.parent / "no_events.tito"
    with CassetteReader(recorded) as reader, CassetteWriter(blind, reader.header, header_redacted=True) as writer:
        for record in reader.records():
            if not isinstance(record, EngineEvent):
                writer.append_redacted(record)
    unseen = audit_cassette(blind, options=AuditOptions(max_staleness=1)).findings.rules
    assert not unseen["aborted-by-update"].fired and not unseen["version-not-current"].fired
    # A's sample spans versions 1 and 2 (its first turn across the update): within --max-staleness 1, beyond 0
    strict = audit_cassette(recorded, options=AuditOptions(max_staleness=0)).findings.rules["stale-tokens"]
    assert named[A] in strict.sessions and named[B] not in strict.sessions


def test_live_metrics_count_stale_samples_and_tokens_with_max_staleness(recorded: Path) -> None:
    """The live path (`tito record --metrics --max-staleness N`): the writer process's observer, given the option
    as `--observer-option`, counts what `tito audit --max-staleness N` counts, and the tokens beyond N."""
    from tito_rl.recorder.metrics import RecordMetrics

    layout = Layout(observer="tito_rl.replayer.audit.live:observer", observer_options=(("max_staleness", "1"),))
    assert layout.argv()[-4:] == ["--observer", "tito_rl.replayer.audit.live:observer", "--observer-option",
                                  "max_staleness=1"]  # fmt: skip
    metrics = RecordMetrics("t")
    factory = _observer("tito_rl.replayer.audit.live:observer", ["max_staleness=1"])
    assert factory is not None
    with CassetteReader(recorded) as reader:
        live = LiveAudit(reader.header, metrics.writer_event, AuditOptions(max_staleness=1))
        assert factory(reader.header).inner.versions.max_staleness == 1  # type: ignore[attr-defined]
        for record in reader.records():
            live.record(record)
    live.close()
    audited = audit_cassette(recorded, options=AuditOptions(max_staleness=1))
    for rule in ("stale-tokens", "aborted-by-update", "version-not-current", "trained-not-emitted"):
        value = metrics.registry.get_sample_value("tito_audit_findings_total", {"target": "t", "rule": rule})
        assert value == audited.findings.rules[rule].total, rule
        assert (value > 0) == (rule in ("stale-tokens", "version-not-current")), rule  # the aborts were continued
    stale = metrics.registry.get_sample_value("tito_audit_stale_tokens_total", {"target": "t"})
    assert stale is not None and stale > 0  # C's first turn: version 2, two behind its sample's newest (4)
    # without the option nothing is stale, as `tito audit` without --max-staleness
    plain = RecordMetrics("t")
    with CassetteReader(recorded) as reader:
        quiet = observer(reader.header, plain.writer_event)
        for record in reader.records():
            quiet.record(record)
    quiet.close()
    assert plain.registry.get_sample_value("tito_audit_findings_total", {"target": "t", "rule": "stale-tokens"}) == 0


def test_a_version_6_cassette_reads_and_audits_as_before(tmp_path: Path) -> None:
    """The committed cassettes (format 6 and older) read with no events, their summaries' bytes as before, and an
    in-session update is still judged as it was."""
    slime = ROOT / "cassettes" / "targets" / "slime_mixed.tito"
    old = read_cassette(slime)
    assert old.header.format_version < 7 and old.events == [] and "engine_events" not in summarize(slime).to_dict()
    assert open_cassette(slime).events == []
    assert not audit_cassette(slime).findings.rules["version-not-current"].fired


def test_an_event_naming_a_session_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "bad.tito"
    with Recording(path) as rec:
        rec.writer.engine_event(EngineExchange("POST", "/pause_generation", {}, 200, {}, order=[0, 1]))
    data = path.read_bytes()
    frame = {"t": "event", "session": "sid-x", "seq": 0, "method": "POST", "path": "/x", "request": None,
             "status": 200, "order": [0, 1]}  # fmt: skip
    bad = tmp_path / "named.tito"
    with CassetteReader(path) as reader:
        header_end = reader._file.tell()
    bad.write_bytes(data[:header_end] + encode_frame(frame))
    with pytest.raises(CorruptCassetteError, match="engine-wide event named a session"), CassetteReader(bad) as r:
        list(r.records())
    reversed_order = tmp_path / "order.tito"
    reversed_order.write_bytes(data[:header_end] + encode_frame({**frame, "session": "", "order": [3, 1]}))
    with pytest.raises(CorruptCassetteError, match="not \\[started, answered\\]"), CassetteReader(reversed_order) as r:
        list(r.records())


def test_cut_keeps_the_events_and_merge_keeps_one_recordings(tmp_path: Path) -> None:
    from tests.audit_support import FIRST, SYSTEM, ids, text_reply
    from tito_rl.replayer.cassette_tools.cut_merge import cut, merge

    def made(name: str, sessions: tuple[str, ...]) -> Path:
        with Recording(tmp_path / name) as rec:
            for n, session in enumerate(sessions):
                rec.engine(ids(SYSTEM), ids(FIRST), session=session)
                rec.writer.engine_event(
                    EngineExchange("POST", "/update_weight_version", {"new_version": str(n + 2)}, 200, {},
                                   order=[2 * n, 2 * n + 1])
                )  # fmt: skip
                rec.agent(text_reply("Hello there."), session=session)
        return tmp_path / name

    first, second = made("first.tito", ("sid-a", "sid-b")), made("second.tito", ("sid-c",))
    cut(first, tmp_path / "cut.tito", ["sid-b"])
    kept = read_cassette(tmp_path / "cut.tito")
    assert list(kept.sessions) == ["sid-b"] and [e.request for e in kept.events] == [
        {"new_version": "2"},
        {"new_version": "3"},
    ]
    written = merge([first, second], tmp_path / "merged.tito")
    merged = read_cassette(tmp_path / "merged.tito")
    assert len(merged.events) == 2 and list(merged.sessions) == ["sid-a", "sid-b", "sid-c"]
    assert any("engine-wide event(s) left out" in w for w in written.warnings)


def test_record_takes_max_staleness_only_with_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for extra in ([], ["--metrics", "127.0.0.1:0", "--max-staleness", "-1"]):
        args = ["record", "--engine", "http://127.0.0.1:9", "--out", str(tmp_path / "x.tito"), "--max-staleness", "1"]
        assert main([*args[:-2], *extra] if extra else args) == 2
        assert "--max-staleness N: N >= 0, with --metrics" in capsys.readouterr().err
    assert not (tmp_path / "x.tito").exists()
