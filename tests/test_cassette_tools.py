"""`tito cassette export | cut | merge` on real cassettes: the committed corpus and recordings made in-process.

A cut session replays like it did in the original, a merge of separate recordings replays clean (against
goldens written for it, and against the originals' goldens), records are copied without a second redaction,
and the refusals (clashing names, another tokenizer or parsers, an existing output) are one line each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cassette_helpers import header
from tests.replay_support import Live, record, tool_loop, tool_loop_scenario
from tito_rl.cassette.format.records import (
    FORMAT_VERSION,
    RECORD_TYPES,
    AgentRecord,
    EngineRecord,
    Header,
    SamplesRecord,
)
from tito_rl.cassette.reader import CassetteReader, read_cassette
from tito_rl.cassette.redaction import Redactor
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.main import main
from tito_rl.replayer.cassette_tools.cut_merge import MERGE_IGNORED_ADAPTER_KEYS
from tito_rl.replayer.goldens import files as goldens
from tito_rl.replayer.pytest_plugin.fixtures import replay
from tito_rl.replayer.replay.cassette_replay import replay_cassette
from tito_rl.replayer.replay.results import CassetteResult, SessionResult
from tito_rl.trajectory.adapters.session import session_digest
from tito_rl.trajectory.adapters.tap import AgentExchange
from tito_rl.trajectory.golden import TokenizerNames
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

CORPUS = Path(__file__).resolve().parents[1] / "cassettes"
WIRES = CORPUS / "openai_wires.tito"  # two sessions: chat completions (finished) and Responses (dropped)
MAIN, OTHER = "live-token-main-0001", "live-token-other-0002"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main(["cassette", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sessions_of(path: Path) -> list[str]:
    return list(read_cassette(path).sessions)


def section(result: SessionResult) -> str:
    return goldens.section(result, TokenizerNames(load_tokenizer()))


def replayed_samples(result: SessionResult) -> list[dict[str, Any]]:
    return [s for f in result.finishes for s in f.samples]


def committed_sections(*cassettes: Path) -> dict[str, str]:
    """The sessions' sections in the goldens committed beside these cassettes."""
    return {
        name: text for c in cassettes for name, text in goldens.parse(goldens.golden_path(c).read_text())[1].items()
    }


def rewritten(source: Path, out: Path, **header_changes: Any) -> Path:
    """`source` with some header values changed: what a proxy run with other settings would have written."""
    with CassetteReader(source) as reader:
        changed = Header(**{**reader.header.to_dict(), **header_changes})
        with CassetteWriter(out, changed, header_redacted=True) as writer:
            for r in reader.records():
                writer.append_redacted(r)
    return out


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, list[dict[str, Any]]]]:
    """Two recordings of separate proxy runs (each its own fake engine), one session each."""
    folder = tmp_path_factory.mktemp("proxies")
    live: dict[str, list[dict[str, Any]]] = {}
    paths = []
    for sid, turns in ((MAIN, 3), (OTHER, 4)):

        async def drive(run: Live, sid: str = sid) -> None:
            await tool_loop(run.conversation(sid, stream=sid == MAIN))
            await run.finish(sid, 1.0)

        paths.append(folder / f"{sid}.tito")
        live.update(record(paths[-1], tool_loop_scenario(turns), drive))
    return paths[0], paths[1], live


# ---- cut ----


def test_a_cut_keeps_the_header_and_only_the_named_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name, other = sessions_of(WIRES)
    out = tmp_path / "bug.tito"
    code, stdout, _ = run_cli(capsys, "cut", WIRES, "--session", name, "--out", out)
    assert code == 0 and f"wrote {out}: 1 session(s): {name}" in stdout
    assert f"tito replay {out} --update-goldens" in stdout  # cutting writes no golden; the line says how
    assert not goldens.golden_path(out).exists()
    original, cut = read_cassette(WIRES), read_cassette(out)
    # the committed cassette is format version 1; a cut is written in the current one
    assert cut.header == Header(**{**original.header.to_dict(), "format_version": FORMAT_VERSION})
    assert not cut.truncated
    assert list(cut.sessions) == [name]
    assert cut.sessions[name].records == original.sessions[name].records  # every record, decoded, in order
    assert name in stdout and other not in stdout


