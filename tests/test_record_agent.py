"""The simulator end to end: `tito record --agent claude-code` runs the real pinned CLI against the
scripted fake engine and produces a cassette with a complete tool loop, no GPU anywhere."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_helpers import ROOT, free_port, tito
from tito_rl.cassette.reader import read_cassette
from tito_rl.recorder.agents.install import ensure_installed
from tito_rl.recorder.agents.pins import CLAUDE_CODE
from tito_rl.replayer.comparison.differences import samples_difference

pytestmark = pytest.mark.skipif(
    shutil.which("npm") is None, reason="npm is missing: the real agent CLI cannot be installed"
)


@pytest.mark.slow
def test_record_claude_code_against_the_scripted_fake_engine(tmp_path: Path) -> None:
    ensure_installed(CLAUDE_CODE)  # the pinned CLI from npm (cached in .tools/npm after the first run)
    out = tmp_path / "claude.tito"
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    with tito(
        "fake-engine",
        "--script",
        "fake_engine/examples/claude_tool_loop.yaml",
        "--port",
        str(port),
        ready=engine + "/health",
    ):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tito_rl",
                "record",
                "--engine",
                engine,
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--out",
                str(out),
                "--agent",
                "claude-code",
                "--task",
                "List the files in this folder.",
                "--sessions",
                "1",
                "--reward",
                "1.0",
                "--quiet",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "session rec-claude-code-0000: ok" in proc.stderr
    cassette = read_cassette(out)
    assert cassette.header.agent == {
        "client": "claude-code",
        "package": "@anthropic-ai/claude-code",
        "version": "2.1.330",
    }
    (log,) = cassette.sessions.values()
    turns = [a for a in log.agent if not a.side and a.status == 200]
    assert len(turns) == 2
    first_reply = "".join(turns[0].reply_events or [])
    assert '"type":"tool_use"' in first_reply.replace(" ", "") and "Bash" in first_reply
    second = json.loads(turns[1].body)
    results = [
        b
        for m in second["messages"]
        if m["role"] == "user" and isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert results, "the CLI ran the tool and sent its result back"
    assert "text_delta" in "".join(turns[1].reply_events or [])
    (sample,) = log.samples
    assert sample["reward"] == 1.0 and sum(sample["loss_mask"]) > 0
    generated = [e for e in log.engine if e.path.endswith("/generate")]
    assert len(generated) == 2
    assert sample["metadata"]["use_tool"] is True


GEMINI_LOOP = {
    "name": "gemini_tool_loop",
    "turns": [
        {
            "reasoning": "I should leave a proof that the tool ran.",
            "text": "I will write a proof file.",
            "tool_calls": [
                {
                    "name": "shell",
                    "arguments": {"command": "echo tito-was-here > proof.txt", "description": "Write a proof file"},
                }
            ],
        },
        {
            "reasoning": "Now read it back.",
            "text": "Reading it back.",
            "tool_calls": [{"name": "shell", "arguments": {"command": "cat proof.txt", "description": "Read it"}}],
        },
        {"reasoning": "The file holds the text.", "text": "proof.txt says tito-was-here."},
    ],
}


@pytest.mark.slow
def test_record_gemini_cli_through_the_adapter_and_replay_it_clean(tmp_path: Path) -> None:
    """Gemini CLI's own tool loop (two shell calls it really runs, then an answer) on the Gemini API wire:
    its echoes (call ids, thought signatures, <untrusted_context> output) stay on one chain, and the cassette
    replays clean."""
    from tito_rl.recorder.agents.pins import GEMINI_CLI
    from tito_rl.replayer.replay.cassette_replay import replay_cassette

    ensure_installed(GEMINI_CLI)
    scenario = tmp_path / "gemini_loop.json"
    scenario.write_text(json.dumps(GEMINI_LOOP))
    out = tmp_path / "gemini.tito"
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    with tito("fake-engine", "--script", str(scenario), "--listen", f"127.0.0.1:{port}", ready=engine + "/health"):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "tito_rl",
                "record",
                "--engine",
                engine,
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--out",
                str(out),
                "--agent",
                "gemini-cli",
                "--task",
                "Leave a proof file, then read it back.",
                "--sessions",
                "1",
                "--reward",
                "1.0",
                "--quiet",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "session rec-gemini-cli-0000: ok" in proc.stderr
    cassette = read_cassette(out)
    assert cassette.header.agent == {"client": "gemini-cli", "package": "@google/gemini-cli", "version": "0.61.0"}
    (log,) = cassette.sessions.values()
    assert log.source == "x-goog-api-key"
    assert [(a.path, a.query, a.status, a.side) for a in log.agent] == [
        ("/v1beta/models/tito-policy:streamGenerateContent", "alt=sse", 200, False)
    ] * 3
    assert all(a.headers["x-goog-api-key"] == "<redacted>" for a in log.agent)
    first_reply = "".join(log.agent[0].reply_events or [])
    assert '"thought":true' in first_reply and '"functionCall":{"name":"run_shell_command"' in first_reply
    second, third = (json.loads(a.body)["contents"] for a in log.agent[1:])
    echoed = [p for p in second[-2]["parts"] if "functionCall" in p]
    assert echoed[0]["functionCall"]["id"] and echoed[0]["thoughtSignature"]  # added by the CLI on echo
    outputs = [
        p["functionResponse"]["response"]["output"] for c in third for p in c["parts"] if "functionResponse" in p
    ]
    assert len(outputs) == 2 and all(o.startswith("<untrusted_context>") for o in outputs)
    assert "tito-was-here" in outputs[1]  # the CLI really ran both commands: cat read what echo wrote
    (sample,) = log.samples
    assert sample["reward"] == 1.0 and sample["metadata"]["use_tool"] is True
    (session,) = replay_cassette(out).sessions
    assert session.ok and not session.differences, session.differences
    assert session.counts()["turns"] == 3 and session.counts()["forks"] == {} and session.counts()["realigns"] == 0
    # compared as replay compares them: a fresh recording's samples may hold kept sets as arrays (Gemini CLI asks top_p)
    live = session.finishes[0].live
    assert live is not None and samples_difference(live, session.finishes[0].samples, str) is None
