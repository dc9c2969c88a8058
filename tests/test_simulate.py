"""`tito simulate` (recorder/simulate.py): what it refuses before starting anything, that a failed recording
leaves no cassette behind, and one real run with the pinned Claude Code whose cassette and golden replay clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.process_helpers import ROOT
from tito_rl.recorder.simulate import SimulateError, simulate

BARE_ENGINE = {"name": "bare", "turns": [{"text": "done"}]}


def scenario(tmp_path: Path, data: dict, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data | {"name": name}))
    return path


def test_refuses_an_existing_cassette_without_replace(tmp_path: Path) -> None:
    out = tmp_path / "kept.tito"
    out.write_bytes(b"committed")
    with pytest.raises(SimulateError, match=r"kept\.tito exists: pass --replace to re-record it"):
        simulate(scenario(tmp_path, BARE_ENGINE, "bare"), out, agent="codex", task="t")
    assert out.read_bytes() == b"committed"


def test_refuses_a_missing_folder(tmp_path: Path) -> None:
    out = tmp_path / "no" / "such" / "x.tito"
    with pytest.raises(SimulateError, match=r"folder .*/no/such does not exist"):
        simulate(scenario(tmp_path, BARE_ENGINE, "bare"), out, agent="codex", task="t")


def test_a_scenario_without_client_needs_agent_and_task(tmp_path: Path) -> None:
    path = scenario(tmp_path, BARE_ENGINE, "bare")
    for agent, task in ((None, None), ("codex", None), (None, "list the files")):
        with pytest.raises(SimulateError, match=r"bare\.yaml: .*no CLI `client:` section, so --agent and --task"):
            simulate(path, tmp_path / "x.tito", agent=agent, task=task)
    assert not (tmp_path / "x.tito").exists()


def test_the_command_line_says_why_in_one_line_and_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "kept.tito"
    out.write_bytes(b"committed")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tito_rl",
            "simulate",
            "--scenario",
            str(scenario(tmp_path, BARE_ENGINE, "bare")),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr == f"tito simulate: {out} exists: pass --replace to re-record it\n"


# A scripted-client scenario whose recording fails: the engine scripts one tool-calling turn and answers the
# client's second request (the tool result) with a 400, so tito record exits 1.
FAILING = {
    "after_last": "error",
    "turns": [{"text": "Listing.", "tool_calls": [{"name": "Bash", "arguments": {"command": "ls"}}]}],
    "client": {
        "sessions": [
            {
                "id": "simulate-fails-0000",
                "wire": "anthropic",
                "stream": False,
                "system": "You are a coding agent.",
                "tools": ["Bash"],
                "results": {"Bash": "a.txt"},
                "steps": [{"prompt": "List the files."}, {"finish": 1.0}],
            }
        ]
    },
}


@pytest.mark.slow
def test_a_failed_recording_leaves_no_cassette(tmp_path: Path) -> None:
    path = scenario(tmp_path, FAILING, "fails")
    out = tmp_path / "fails.tito"
    with pytest.raises(SimulateError, match=r"fails\.yaml: tito record exited with 1") as info:
        simulate(path, out)
    assert "has no turn 1" in str(info.value)  # the engine's reason reaches the message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fails.yaml"]  # no cassette, partial or golden
    out.write_bytes(b"committed")  # with --replace, the old cassette stays until a new one is complete
    with pytest.raises(SimulateError, match="tito record exited with 1"):
        simulate(path, out, replace=True)
    assert out.read_bytes() == b"committed" and sorted(p.name for p in tmp_path.iterdir()) == [
        "fails.tito",
        "fails.yaml",
    ]


@pytest.mark.slow
def test_claude_code_records_a_cassette_and_golden_that_replay_clean(tmp_path: Path) -> None:
    from tito_rl.cassette.reader import read_cassette
    from tito_rl.recorder.agents.install import is_installed
    from tito_rl.recorder.agents.pins import CLAUDE_CODE

    if not is_installed(CLAUDE_CODE):
        pytest.skip(
            f"{CLAUDE_CODE.spec} is not installed in .tools/npm: `tito simulate` installs it with npm "
            "(needs the registry), or run `python -c 'from tito_rl.recorder.agents.install import "
            "ensure_installed; from tito_rl.recorder.agents.pins import CLAUDE_CODE; "
            "ensure_installed(CLAUDE_CODE)'`"
        )
    # The example engine script under a name of its own: session ids (and so sandbox paths) derive from it,
    # and another recording of the example may run at the same time.
    data = yaml.safe_load((ROOT / "fake_engine" / "examples" / "claude_tool_loop.yaml").read_text())
    data["client"] = {
        "agent": "claude-code",
        "task": "List the files in this folder.",
        "timeout_s": 120,
        "record_args": ["--reward", "1"],
    }
    out = tmp_path / "sim_claude.tito"
    done = simulate(scenario(tmp_path, data, "test_simulate_claude"), out, timeout_s=300)
    assert done.cassette == out and out.is_file() and out.with_suffix(".golden").is_file()
    assert "session test-simulate-claude-claude-code-0000 run 0: ok" in done.log
    assert not out.with_name(out.name + ".partial").exists()
    cassette = read_cassette(out)
    assert cassette.header.agent == {
        "client": "claude-code",
        "package": "@anthropic-ai/claude-code",
        "version": "2.1.330",
        "scenario": "test_simulate_claude",
    }
    golden = out.with_suffix(".golden").read_text()
    assert "stats: turns 2, side turns 0, leaves 1, samples 1, forks none" in golden
    assert 'calls "Bash({"command":"ls"' in golden
    replay = subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr


def test_a_session_already_recording_is_one_clear_error(tmp_path: Path) -> None:
    """Sandbox paths are fixed per session (the CLIs put them into the prompt), so a second recording of the
    same scenario at once, or a killed one's leftover, meets an existing folder: one line, not a traceback."""
    import tempfile

    from tito_rl.recorder.agents.install import is_installed
    from tito_rl.recorder.agents.pins import CODEX
    from tito_rl.recorder.agents.sandbox import LocalSandbox, SandboxError
    from tito_rl.trajectory.adapters.session import session_digest

    with (
        LocalSandbox(parent=tmp_path, name="taken"),
        pytest.raises(
            SandboxError,
            match=r"taken exists: a "
            r"recording of the same session is running",
        ),
    ):
        LocalSandbox(parent=tmp_path, name="taken")
    if not is_installed(CODEX):
        pytest.skip(f"{CODEX.spec} is not installed in .tools/npm: `tito simulate --agent codex ...` installs it")
    busy = Path(tempfile.gettempdir()) / session_digest("test-simulate-busy-codex-0000")
    busy.mkdir()
    try:
        path = scenario(tmp_path, BARE_ENGINE | {"client": {"agent": "codex", "task": "t"}}, "test_simulate_busy")
        with pytest.raises(SimulateError) as info:
            simulate(path, tmp_path / "busy.tito")
    finally:
        busy.rmdir()
    assert f"tito record: sandbox {busy} exists: a recording of the same session is running" in str(info.value)
    assert "Traceback" not in str(info.value) and not (tmp_path / "busy.tito").exists()