def test_a_cut_session_replays_like_the_original(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = sessions_of(WIRES)[0]  # the finished one: it has samples to compare
    out = tmp_path / "bug.tito"
    assert run_cli(capsys, "cut", WIRES, "--session", name, "--out", out)[0] == 0
    (original,), (cut,) = replay_cassette(WIRES, [name]).sessions, replay_cassette(out).sessions
    assert original.ok and cut.ok, (original.differences, cut.differences)
    assert cut.exchanges == original.exchanges == 3
    assert section(cut) == section(original)
    assert replayed_samples(cut) == replayed_samples(original) and len(replayed_samples(cut)) == 1
    assert cut.live_samples == original.live_samples

    # The documented way to give the cut its golden: it is the original's section for that session.
    assert main(["replay", str(out), "--update-goldens"]) == 0
    written = goldens.parse(goldens.golden_path(out).read_text())[1]
    assert written == {name: committed_sections(WIRES)[name]}
    assert main(["replay", str(out)]) == 0


def test_cutting_re_encodes_exactly_so_every_session_kept_gives_back_the_original_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The committed cassettes are format version 1: a first cut gives their records in version 3, record for
    # record; a cut of that gives back its bytes.
    loop = CORPUS / "tool_loop.tito"
    for source, names in ((WIRES, sessions_of(WIRES)), (loop, sessions_of(loop)[:1])):
        first, second = tmp_path / f"{source.stem}-1.tito", tmp_path / f"{source.stem}-2.tito"
        keep = [a for n in names for a in ("--session", n)]
        assert run_cli(capsys, "cut", source, *keep, "--out", first)[0] == 0
        assert dict(read_cassette(first).sessions) == dict(read_cassette(source).sessions)
        assert run_cli(capsys, "cut", first, *keep, "--out", second)[0] == 0
        assert second.read_bytes() == first.read_bytes()


def test_copied_records_are_never_redacted_a_second_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A cassette recorded with its own redaction patterns keeps what they let through: the default patterns
    would eat this key-shaped text, and replay re-sends bodies byte for byte."""
    key_like = "sk-ant-" + "Q" * 24  # a default pattern's match
    recorded = tmp_path / "own_patterns.tito"
    body = json.dumps({"note": key_like}).encode()
    with CassetteWriter(recorded, header(extra={"note": key_like}), redactor=Redactor(patterns=())) as writer:
        writer.agent_exchange(
            "probe-run",
            "path",
            AgentExchange("POST", "/s/probe-run/v1/messages", "", {}, body, 200, {}, reply_body=body),
        )
    out = tmp_path / "cut.tito"
    assert run_cli(capsys, "cut", recorded, "--session", "probe-run", "--out", out)[0] == 0
    assert out.read_bytes() == recorded.read_bytes()
    (agent,) = read_cassette(out).sessions["probe-run"].agent
    assert agent.body == agent.reply_body == body and read_cassette(out).header.extra == {"note": key_like}


def test_cut_refuses_an_unknown_session_and_a_broken_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.tito"
    code, stdout, err = run_cli(capsys, "cut", WIRES, "--session", "nope", "--out", out)
    assert code == 2 and stdout == "" and not out.exists()
    assert err == f"tito cassette cut: {WIRES}: no session 'nope'; it has {', '.join(sessions_of(WIRES))}\n"
    bad = tmp_path / "bad.tito"
    bad.write_bytes(b"definitely not a cassette")
    code, _, err = run_cli(capsys, "cut", bad, "--session", "x", "--out", out)
    assert code == 2 and err.startswith("tito cassette cut: ") and "not a tito cassette" in err
    assert err.count("\n") == 1 and not out.exists()


# ---- merge ----


def test_a_merge_of_two_recordings_replays_clean_and_holds_both_sessions(
    recordings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second, live = recordings
    merged = tmp_path / "merged.tito"
    code, stdout, err = run_cli(capsys, "merge", first, second, "--out", merged)
    assert code == 0 and err == ""
    main_name, other_name = session_digest(MAIN), session_digest(OTHER)
    assert sessions_of(merged) == [main_name, other_name]

    result = replay_cassette(merged)
    assert result.ok, [s.differences for s in result.sessions]
    for session, sid in zip(result.sessions, (MAIN, OTHER), strict=True):
        (finish,) = session.finishes
        named = [{**s, "metadata": {**s["metadata"], "session": session.session}} for s in live[sid]]
        assert finish.samples == finish.live == named
    # Each session replays in the merge as it does in its own recording.
    alone = [replay_cassette(p).sessions[0] for p in (first, second)]
    assert [section(s) for s in result.sessions] == [section(s) for s in alone]

    # Goldens written for the merge, then checked.
    assert replay(merged, update_goldens=True).ok
    checked = replay(merged)
    assert checked.ok and [s.golden for s in checked.sessions] == ["ok", "ok"]


def test_the_merged_header_is_the_first_inputs_noting_every_source(
    recordings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, recorded_second, _ = recordings
    # Two proxies, two engines: the second recording as its engine's other port would have it (the fixture's two
    # runs may get the same free port, one after the other).
    second = tmp_path / "second.tito"
    moved = read_cassette(recorded_second).header
    moved.adapter = {**moved.adapter, "engine_url": "http://127.0.0.1:1"}
    with CassetteWriter(second, moved, header_redacted=True) as writer, CassetteReader(recorded_second) as reader:
        for record in reader.records():
            writer.append_redacted(record)
    merged = tmp_path / "merged.tito"
    assert run_cli(capsys, "merge", first, second, "--out", merged)[0] == 0
    headers = [read_cassette(p).header for p in (first, second, merged)]
    assert headers[0].adapter["engine_url"] != headers[1].adapter["engine_url"]
    assert "engine_url" in MERGE_IGNORED_ADAPTER_KEYS
    sources = headers[2].extra.pop("merged_from")
    assert headers[2] == headers[0]
    assert sources == [
        {
            "path": str(p),
            "created": h.created,
            "tito_version": h.tito_version,
            "agent": h.agent,
            "sessions": sessions_of(p),
        }
        for p, h in zip((first, second), headers[:2], strict=True)
    ]


def test_a_merge_of_corpus_cassettes_replays_against_their_own_goldens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = [CORPUS / "tool_loop.tito", CORPUS / "subagent.tito", WIRES]
    merged = tmp_path / "corpus.tito"
    assert run_cli(capsys, "merge", *inputs, "--out", merged)[0] == 0
    names = [n for p in inputs for n in sessions_of(p)]
    assert sessions_of(merged) == names and len(names) == 4
    sections = committed_sections(*inputs)
    goldens.golden_path(merged).write_text(goldens.compose(merged, sections, names))
    result: CassetteResult = replay(merged)
    assert result.ok, [(s.session, s.differences, s.golden_diff) for s in result.sessions]
    assert [s.golden for s in result.sessions] == ["ok"] * 4


def test_merge_refuses_clashing_session_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = CORPUS / "tool_loop.tito"
    copy = tmp_path / "copy.tito"
    copy.write_bytes(loop.read_bytes())
    out = tmp_path / "out.tito"
    code, stdout, err = run_cli(capsys, "merge", CORPUS / "subagent.tito", loop, copy, "--out", out)
    assert code == 2 and stdout == "" and not out.exists()
    assert err == (
        f"tito cassette merge: session {sessions_of(loop)[0]!r} is in both {loop} and {copy}; "
        "session names must be unique in a cassette\n"
    )


@pytest.mark.parametrize(
    ("change", "key", "shown"),
    [
        ({"tokenizer_fingerprint": "sha256:0000"}, "tokenizer_fingerprint", '"sha256:0000"'),
        ({"parsers": {"reasoning": "qwen3", "tool_call": "llama3"}}, "parsers.tool_call", '"llama3"'),
        ({"adapter": {"manager": {"reward_policy": "split"}}}, "adapter.manager.reward_policy", '"split"'),
        ({"adapter": {"preserve_reasoning": False}}, "adapter.preserve_reasoning", "false"),
        ({"adapter": {"side_patterns": ["naming"]}}, "adapter.side_patterns", '["naming"]'),  # missing in the corpus
    ],
)
def test_merge_refuses_inputs_that_replay_differently(
    change: dict[str, Any], key: str, shown: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = CORPUS / "tool_loop.tito"
    if "adapter" in change:  # one adapter or manager setting changed, everything else as recorded
        adapter = read_cassette(loop).header.adapter
        changed = dict(change["adapter"])
        manager = {**adapter["manager"], **changed.pop("manager", {})}
        change = {"adapter": {**adapter, **changed, "manager": manager}}
    other = rewritten(CORPUS / "subagent.tito", tmp_path / "other.tito", **change)
    out = tmp_path / "out.tito"
    code, _, err = run_cli(capsys, "merge", loop, other, "--out", out)
    assert code == 2 and not out.exists() and err.count("\n") == 1
    assert err.startswith(f"tito cassette merge: cannot merge: {key} is {shown} in {other} but ")
    assert f"in {loop}; replay depends on it" in err


def test_a_setting_a_header_lacks_counts_as_its_default(
    recordings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recording from before `side_patterns` existed; replay uses the default for it, which today's
    recordings write out: the two merge, and replay clean."""
    recorded = recordings[0]
    adapter = {**read_cassette(CORPUS / "tool_loop.tito").header.adapter, "splice": True}  # as `recorded`
    loop = rewritten(
        CORPUS / "tool_loop.tito",
        tmp_path / "old.tito",
        adapter={k: v for k, v in adapter.items() if k != "side_patterns"},
    )
    assert "side_patterns" not in read_cassette(loop).header.adapter
    assert "side_patterns" in read_cassette(recorded).header.adapter
    merged = tmp_path / "merged.tito"
    assert run_cli(capsys, "merge", loop, recorded, "--out", merged)[0] == 0
    result = replay_cassette(merged)
    assert result.ok and len(result.sessions) == 2, [s.differences for s in result.sessions]


def test_a_header_without_splice_was_recorded_unspliced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Missing `splice` is not today's default: such a cassette's prompts were rendered. It merges with a
    `splice: false` recording, never with a spliced one."""
    adapter = read_cassette(CORPUS / "tool_loop.tito").header.adapter
    assert adapter["splice"] is True
    old = rewritten(
        CORPUS / "tool_loop.tito", tmp_path / "old.tito", adapter={k: v for k, v in adapter.items() if k != "splice"}
    )
    spliced = CORPUS / "subagent.tito"
    code, _, err = run_cli(capsys, "merge", old, spliced, "--out", tmp_path / "out.tito")
    assert code == 2 and "adapter.splice is true in" in err
    unspliced = rewritten(spliced, tmp_path / "unspliced.tito", adapter={**adapter, "splice": False})
    assert run_cli(capsys, "merge", old, unspliced, "--out", tmp_path / "merged.tito")[0] == 0


def test_a_truncated_input_is_merged_up_to_its_cut_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cut_short = tmp_path / "killed.tito"
    cut_short.write_bytes((CORPUS / "tool_loop.tito").read_bytes()[:-10])  # the samples record is cut
    out = tmp_path / "merged.tito"
    code, _, err = run_cli(capsys, "merge", CORPUS / "subagent.tito", cut_short, "--out", out)
    assert code == 0
    assert err == (
        f"tito cassette merge: warning: {cut_short} ends in a cut record (the recorder stopped "
        "mid-write); copied up to its last complete record\n"
    )
    merged, killed = read_cassette(out), read_cassette(cut_short)
    assert killed.truncated and not merged.truncated
    (name,) = killed.sessions
    assert merged.sessions[name].records == killed.sessions[name].records
    assert not any(isinstance(r, SamplesRecord) for r in merged.sessions[name].records)
    assert merged.header.extra["merged_from"][1]["truncated"] is True


# ---- export ----


def test_export_is_json_with_the_token_ids_the_reader_gives(capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, _ = run_cli(capsys, "export", WIRES)
    assert code == 0
    exported = json.loads(stdout)
    cassette = read_cassette(WIRES)
    assert exported["header"] == cassette.header.to_dict() and exported["truncated"] is False
    with CassetteReader(WIRES) as reader:
        records = list(reader.records())
    type_names = {cls: name for name, cls in RECORD_TYPES.items()}
    assert [(r["type"], r["session"], r["seq"]) for r in exported["records"]] == [
        (type_names[type(r)], r.session, r.seq) for r in records
    ]  # every record, in file order
    for got, decoded in zip(exported["records"], records, strict=True):
        if isinstance(decoded, EngineRecord):
            assert got["type"] == "engine" and decoded.request is not None
            assert got["request"]["input_ids"] == decoded.request["input_ids"]
            assert got["response"]["output_ids"] == decoded.response["output_ids"]
            assert (
                got["response"]["meta_info"]["output_token_logprobs"]
                == decoded.response["meta_info"]["output_token_logprobs"]
            )
        elif isinstance(decoded, AgentRecord):
            assert got["type"] == "agent" and got["body"] == json.loads(decoded.body)
            assert got["reply_events"] == decoded.reply_events and got["headers"] == decoded.headers
        elif isinstance(decoded, SamplesRecord):
            assert got["type"] == "samples" and got["samples"] == decoded.samples  # tokens, mask, logprobs
    assert {r["type"] for r in exported["records"]} == {"session", "engine", "agent", "samples", "drop"}


def test_export_filters_by_session_and_refuses_an_unknown_one(capsys: pytest.CaptureFixture[str]) -> None:
    name, other = sessions_of(WIRES)
    code, stdout, _ = run_cli(capsys, "export", WIRES, "--session", other)
    assert code == 0
    records = json.loads(stdout)["records"]
    assert records and {r["session"] for r in records} == {other}
    assert records[-1]["type"] == "drop"
    code, stdout, err = run_cli(capsys, "export", WIRES, "--session", "nope")
    assert code == 2 and stdout == "" and err.startswith("tito cassette export: ") and "no session 'nope'" in err
    assert name in err


def test_every_action_is_deterministic_and_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    name = sessions_of(WIRES)[0]
    loop = CORPUS / "tool_loop.tito"
    actions: dict[str, list[str | Path]] = {
        "export": ["export", WIRES],
        "cut": ["cut", WIRES, "--session", name],
        "merge": ["merge", loop, WIRES],
    }
    for action, argv in actions.items():
        outs = [tmp_path / f"{action}-{i}" for i in (1, 2)]
        for out in outs:
            assert run_cli(capsys, *argv, "--out", out)[0] == 0
        assert outs[0].read_bytes() == outs[1].read_bytes()
        before = outs[0].read_bytes()
        code, stdout, err = run_cli(capsys, *argv, "--out", outs[0])
        assert code == 2 and stdout == "" and err.startswith(f"tito cassette {action}: {outs[0]} exists")
        assert outs[0].read_bytes() == before
    assert run_cli(capsys, "export", WIRES)[1].encode() == (tmp_path / "export-1").read_bytes()
    assert run_cli(capsys, "export", WIRES)[1] == run_cli(capsys, "export", WIRES)[1]


# ---- hostile session names ----


def renamed(source: Path, out: Path, names: dict[str, str]) -> Path:
    """`source` with its sessions renamed: a cassette from a pull request can name them anything."""
    with CassetteReader(source) as reader, CassetteWriter(out, reader.header, header_redacted=True) as writer:
        for r in reader.records():
            r.session = names.get(r.session, r.session)
            writer.append_redacted(r)
    return out


def test_cut_and_merge_write_only_their_out_file_whatever_the_session_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Session names are data, never paths: `../`, an absolute path or a separator in one changes no file but
    `--out` (the tools open exactly that path, exclusively), here or anywhere the names point."""
    work = tmp_path / "work"
    work.mkdir()
    escape = tmp_path / "escaped"
    hostile = ["../escaped/chat", str(escape / "responses")]
    names = dict(zip(sessions_of(WIRES), hostile, strict=True))
    source = renamed(WIRES, work / "source.tito", names)
    other = renamed(WIRES, work / "other.tito", {s: f"../../{i}\\..\\x" for i, s in enumerate(sessions_of(WIRES))})
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))

    cut = run_cli(capsys, "cut", source, "--session", hostile[0], "--session", hostile[1], "--out", work / "cut.tito")
    merged = run_cli(capsys, "merge", source, other, "--out", work / "merged.tito")
    assert cut[0] == 0 and merged[0] == 0, (cut, merged)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert sorted(set(after) - set(before)) == [Path("work/cut.tito"), Path("work/merged.tito")]
    assert not escape.exists()
    assert sessions_of(work / "cut.tito") == hostile and len(sessions_of(work / "merged.tito")) == 4
    assert f"wrote {work / 'cut.tito'}: 2 session(s): {hostile[0]}, {hostile[1]}" in cut[1]
