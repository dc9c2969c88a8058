"""Replay's parts on their own: the step order, first-difference reports, golden files, exports."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from tito_rl.cassette.format.records import AgentRecord, DropRecord, EngineRecord, Header, SamplesRecord
from tito_rl.cassette.reader import SessionLog
from tito_rl.replayer.comparison.differences import (
    json_difference,
    reply_difference,
    samples_difference,
    token_divergence,
)
from tito_rl.replayer.goldens import diff_view as golden_diff
from tito_rl.replayer.goldens import files as goldens
from tito_rl.replayer.goldens.diff_view import DiffStyle
from tito_rl.replayer.replay.agent_leg import REPLAY_HEADER, request_headers
from tito_rl.replayer.replay.cli import Progress
from tito_rl.replayer.replay.plan import Drop, End, Finish, Start, plan_session
from tito_rl.replayer.replay.results import CassetteResult, SessionResult
from tito_rl.replayer.reporting import exports


def _agent(seq: int, started: float, duration: float, **kw) -> AgentRecord:
    return AgentRecord(
        "s", seq, "POST", "/v1/messages", "", {}, b"{}", 200, {}, started_s=started, duration_s=duration, **kw
    )


def _steps(log: SessionLog) -> list[str]:
    names = {Start: "S", End: "E", Finish: "F", Drop: "D"}
    return [
        names[type(s)] + (str(s.exchange.index) if isinstance(s, Start | End) else "") for s in plan_session(log).steps
    ]


def test_steps_keep_answer_order_for_ends_and_start_order_for_starts() -> None:
    log = SessionLog(
        "s",
        "bearer",
        [
            EngineRecord("s", 1, "POST", "/generate", {}, 200),
            _agent(2, 0.0, 1.0),  # answered first, at 1.0
            _agent(3, 0.5, 0.6),  # started while the first was in flight, answered at 1.1
        ],
    )
    assert _steps(log) == ["S0", "S1", "E0", "E1"]
    sequential = SessionLog("s", "bearer", [_agent(1, 0.0, 0.1), _agent(2, 0.2, 0.1), _agent(3, 0.4, 0.1)])
    assert _steps(sequential) == ["S0", "E0", "S1", "E1", "S2", "E2"]
    late_start = SessionLog("s", "bearer", [_agent(1, 0.3, 0.1), _agent(2, 0.0, 0.5)])  # 1 began first
    assert _steps(late_start) == ["S1", "S0", "E0", "E1"]


def test_finish_and_drop_are_barriers_and_engine_calls_belong_to_the_next_exchange() -> None:
    log = SessionLog(
        "s",
        "bearer",
        [
            EngineRecord("s", 1, "POST", "/generate", {}, 200),
            _agent(2, 0.0, 1.0),
            SamplesRecord("s", 3, 1.0, []),
            EngineRecord("s", 4, "POST", "/abort_request", {}, 200),
            EngineRecord("s", 5, "POST", "/generate", {}, 200),
            _agent(6, 0.0, 0.5),
            DropRecord("s", 7),
            EngineRecord("s", 8, "POST", "/generate", {}, 200),  # the recorder died before its agent exchange
        ],
    )
    plan = plan_session(log)
    assert _steps(log) == ["S0", "E0", "F", "S1", "E1", "D"]
    assert [[r.path for r in e.engine] for e in plan.exchanges] == [["/generate"], ["/abort_request", "/generate"]]
    assert plan.unanswered_engine_calls == 1 and not plan.engine_only
    assert plan_session(SessionLog("v", "named", [EngineRecord("v", 1, "POST", "/generate", {}, 200)])).engine_only


def test_replayed_requests_carry_the_session_name_where_the_credential_was() -> None:
    record = AgentRecord(
        "sid-1",
        1,
        "POST",
        "/v1/messages",
        "",
        {
            "Authorization": "<redacted>",
            "x-api-key": "<redacted>",
            "Cookie": "<redacted>",
            "Host": "127.0.0.1:8400",
            "Content-Length": "12",
            "anthropic-version": "2023-06-01",
        },
        b"{}",
        200,
        {},
    )
    headers = request_headers(record, "bearer", "sid-0123456789abcdef", 4)
    assert headers == {
        "Authorization": "Bearer sid-0123456789abcdef",
        "anthropic-version": "2023-06-01",
        REPLAY_HEADER: "4 sid-0123456789abcdef",
    }
    assert request_headers(record, "x-api-key", "sid-0123456789abcdef", 0)["x-api-key"] == "sid-0123456789abcdef"


def test_json_differences_are_reported_as_paths() -> None:
    recorded = {"content": [{"type": "text", "text": "hi"}, {"type": "tool_use", "input": {"command": "ls"}}]}
    replayed = json.loads(json.dumps(recorded))
    assert json_difference(recorded, replayed) is None
    replayed["content"][1]["input"]["command"] = "ls -la"
    assert json_difference(recorded, replayed) == ("content[1].input.command", "ls", "ls -la")
    assert json_difference({"a": 1}, {"a": 1, "b": 2}) == ("b", "<absent>", 2)
    assert json_difference([1, 2], [1]) == ("[1]", 2, "<absent>")
    assert json_difference({"n": 1}, {"n": 1.0}) is None  # JSON numbers compare by value
    assert json_difference({"n": 1}, {"n": "1"}) == ("n", 1, "1")


def test_sse_reply_differences_name_the_event_and_the_path() -> None:
    def event(name: str, data: dict) -> str:
        return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"

    recorded = [
        event("message_start", {"message": {"id": "msg_1"}}),
        event("content_block_delta", {"delta": {"text": "Hello"}}),
    ]
    replayed = [recorded[0], event("content_block_delta", {"delta": {"text": "Hullo"}})]
    assert reply_difference(None, recorded, None, list(recorded)) is None
    assert reply_difference(None, recorded, None, replayed) == [
        "event 1 (content_block_delta): delta.text",
        "recorded: 'Hello'",
        "replayed: 'Hullo'",
    ]
    assert reply_difference(None, recorded, None, recorded[:1])[0].startswith("recorded 2 events, replayed 1")
    assert reply_difference(b'{"a": 1}', None, b'{"a":1}', None)[0] == "same JSON, different bytes"


def test_sample_differences_name_sample_field_token_and_turn() -> None:
    live = [
        {
            "tokens": [1, 2, 3, 4],
            "response_length": 2,
            "loss_mask": [1, 1],
            "rollout_log_probs": [-0.5, -0.25],
            "reward": 1.0,
            "metadata": {"turns": [0]},
        }
    ]
    same = json.loads(json.dumps(live))
    assert samples_difference(live, same, str) is None
    changed = json.loads(json.dumps(live))
    changed[0]["tokens"][3] = 9
    difference = samples_difference(
        live, changed, lambda ids: " ".join(map(str, ids)), turn_of=lambda sample, token: 7 if token >= 2 else None
    )
    assert difference is not None
    summary, detail, turn = difference
    assert summary == "sample 0: tokens differ" and turn == 7
    assert "first difference at index 3 (token 3, in turn 7's response)" in detail[0]
    assert detail[1].startswith("recorded: …'1 2 3' | '4'") and detail[2].startswith("replayed: …'1 2 3' | '9'")
    logprob = json.loads(json.dumps(live))
    logprob[0]["rollout_log_probs"][1] = -0.2500001
    assert samples_difference(live, logprob, str)[0] == "sample 0: rollout_log_probs differ"  # exactly, not ~
    assert samples_difference(live, live + live, str)[0] == "recorded: 1 sample(s), replayed: 2"
    assert token_divergence([1, 2, 3], [1, 2]) == 2 and token_divergence([5], [5]) is None


def _result(path: Path, *names: str) -> CassetteResult:
    return CassetteResult(
        str(path), Header("sha256:x"), [SessionResult(str(path), n) for n in names], all_sessions=list(names)
    )


def test_golden_sections_are_checked_updated_and_kept_in_cassette_order(tmp_path: Path, monkeypatch) -> None:
    cassette = tmp_path / "c.tito"
    text = {"a": "== session a ==\nsamples:\n  one\n", "b": "== session b ==\nsamples:\n  two\n"}
    monkeypatch.setattr(goldens, "section", lambda result, names: text[result.session])
    result = _result(cassette, "a", "b")
    goldens.check(result, ["a", "b"], str)
    assert [s.golden for s in result.sessions] == ["missing", "missing"]
    assert not goldens.golden_path(cassette).exists()  # checking never writes
    goldens.check(_result(cassette, "b"), ["a", "b"], str, update=True)  # one session's section only
    head, sections = goldens.parse(goldens.golden_path(cassette).read_text())
    assert list(sections) == ["b"] and "--update-goldens" in head
    goldens.check(result := _result(cassette, "a"), ["a", "b"], str, update=True)
    assert result.sessions[0].golden == "written"
    assert list(goldens.parse(goldens.golden_path(cassette).read_text())[1]) == ["a", "b"]  # cassette order
    text["b"] = "== session b ==\nsamples:\n  TWO\n"
    result = _result(cassette, "a", "b")
    goldens.check(result, ["a", "b"], str)
    assert [s.golden for s in result.sessions] == ["ok", "changed"]
    assert result.sessions[1].golden_diff[-2:] == ["-  two", "+  TWO"]
    goldens.check(_result(cassette, "a"), ["a"], str, update=True)  # b left the cassette: its section goes
    assert list(goldens.parse(goldens.golden_path(cassette).read_text())[1]) == ["a"]


def test_golden_diffs_are_bounded_with_a_count_of_what_was_cut() -> None:
    old = "\n".join(f"line {i}" for i in range(200))
    new = "\n".join(f"line {i}!" for i in range(200))
    raw = goldens.unified_diff(old, new, "s")
    whole = golden_diff.render(raw, DiffStyle(full=True, limit=10))
    diff = golden_diff.render(raw, DiffStyle(limit=10, more="-vv shows it whole"))
    assert diff[:10] == whole[:10] and diff[10:] == [f"… {len(raw) - 10} more diff line(s) cut; -vv shows it whole"]
    assert whole[-2:] == ["+line 199!", "?line 199{+!+}"]  # nothing cut, each changed line marked


def test_parallel_updates_of_one_golden_keep_every_section(tmp_path: Path, monkeypatch) -> None:
    cassette = tmp_path / "c.tito"
    names = [f"s{i}" for i in range(8)]
    monkeypatch.setattr(goldens, "section", lambda result, _: f"== session {result.session} ==\nx\n")
    threads = [
        threading.Thread(target=goldens.check, args=(_result(cassette, n), names, str), kwargs={"update": True})
        for n in names
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert list(goldens.parse(goldens.golden_path(cassette).read_text())[1]) == names


def test_orphan_goldens_are_found(tmp_path: Path) -> None:
    (tmp_path / "kept.tito").write_bytes(b"")
    (tmp_path / "kept.golden").write_text("")
    (tmp_path / "gone.golden").write_text("")
    assert goldens.orphans([tmp_path]) == [tmp_path / "gone.golden"]


def test_exports_have_one_shape_for_live_and_replayed_samples(tmp_path: Path) -> None:
    sample = {
        "tokens": [1, 2],
        "response_length": 1,
        "loss_mask": [1],
        "rollout_log_probs": [-0.1],
        "reward": 1.0,
        "metadata": {"session": "sid-1"},
    }
    session = SessionResult("c.tito", "sid-1", live_samples=[sample])
    rows = list(exports.live_rows([CassetteResult("c.tito", Header("sha256:x"), [session])]))
    assert rows == [
        '{"session":"sid-1","index":0,"tokens":[1,2],"response_length":1,"loss_mask":[1],'
        '"rollout_log_probs":[-0.1],"reward":1.0,"metadata":{"session":"sid-1"}}'
    ]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_on_a_terminal_only() -> None:
    terminal = _Terminal()
    bar = Progress(terminal, delay_s=0)
    bar.add_total(3)
    for _ in range(3):
        bar.step()
    bar.close()
    shown = terminal.getvalue()
    assert "replay:" in shown and "/3 [" in shown and "exchange/s" in shown  # the total, once known
    assert shown.endswith("\r")  # cleared at the end: the result lines stand alone
    piped = io.StringIO()
    quiet = Progress(piped, delay_s=0)
    quiet.add_total(3)
    quiet.step()
    quiet.close()
    assert piped.getvalue() == ""
