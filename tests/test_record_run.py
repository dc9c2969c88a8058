"""Recording a training run (issue 40, point 1): whole sessions sampled from their id, a folder of cassettes
rotated every N sessions or SIZE bytes (each closed and readable alone), and a cap on the bytes written past which
nothing more is written while the proxy keeps serving."""

from __future__ import annotations

import gc
import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.cassette_helpers import final_sample, header, play, session_traffic
from tito_rl.cassette.reader import CassetteReader, read_cassette
from tito_rl.cassette.rotation import CappedTap, RotatingTap, Rotation
from tito_rl.cassette.writer_process import Layout, WriterProcessTap
from tito_rl.recorder.record_options import parse_size
from tito_rl.recorder.taps.sampling import sampled
from tito_rl.trajectory.adapters.session import session_digest


@pytest.fixture(scope="module")
def traffic(qwen_tokenizer: Any) -> list[tuple[str, Any]]:
    return session_traffic(qwen_tokenizer, turns=3)


def sid(i: int) -> str:
    return f"run-session-token-{i:05d}-3c9e81f0a2b7"


def test_sampling_is_by_session_id_reproducible_nested_and_near_the_rate() -> None:
    ids = [sid(i) for i in range(20_000)]
    tenth = {s for s in ids if sampled(s, 0.1)}
    assert tenth == {s for s in ids if sampled(s, 0.1)}  # the same on a rerun: nothing but the id decides
    assert tenth < {s for s in ids if sampled(s, 0.3)}  # a higher rate records a superset
    assert 1_800 < len(tenth) < 2_200  # a fixed set of ids, so this count is fixed: 10% give or take hashing
    assert all(sampled(s, 1.0) for s in ids[:100])
    assert sampled("abc", 0.5) == (int.from_bytes(hashlib.sha256(b"abc").digest()[:8], "big") < 0.5 * 2**64)


def test_sizes_read_as_bytes_and_bad_ones_are_refused() -> None:
    assert [parse_size(t) for t in ("4096", "512K", "2G", "1.5M", "3MiB", "1gb")] == [
        4096,
        512 << 10,
        2 << 30,
        3 << 19,
        3 << 20,
        1 << 30,
    ]
    for bad in ("", "G", "-1M", "0", "ten", "nan"):
        with pytest.raises(ValueError):
            parse_size(bad)


def _session(tap: Any, traffic: list[tuple[str, Any]], s: str, finish: bool = True) -> None:
    tap.agent_request(s, "bearer", {"Authorization": f"Bearer {s}"})
    play(tap, traffic, session=s)
    if finish:
        tap.session_finished(s, "bearer", 1.0, [final_sample(traffic)])


def _parts(folder: Path) -> list[Path]:
    return sorted(folder.glob("part-*.tito"))


def _closed_sessions(path: Path) -> set[str]:
    """The sessions of a cassette that reads alone: closed with its index, nothing cut short."""
    with CassetteReader(path) as reader:
        index = reader.stored_index()
    assert index is not None, f"{path.name} has no index: not closed"
    cassette = read_cassette(path)
    assert not cassette.truncated
    return set(cassette.sessions)


def test_rotation_every_n_sessions_keeps_each_session_whole_in_one_closed_cassette(
    tmp_path: Path, traffic: list[tuple[str, Any]]
) -> None:
    tap = RotatingTap(tmp_path / "run", header(), Rotation(sessions=2))
    a, b, c = sid(1), sid(2), sid(3)
    tap.agent_request(a, "bearer", {})
    play(tap, traffic[:2], session=a)  # a starts
    _session(tap, traffic, b)  # b runs whole meanwhile: part 1 holds a and b
    _session(tap, traffic, c)  # the third session opens part 2; part 1 stays open for a
    assert len(_parts(tmp_path / "run")) == 2
    with CassetteReader(_parts(tmp_path / "run")[0]) as reader:
        assert reader.stored_index() is None  # a is still live there
    play(tap, traffic[2:], session=a)
    tap.session_finished(a, "bearer", 1.0, [final_sample(traffic)])  # its last session ended: part 1 is closed
    assert _closed_sessions(_parts(tmp_path / "run")[0]) == {session_digest(a), session_digest(b)}
    tap.close()
    first, second = _parts(tmp_path / "run")
    assert _closed_sessions(second) == {session_digest(c)}
    log = read_cassette(first).sessions[session_digest(a)]
    assert len(log.agent) == sum(k == "agent" for k, _ in traffic) and len(log.finishes) == 1
    assert tap.bytes_written == first.stat().st_size + second.stat().st_size


