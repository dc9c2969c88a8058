"""The simulator end to end: `tito record --agent claude-code` runs the real pinned CLI against the
scripted fake engine and produces a cassette with a complete tool loop, no GPU anywhere."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recorder.agent_install import ensure_installed
from recorder.agent_pins import CLAUDE_CODE
from replayer.reader import read_cassette
from tests.process_helpers import ROOT, free_port, tito

pytestmark = pytest.mark.skipif(shutil.which("npm") is None,
                                reason="npm is missing: the real agent CLI cannot be installed")


def test_record_claude_code_against_the_scripted_fake_engine(tmp_path: Path) -> None:
    ensure_installed(CLAUDE_CODE)  # the pinned CLI from npm (cached in .tools/npm after the first run)
    out = tmp_path / "claude.tito"
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    with tito("fake-engine", "--script", "fake_engine/examples/claude_tool_loop.yaml", "--port", str(port),
              ready=engine + "/health"):
        proc = subprocess.run(
            [sys.executable, "-m", "tito_cli", "record", "--engine", engine, "--listen", f"127.0.0.1:{free_port()}",
             "--out", str(out), "--agent", "claude-code", "--task", "List the files in this folder.",
             "--sessions", "1", "--reward", "1.0", "--quiet"],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "session rec-claude-code-0000: ok" in proc.stderr
    cassette = read_cassette(out)
    assert cassette.header.agent == {"client": "claude-code", "package": "@anthropic-ai/claude-code",
                                     "version": "2.1.330"}
    (log,) = cassette.sessions.values()
    turns = [a for a in log.agent if not a.side and a.status == 200]
    assert len(turns) == 2
    first_reply = "".join(turns[0].reply_events or [])
    assert '"type":"tool_use"' in first_reply.replace(" ", "") and "Bash" in first_reply
    second = json.loads(turns[1].body)
    results = [b for m in second["messages"] if m["role"] == "user" and isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert results, "the CLI ran the tool and sent its result back"
    assert "text_delta" in "".join(turns[1].reply_events or [])
    (sample,) = log.samples
    assert sample["reward"] == 1.0 and sum(sample["loss_mask"]) > 0
    generated = [e for e in log.engine if e.path.endswith("/generate")]
    assert len(generated) == 2
    assert sample["metadata"]["use_tool"] is True
