"""Work units (`tito_rl.replayer.units`): `tito audit -j N` and `tito replay -j N` cut one cassette into ranges of
sessions, each read by its worker from the cassette's index alone, and give the same bytes as `-j 1` for any cut:
reports (text, JSON, HTML, JUnit), exports, exit codes, the first error of a damaged file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.audit_support import FIRST, SECOND, SYSTEM, USER, Recording, ids, logprobs, sample, text_reply
from tito_rl.cassette.reader import CassetteReader
from tito_rl.main import main
from tito_rl.replayer.audit.html_page import render_html
from tito_rl.replayer.audit.report import render_text, to_json
from tito_rl.replayer.audit.runner import AuditJob, audit, plan_cassette, units_of
from tito_rl.replayer.replay import batch
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.replayer.units import FileStamp, UnitFileChanged, pool_dispatch, run_unit, split_cassette
from tito_rl.replayer.workers import Backend

ROOT = Path(__file__).resolve().parent.parent

# What each session's samples do to its two turns: (first output trained, with which logprobs), its fate.
FAULTS = ("clean", "masked", "twice", "bad-logprob", "no-logprobs", "dropped", "unfinished")


def interleaved(path: Path, sessions: int = 14) -> Path:
    """`sessions` sessions recorded at once, their records interleaved turn by turn as a concurrent recording's
    are, each with one of `FAULTS` (so several rules fire in more sessions than they keep examples of)."""
    p0, o0, ctx, o1 = ids(SYSTEM), ids(FIRST), ids(USER), ids(SECOND)
    names = [f"s{i:02d}" for i in range(sessions)]
    fault = {n: FAULTS[i % len(FAULTS)] for i, n in enumerate(names)}
    with Recording(path) as rec:
        for turn in range(2):
            for i, name in enumerate(names):
                if turn == 0:
                    rec.engine(p0, o0, session=name, lps=None if fault[name] == "no-logprobs" else True)
                    rec.agent(text_reply("Hello there."), session=name)
                else:
                    rec.engine(p0 + o0 + ctx, o1, session=name)
                    rec.agent(text_reply("Done."), session=name)
                if turn == 1 and i % 3 == 2:  # finishes land between other sessions' turns
                    finish(rec, names[i - 2 : i + 1], fault, p0, o0, ctx, o1)
        finish(rec, names[sessions - sessions % 3 :], fault, p0, o0, ctx, o1)
    return path


def finish(rec: Recording, names: list[str], fault: dict[str, str], p0, o0, ctx, o1) -> None:  # noqa: ANN001
    for name in names:
        kind = fault[name]
        if kind == "dropped":
            rec.writer.session_dropped(name, "named")
            continue
        if kind == "unfinished":
            continue
        first = (o0, 0 if kind == "masked" else 1, logprobs(o0, -0.9 if kind == "bad-logprob" else -0.5))
        made = [sample(p0, [first, (ctx, 0, None), (o1, 1, logprobs(o1))])]
        if kind == "twice":
            made.append(sample(p0, [(o0, 1, logprobs(o0))]))
        rec.finish(made, session=name)


def reports(inputs: list[str], **kwargs: object) -> tuple[str, str, str]:
    report = audit(inputs, **kwargs)  # type: ignore[arg-type]
    return json.dumps(to_json(report), ensure_ascii=False), render_text(report), render_html(report)


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return interleaved(tmp_path_factory.mktemp("units") / "many.tito")


def test_audit_units_merge_into_the_report_of_one_pass(many: Path) -> None:
    one = reports([str(many)])
    fired = json.loads(one[0])["cassettes"][0]["rules"]
    assert {r for r, v in fired.items() if v["total"]} >= {"coverage", "never-trained", "trained-twice"}
    assert len(fired["coverage"]["sessions"]) > 3 and len(fired["coverage"]["examples"]) == 3  # more than it keeps
    for most in (1, 2, 5):  # units of one session, a few, and uneven ones
        assert reports([str(many)], jobs=2, unit_most=most) == one, most
    assert reports([str(many)], dispatch=pool_dispatch(1), unit_most=3) == one  # the units run in this process


def test_a_unit_reads_only_its_sessions_frames(many: Path) -> None:
    plan = plan_cassette(many)
    units = units_of([plan], workers=1, most=8)  # about four units a worker
    assert [len(u.sessions) for u in units] == [4, 4, 4, 2]
    assert [u.number for u in units] == [0, 1, 2, 3] and {u.cassette for u in units} == {0}
    read: list[int] = []
    original = CassetteReader.records_at

    def noting(self: CassetteReader, entries, **kwargs):  # noqa: ANN001, ANN202
        for offset, record in original(self, entries, **kwargs):
            read.append(offset)
            yield offset, record

    CassetteReader.records_at = noting  # type: ignore[method-assign,assignment]
    try:
        part = run_unit(AuditJob(), units[1])
    finally:
        CassetteReader.records_at = original  # type: ignore[method-assign]
    assert sorted(read) == sorted(o for s in units[1].sessions for o in s.frames)
    assert part.findings is not None and set(part.findings.figures) == set(units[1].names)


def test_a_unit_refuses_a_cassette_changed_since_planned(many: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.tito"
    shutil.copy(many, copy)
    unit = split_cassette(str(copy), plan_cassette(copy).sessions, 100, 0, 0)[0]
    assert unit.stamp == FileStamp.of(copy)
    with copy.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(UnitFileChanged, match="changed since the run was planned"):
        unit.check()
    part = run_unit(AuditJob(), unit)
    assert part.failure is not None and "changed since" in part.failure.message


def test_audit_jobs_on_a_cut_and_a_damaged_cassette_say_what_one_process_says(
    many: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = many.read_bytes()
    cut = tmp_path / "cut.tito"  # a killed recorder: no index, the last record cut short; scanned
    cut.write_bytes(data[: len(data) * 2 // 3])
    one = reports([str(cut)])
    assert json.loads(one[0])["cassettes"][0]["truncated"] is True
    assert reports([str(cut)], jobs=2, unit_most=2) == one

    plan = plan_cassette(many)
    damaged = tmp_path / "damaged.tito"  # two records' payloads damaged: the first in the file is named
    raw = bytearray(data)
    for session in (plan.sessions[9], plan.sessions[2]):
        raw[session.frames[1] + 20] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    outputs = []
    for jobs in ("1", "2"):
        code = main(["audit", str(damaged), "-j", jobs])
        captured = capsys.readouterr()
        outputs.append((code, captured.out, captured.err))
    assert outputs[0] == outputs[1]
    assert outputs[0][0] == 2 and outputs[0][2].count("\n") == 1 and "corrupt cassette" in outputs[0][2]
    assert f"byte {plan.sessions[2].frames[1]}" in outputs[0][2]


def test_audit_jobs_exit_codes_and_pages_equal_one_process(
    many: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = []
    for jobs in ("1", "2"):
        html = tmp_path / f"audit-{jobs}.html"
        code = main(["audit", str(many), str(ROOT / "cassettes" / "tool_loop.tito"), "-j", jobs])
        out = capsys.readouterr()
        page = main(["audit", str(many), "-j", jobs, "--html", str(html), "--fail-on", ""])
        runs.append((code, out.out, out.err, page, html.read_bytes()))
        capsys.readouterr()
    assert runs[0] == runs[1]
    assert runs[0][0] == 1 and runs[0][3] == 0  # trained-twice fires; with no rule to fail on, exit 0


# tito replay


def replay_outcomes(paths: list[str], **kwargs: object) -> list[batch.SessionOutcome]:
    options = ReplayOptions()
    works = batch.plan_work(paths, None, options)
    job = batch.Job(options, export_replayed=True, export_live=True)
    out: list[batch.SessionOutcome] = []
    batch.replay_all(works, job, emit=out.append, **kwargs)  # type: ignore[arg-type]
    return out


def test_replay_units_give_the_outcomes_of_one_process() -> None:
    paths = [str(ROOT / "cassettes" / f"{name}.tito") for name in ("mixed_concurrent", "openai_wires")]
    one = replay_outcomes(paths, backend=Backend(1))
    assert len(one) == 12 and all(o.ok for o in one) and sum(bool(o.replayed_rows) for o in one) == 11  # one dropped
    assert replay_outcomes(paths, backend=Backend(1), dispatch=pool_dispatch(1), unit_most=1) == one  # 12 units, here
    assert replay_outcomes(paths, backend=Backend(2), unit_most=5) == one  # forked workers, units of 5, 5, 2 and 2


def test_a_replay_unit_holds_only_its_sessions() -> None:
    path = str(ROOT / "cassettes" / "mixed_concurrent.tito")
    works = batch.plan_work([path], None, ReplayOptions())
    units = batch.plan_units(works, workers=1, most=4)
    assert [len(u.sessions) for u in units] == [3, 3, 3, 1]
    view = units[1].cassette_view(packed_prompts=True)
    assert list(view.sessions) == units[1].names == works[0].sessions[3:6]
    job = batch.ReplayUnits(batch.Job(ReplayOptions()), [batch.cassette_settings(works[0], ReplayOptions())])
    assert job.reads(units[1]) == [path, str(ROOT / "cassettes" / "mixed_concurrent.golden")]
    outcomes = run_unit(job, units[1])
    assert [o.session for o in outcomes] == units[1].names and all(o.ok for o in outcomes)