def test_rotation_by_bytes_and_a_straggler_goes_on_in_the_newest_cassette(
    tmp_path: Path, traffic: list[tuple[str, Any]]
) -> None:
    tap = RotatingTap(tmp_path, header(), Rotation(bytes=1), keep_sealed=1)  # a session a cassette, one kept open
    straggler = sid(0)
    tap.agent_request(straggler, "bearer", {})
    play(tap, traffic[:2], session=straggler)
    for i in range(1, 4):
        _session(tap, traffic, sid(i))
    play(tap, traffic[2:], session=straggler)  # two rotations later: its first cassette was closed
    tap.session_finished(straggler, "bearer", 1.0, [final_sample(traffic)])
    tap.close()
    parts = _parts(tmp_path)
    held = [_closed_sessions(p) for p in parts]
    assert held[:4] == [{session_digest(sid(i))} for i in range(4)]
    assert held[4] == {session_digest(straggler)}  # the rest of it, a session of its own there
    assert len(read_cassette(parts[4]).sessions[session_digest(straggler)].finishes) == 1


def test_a_second_recording_into_the_folder_numbers_on(tmp_path: Path, traffic: list[tuple[str, Any]]) -> None:
    for i in range(2):
        tap = RotatingTap(tmp_path, header(), Rotation(sessions=1))
        _session(tap, traffic, sid(i))
        tap.close()
    assert [p.name for p in _parts(tmp_path)] == ["part-000001.tito", "part-000002.tito"]


def test_the_cap_closes_every_cassette_and_drops_what_follows(tmp_path: Path, traffic: list[tuple[str, Any]]) -> None:
    probe = RotatingTap(tmp_path / "probe", header(), Rotation(sessions=1))
    _session(probe, traffic, sid(0))
    one_session = probe.bytes_written  # open, without its index
    probe.close()
    heard: list[int] = []
    tap = CappedTap(RotatingTap(tmp_path / "run", header(), Rotation(sessions=1)), 2 * one_session + 1, heard.append)
    for i in range(6):
        _session(tap, traffic, sid(i))
    tap.close()
    assert len(heard) == 1 and tap.capped and heard[0] == tap.bytes_written
    parts = _parts(tmp_path / "run")
    assert sum(p.stat().st_size for p in parts) == tap.bytes_written
    sessions = set().union(*(_closed_sessions(p) for p in parts))  # each closed, with its index
    assert session_digest(sid(0)) in sessions and session_digest(sid(1)) in sessions
    assert not sessions & {session_digest(sid(i)) for i in range(4, 6)}  # nothing after the cap
    record_bound = max(len(b) for b in (p.read_bytes() for p in parts))  # the crossing record is written whole
    assert tap.bytes_written <= 2 * one_session + 1 + record_bound


def test_the_writer_process_rotates_caps_and_tells_the_proxy(
    tmp_path: Path, traffic: list[tuple[str, Any]], capfd: pytest.CaptureFixture[str]
) -> None:
    events: list[dict[str, Any]] = []
    layout = Layout(rotation=Rotation(sessions=1), max_bytes=1)
    tap = WriterProcessTap(tmp_path / "run", header(), layout=layout, on_event=events.append)
    _session(tap, traffic, sid(0))  # crosses the 1-byte cap: written whole, then nothing more
    tap.close()
    assert [e["event"] for e in events if e["event"] != "bytes"] == ["capped", "closed"]
    assert tap.capped and tap.bytes_written == sum(p.stat().st_size for p in _parts(tmp_path / "run"))
    assert _closed_sessions(_parts(tmp_path / "run")[0]) == {session_digest(sid(0))}
    err = capfd.readouterr().err
    assert "--max-bytes 1 reached" in err and "the proxy keeps serving" in err


# --- tito record, in-process, around tito's adapter and the scripted fake engine ------------------------------

RUN_SESSIONS = 12


