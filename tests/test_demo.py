"""`make demo` (`tito demo`): the committed real Claude Code cassette replayed through the adapter app and the
manager with no engine, its verification, the tree and decisions, the samples, and an HTML page written
outside the checkout; `--synthetic` is the manager-only demo; a difference exits 1, unusable input 2."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.process_helpers import ROOT


def tito_demo(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}  # the default page folder is the system's temp folder
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", "demo", *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600
    )


def test_the_demo_replays_the_claude_cassette_and_says_what_it_found(tmp_path: Path) -> None:
    done = tito_demo(tmp=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    out = done.stdout
    lines = out.splitlines()
    assert lines[0] == (
        "tito demo: claude_tool_loop.tito, a real claude-code 2.1.330 session recorded once, replayed with no engine"
    )
    assert "cassette   cassettes/claude_tool_loop.tito" in lines
    assert "   sid-2b09a728f0a7517e: all 7 exchange(s) match the recording; the golden matches" in lines
    assert "   sid-2b09a728f0a7517e, finish 1 (reward 1): 7 turn(s) on 1 chain(s) -> 1 sample(s)" in lines
    golden = (ROOT / "cassettes" / "claude_tool_loop.golden").read_text(encoding="utf-8").splitlines()
    tree = golden[golden.index("tree:") + 1 : golden.index("decisions:")]
    assert [line.strip() for line in tree] == [line.strip() for line in lines if re.match(r" {5}n\d+ ", line)]
    assert "     none needed: every turn's prompt extended the one before it, so there was no fork, no" in lines
    assert "     sample 0: 12197 tokens, prompt 11676, trained 420, masked 101, turns 0,1,2,3,4,5,6, leaf n16" in lines
    page = Path(next(line for line in lines if line.startswith("4. See it: ")).removeprefix("4. See it: "))
    assert page == tmp_path / "tito-demo" / "claude_tool_loop.html" and not page.is_relative_to(ROOT)
    html = page.read_text(encoding="utf-8")
    assert "<h2>session sid-2b09a728f0a7517e</h2>" in html and html.count('class="tok trained" data-i=') == 420
    assert max(len(line) for line in lines) <= 120


def test_a_fork_is_shown_as_the_decision_it_is(tmp_path: Path) -> None:
    done = tito_demo("cassettes/claude_continue_dropped.tito", "--html-dir", str(tmp_path / "pages"), tmp=tmp_path)
    assert done.returncode == 0, done.stderr
    decisions = done.stdout.split("   decisions:\n", 1)[1].splitlines()
    # turn 2 cannot splice onto turn 1 (its reasoning is gone from the render), and forks there
    assert decisions[:2] == [
        "     unspliced(turn 1's prompt no longer renders as a prefix of this one (earlier history rendered "
        "otherwise)) turn=2",
        "     fork(earlier-response) turn=2 at=11659 leaf=10",
    ]
    assert (tmp_path / "pages" / "claude_continue_dropped.html").is_file()


def test_a_difference_exits_1_and_unusable_input_2(tmp_path: Path) -> None:
    for suffix in (".tito", ".golden"):
        shutil.copy(ROOT / "cassettes" / f"claude_tool_loop{suffix}", tmp_path / f"changed{suffix}")
    golden = tmp_path / "changed.golden"
    golden.write_text(golden.read_text(encoding="utf-8").replace("trained 420", "trained 421", 1), encoding="utf-8")
    changed = tito_demo(str(tmp_path / "changed.tito"), tmp=tmp_path)
    assert changed.returncode == 1 and "; the golden CHANGED" in changed.stdout, changed.stdout
    missing = tito_demo(str(tmp_path / "nope.tito"), tmp=tmp_path)
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == f"tito demo: {tmp_path / 'nope.tito'}: no such cassette\n"


def test_the_synthetic_demo_is_still_there(tmp_path: Path) -> None:
    done = tito_demo("--synthetic", "--reward", "0.5", tmp=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith("== message tree\n") and "== decisions" in done.stdout
    assert not (tmp_path / "tito-demo").exists()
