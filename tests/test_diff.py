"""`tito diff`: two recordings of one scenario under different manager settings, and a cassette against a
candidate change, compared session by session down to the first divergent token; sessions of other names
paired (two one-session cassettes, `--pair`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.process_helpers import ROOT
from tests.replay_support import Live, record, tool_loop, tool_loop_scenario
from tito_rl.cassette.reader import summarize
from tito_rl.main import main
from tito_rl.replayer.inspection.diff import pairing
from tito_rl.trajectory.adapters.session import session_digest
from tito_rl.trajectory.manager import TrajectoryManager

SID = "diff-live-token-000001"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same drifting session recorded by a manager that realigns (A) and one that never does (B); with
    splicing off, or the drift would not reach the manager at all."""
    folder = tmp_path_factory.mktemp("diff")

    async def drive(live: Live) -> None:
        await tool_loop(live.conversation(SID))
        await live.finish(SID, 1.0)

    scenario = tool_loop_scenario(3, t0={"drift": True})
    record(folder / "a.tito", scenario, drive, splice=False)
    record(folder / "b.tito", scenario, drive, manager=TrajectoryManager(fork_threshold_tokens=0), splice=False)
    return folder / "a.tito", folder / "b.tito"


def test_diff_names_the_first_divergence_between_two_cassettes(pair, capsys) -> None:
    a, b = pair
    assert main(["diff", str(a), str(b)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"A: {a}", f"B: {b}"]
    assert lines[2].startswith(f"{session_digest(SID)}  samples 1 -> 2  forks none -> threshold:1")
    assert lines[2].endswith("differs")
    assert lines[3].startswith("    first divergence: sample 0: tokens differ (turn 0)")
    assert "in turn 0's response" in lines[4]
    assert lines[5].startswith("      A: …") and lines[6].startswith("      B: …")
    assert lines[-1] == "1 session(s): 1 differ"

    assert main(["diff", str(a), str(a)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "1 session(s): 0 differ"


def test_diff_compares_a_cassette_with_a_what_if_replay_of_it(pair, capsys) -> None:
    a, _ = pair
    assert main(["diff", str(a), "--fork-threshold", "0"]) == 1
    out = capsys.readouterr().out
    assert f"B: {a} under --fork-threshold 0" in out and "forks none -> threshold:1" in out
    assert main(["diff", str(a), "--fork-threshold", "1024"]) == 0  # the recording's own setting
    capsys.readouterr()


def test_diff_refuses_what_cannot_be_compared(pair, tmp_path: Path, capsys) -> None:
    a, b = pair
    assert main(["diff", str(a)]) == 2
    assert "give a second cassette, or a what-if option" in capsys.readouterr().err
    assert main(["diff", str(a), str(b), "--fork-threshold", "0"]) == 2
    capsys.readouterr()
    assert main(["diff", str(a), str(tmp_path / "missing.tito")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


PRESERVED = ROOT / "cassettes" / "claude_continue_preserved.tito"
DROPPED = ROOT / "cassettes" / "claude_continue_dropped.tito"


def test_two_one_session_cassettes_are_paired_whatever_their_session_names(capsys) -> None:
    """The reasoning-drop pair: one `--continue` session recorded twice, so two live session names."""
    (a,), (b,) = (summarize(path).sessions for path in (PRESERVED, DROPPED))
    assert a.session != b.session
    assert main(["diff", str(PRESERVED), str(DROPPED)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith(f"{a.session} = {b.session}  samples 1 -> 2  forks none -> earlier-response:1  ")
    assert lines[2].endswith("differs") and lines[3].startswith("    first divergence: sample 0: tokens differ")
    assert lines[-1] == "1 session(s): 1 differ" and "only in" not in "\n".join(lines)


def test_pair_names_the_sessions_to_compare(pair, capsys) -> None:
    a, _ = pair
    name = session_digest(SID)
    assert main(["diff", str(a), str(DROPPED), "--pair", f"{name}={summarize(DROPPED).sessions[0].session}"]) == 1
    assert capsys.readouterr().out.splitlines()[2].startswith(f"{name} = {summarize(DROPPED).sessions[0].session}  ")
    assert main(["diff", str(a), str(DROPPED), "--pair", f"{name}=sid-nosuch"]) == 2
    assert capsys.readouterr().err == f"tito diff: --pair: no session 'sid-nosuch' in B ({DROPPED})\n"
    assert main(["diff", str(a), str(DROPPED), "--pair", "no-equals-sign"]) == 2
    assert "expected A_SESSION=B_SESSION" in capsys.readouterr().err
    assert main(["diff", str(a), "--fork-threshold", "0", "--pair", "x=y"]) == 2
    assert "--pair pairs the sessions of two cassettes" in capsys.readouterr().err


def test_pairing_prefers_pairs_then_names_and_lists_the_rest() -> None:
    assert pairing(["x"], ["y"], {}) == [("x", "y")]  # one session each
    assert pairing(["x", "z"], ["y", "z"], {}) == [("x", None), ("z", "z"), (None, "y")]
    assert pairing(["x", "z"], ["y", "z"], {"x": "z"}) == [("x", "z"), ("z", None), (None, "y")]