def run_scenario(sessions: int = RUN_SESSIONS) -> dict[str, Any]:
    """A run's sessions in small: two or three turns each on the three wires, every sixth one dropped."""
    engine = [
        {
            "match": {"prompt_contains": f"Variant T={t}."},
            "turns": [
                {
                    "reasoning": f"Step {k}.",
                    "text": f"Reading part {k}.",
                    "tool_calls": [
                        {"name": "shell", "arguments": {"command": f"cat part_{k}.py", "description": "Read"}}
                    ],
                }
                for k in range(t - 1)
            ]
            + [{"text": "Done."}],
        }
        for t in (2, 3)
    ]
    clients = [
        {
            "id": sid(i),
            "wire": ("anthropic", "chat", "responses")[i % 3],
            "stream": i % 2 == 0,
            "system": f"You are a coding agent. Variant T={2 + i % 2}.",
            "tools": ["Bash", "Read"],
            "results": {"Bash": {"lines": 3}},
            "steps": [
                {"prompt": f"Task {i}: read the parts.", "max_turns": 5},
                {"drop": True} if i % 6 == 5 else {"finish": 1.0},
            ],
        }
        for i in range(sessions)
    ]
    return {
        "name": "run_small",
        "after_last": "error",
        "sessions": engine,
        "client": {"concurrency": 4, "sessions": clients},
    }


async def record_run(
    tmp_path: Path, *flags: str, scenario_spec: dict[str, Any] | None = None, seen: list[Any] | None = None
) -> tuple[int, Path]:
    """`tito record --agent scripted` in this process; `seen` gets the parsed arguments (their metrics)."""
    import asyncio
    import json

    from tests.cassette_helpers import serve
    from tests.process_helpers import free_port
    from tito_rl import main as tito_cli
    from tito_rl.fake_engine.app import EngineOptions
    from tito_rl.fake_engine.app import create_app as create_engine
    from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, load_scenario
    from tito_rl.recorder import cli as record_cli
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    scenario = tmp_path / "run_small.json"
    scenario.write_text(json.dumps(scenario_spec or run_scenario()))
    out = tmp_path / "run"
    tokenizer = load_tokenizer()
    frozen = gc.get_freeze_count()
    try:
        async with serve(
            create_engine(ScriptedPolicy(load_scenario(scenario), tokenizer), EngineOptions(tokenizer=tokenizer))
        ) as engine_url:
            argv = [
                "record",
                "--engine",
                engine_url,
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--out",
                str(out),
                "--agent",
                "scripted",
                "--scenario",
                str(scenario),
                "--quiet",
                *flags,
            ]
            args = tito_cli.build_parser(argv).parse_args(argv)
            assert record_cli.check(args) is None
            if seen is not None:
                seen.append(args)
            rc = await asyncio.wait_for(record_cli.serve_until_signal(args), 600)
    finally:
        if not frozen:  # the proxy froze its start-up objects, as a server process does: not the test process's
            gc.unfreeze()
    return rc, out


