"""`tito replay -j N` (worker processes), `--shard I/N` and `--junit-xml` as a user runs them: the same bytes for
any N (output, exports, report, goldens written), shards that split the sessions once each by a stable digest,
and a replay that forgets each session once it is reported."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from tito_rl.main import main
from tito_rl.replayer.replay.batch import parse_shard, shard_of
from tito_rl.replayer.replay.cassette_replay import run_sync
from tito_rl.replayer.replay.harness import Harness
from tito_rl.replayer.replay.loading import load_cassette
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.replayer.replay.plan import plan_session

ROOT = Path(__file__).resolve().parent.parent
CASSETTES = ("mixed_concurrent", "openai_wires", "drift_realign", "tool_loop")


def tito_replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four committed cassettes (14 sessions) with their goldens; one golden line changed, so one session fails."""
    folder = tmp_path_factory.mktemp("corpus")
    for name in CASSETTES:
        for suffix in (".tito", ".golden"):
            shutil.copy(ROOT / "cassettes" / f"{name}{suffix}", folder / f"{name}{suffix}")
    golden = folder / "drift_realign.golden"
    golden.write_text(golden.read_text().replace("reward 1, 283 tokens", "reward 1, 280 tokens"))
    return folder


def run_with(corpus: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    out.mkdir()
    return tito_replay(
        str(corpus),
        "--export-samples",
        str(out / "replayed.jsonl"),
        "--export-live-samples",
        str(out / "live.jsonl"),
        "--junit-xml",
        str(out / "report.xml"),
        *args,
    )


def test_workers_give_the_same_bytes_as_one_process(corpus: Path, tmp_path: Path) -> None:
    one = run_with(corpus, tmp_path / "one", "-j", "1")
    two = run_with(corpus, tmp_path / "two", "--jobs", "2")
    assert one.returncode == two.returncode == 1  # the changed golden
    assert one.stdout == two.stdout and "14 session(s): 13 ok, 1 failed" in one.stdout
    assert one.stderr == two.stderr == ""
    for name in ("replayed.jsonl", "live.jsonl", "report.xml"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    lines = one.stdout.splitlines()
    assert lines.index(str(corpus / "drift_realign.tito")) < lines.index(str(corpus / "mixed_concurrent.tito"))

    report = ET.parse(tmp_path / "one" / "report.xml").getroot()
    assert report.get("tests") == "14" and report.get("failures") == "1"
    cases = report.findall("./testsuite/testcase")
    assert [c.get("classname") for c in cases][:2] == [
        str(corpus / "drift_realign.tito"),
        str(corpus / "mixed_concurrent.tito"),
    ]
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 1 and failed[0].get("classname").endswith("drift_realign.tito")
    failure = failed[0].find("failure")
    assert failure is not None and failure.text is not None
    assert "FAIL: golden changed" in failure.get("message", "") and "-  sample 0: reward 1, 280 tokens" in failure.text


def test_shards_replay_every_session_exactly_once(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["replay", str(corpus)])
    everything = capsys.readouterr().out.splitlines()
    sessions = [line.split()[0] for line in everything if line.startswith("  sid-")]
    assert len(sessions) == 14
    seen: list[str] = []
    for i in (1, 2, 3):
        main(["replay", str(corpus), "--shard", f"{i}/3"])
        shard = capsys.readouterr().out.splitlines()
        assert all(line in everything for line in shard[:-1])  # each line as in the full run, in its order
        cassette = ""
        for line in shard[:-1]:
            if line.endswith(".tito"):
                cassette = line
            elif line.startswith("  sid-"):
                assert shard_of(cassette, line.split()[0], 3) == i - 1
                seen.append(line.split()[0])
    assert sorted(seen) == sorted(sessions)  # together all of them, none twice


def test_the_shard_of_a_session_is_stable_and_bad_shards_are_refused(corpus: Path) -> None:
    assert shard_of("/ci/a/cassettes/tool_loop.tito", "sid-6c2a3be4bc9dd66a", 4) == shard_of(
        "tool_loop.tito", "sid-6c2a3be4bc9dd66a", 4
    )  # the folder plays no part
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b", "-1/2"):
        with pytest.raises(ValueError, match="--shard must be I/N"):
            parse_shard(bad)
    run = tito_replay(str(corpus), "--shard", "3/2")
    assert run.returncode == 2 and run.stdout == "" and run.stderr.startswith("tito replay: --shard must be I/N")


def test_goldens_written_by_workers_equal_the_committed_ones(tmp_path: Path) -> None:
    for name in CASSETTES:
        shutil.copy(ROOT / "cassettes" / f"{name}.tito", tmp_path / f"{name}.tito")
    run = tito_replay(str(tmp_path), "-j", "2", "--update-goldens")
    assert run.returncode == 0, run.stdout + run.stderr
    for name in CASSETTES:
        assert (tmp_path / f"{name}.golden").read_bytes() == (ROOT / "cassettes" / f"{name}.golden").read_bytes()


def test_a_replayed_session_is_forgotten_once_reported() -> None:
    path = ROOT / "cassettes" / "openai_wires.tito"
    cassette, tokenizer = load_cassette(path)

    async def replay_both() -> Harness:
        async with Harness(cassette, str(path), tokenizer, ReplayOptions()) as harness:
            for name in cassette.sessions:
                result = await harness.replay_session(plan_session(cassette.sessions[name]))
                assert result.ok and name in harness.plans and harness.tap.exchanges and harness.transport.legs
                harness.forget(name)
                assert not (
                    harness.plans
                    or harness.results
                    or harness.manager.captured
                    or harness.manager.sessions()
                    or harness.tap.exchanges
                    or harness.tap.finished
                    or harness.transport.legs
                    or harness.adapter.sessions
                )
            return harness

    run_sync(replay_both())