def tito_cmd(*argv: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from tito_rl.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_a_sampled_rotated_run_is_a_folder_every_reader_takes(tmp_path: Path) -> None:
    import asyncio
    import json

    rc, run = asyncio.run(record_run(tmp_path, "--sample-rate", "0.5", "--rotate-sessions", "2"))
    assert rc == 0
    chosen = {session_digest(sid(i)) for i in range(RUN_SESSIONS) if sampled(sid(i), 0.5)}
    assert 0 < len(chosen) < RUN_SESSIONS  # the case this test is about: some sessions left out
    parts = _parts(run)
    held = [_closed_sessions(p) for p in parts]  # each closed, with its index, readable alone
    assert set().union(*held) == chosen and sum(map(len, held)) == len(chosen)  # whole sessions, each once
    assert all(1 <= len(h) <= 2 for h in held) and len(parts) == (len(chosen) + 1) // 2

    code, out, err = tito_cmd("cassette", "info", str(run), "--json")
    info = json.loads(out)
    assert code == 0 and info["sessions"] == len(chosen) and info["truncated"] == []
    assert [c["path"] for c in info["cassettes"]] == [p.name for p in parts]
    code, out, _ = tito_cmd("cassette", "info", str(run))
    assert code == 0 and f"{len(chosen)} session(s) in {len(parts)} cassette(s)" in out and parts[0].name in out

    code, out, err = tito_cmd("replay", str(run), "--update-goldens")
    assert code == 0, out + err
    code, out, err = tito_cmd("replay", str(run))
    assert code == 0, out + err
    code, out, err = tito_cmd("audit", str(run), "--json")
    report = json.loads(out)
    assert code == 0, err
    assert sorted(c["path"] for c in report["cassettes"]) == sorted(map(str, parts))
    assert sum(c["sessions"] for c in report["cassettes"]) == len(chosen)

    one = sorted(chosen)[0]
    code, out, err = tito_cmd("inspect", str(run), "--session", one)
    assert code == 0 and out.count("== session ") == 1 and one in out, err
    code, out, err = tito_cmd("inspect", str(run), "--html", str(tmp_path / "run.html"))
    assert code == 0 and f"({len(chosen)} session(s))" in out, err
    code, out, err = tito_cmd("inspect", str(run), "--session", "sid-none")
    assert code == 2 and err.startswith("tito inspect: ") and len(err.splitlines()) == 1


async def test_past_the_cap_the_proxy_serves_on_and_records_nothing_more(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    rc, run = await record_run(tmp_path, "--rotate-sessions", "1", "--max-bytes", "40K")
    err = capfd.readouterr().err
    assert rc == 0 and "FAILED" not in err  # every scripted session was served to its end
    assert "--max-bytes 40960 reached" in err and "the proxy keeps serving" in err
    parts = _parts(run)
    sessions = set().union(*(_closed_sessions(p) for p in parts))
    assert 0 < len(sessions) < RUN_SESSIONS
    assert sum(p.stat().st_size for p in parts) < 40_960 + max(p.stat().st_size for p in parts)


def test_a_session_not_sampled_never_reaches_the_writer(traffic: list[tuple[str, Any]]) -> None:
    from tito_rl.recorder.taps.sampling import SamplingTap

    class Calls:
        def __init__(self) -> None:
            self.sessions: list[str] = []

        def __getattr__(self, name: str) -> Any:
            return lambda session, *rest: self.sessions.append(session)

    inner = Calls()
    tap = SamplingTap(inner, 0.5)
    kept, left = (next(s for s in map(sid, range(100)) if sampled(s, 0.5) == want) for want in (True, False))
    for s in (kept, left):
        _session(tap, traffic, s)
        tap.session_dropped(s, "bearer")
    assert set(inner.sessions) == {kept} and len(inner.sessions) == 2 + len(traffic) + 1


def test_bad_run_options_are_one_clear_line(tmp_path: Path) -> None:
    from tito_rl import main as tito_cli
    from tito_rl.recorder import cli as record_cli

    def problem(*flags: str, out: str = "run") -> str | None:
        argv = ["record", "--engine", "http://127.0.0.1:1", "--out", str(tmp_path / out), *flags]
        return record_cli.check(tito_cli.build_parser(argv).parse_args(argv))

    assert problem("--sample-rate", "0") == (
        "--sample-rate 0.0: expected a fraction of the sessions, above 0 and at most 1"
    )
    assert problem("--sample-rate", "1.5") is not None
    assert problem("--rotate-bytes", "lots") == "--rotate-bytes lots: expected a size such as 4096, 512M or 2G"
    assert problem("--max-bytes=-3G") == "--max-bytes -3G: expected a size such as 4096, 512M or 2G"
    assert problem("--rotate-sessions", "0") == "--rotate-sessions must be >= 1"
    assert problem("--rotate-sessions", "5", "--per-session") == (
        "--per-session and --rotate-sessions/--rotate-bytes each choose the cassettes: give one"
    )
    assert problem("--metrics", "nowhere") == "--metrics nowhere: expected HOST:PORT"
    (tmp_path / "file.tito").write_bytes(b"")
    not_a_folder = f"--out {tmp_path / 'file.tito'} exists and is not a folder"
    assert problem("--rotate-sessions", "5", out="file.tito") == not_a_folder
    assert (
        problem("--rotate-sessions", "5", "--max-bytes", "2G", "--sample-rate", "0.25", "--metrics", "127.0.0.1:9400")
        is None
    )


def test_the_cap_holds_for_one_cassette_per_session_too(tmp_path: Path, traffic: list[tuple[str, Any]]) -> None:
    from tito_rl.cassette.writer import PerSessionTap

    heard: list[int] = []
    tap = CappedTap(PerSessionTap(tmp_path, header()), 1, heard.append)
    for i in range(3):
        _session(tap, traffic, sid(i))
    tap.close()
    (only,) = sorted(tmp_path.glob("*.tito"))  # the first session crossed the cap: the others never started
    assert _closed_sessions(only) == {session_digest(sid(0))} and heard == [only.stat().st_size]
