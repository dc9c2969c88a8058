"""What-if replay: the committed recordings under a candidate change, judged by their goldens."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.process_helpers import ROOT
from tests.test_pytest_plugin import INI, pytest_run
from tito_rl.main import main
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

CASSETTE = ROOT / "cassettes" / "drift_realign.tito"


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The committed cassette and its golden, in a folder of their own."""
    for suffix in (".tito", ".golden"):
        shutil.copy(CASSETTE.with_suffix(suffix), tmp_path / CASSETTE.with_suffix(suffix).name)
    return tmp_path / CASSETTE.name


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """The tokenizer's template with one more newline after each tool response."""
    path = tmp_path / "candidate.jinja"
    original = load_tokenizer().chat_template
    path.write_text(original.replace("'\\n</tool_response>'", "'\\n</tool_response>\\n'"))
    assert path.read_text() != original
    return path


def test_order_matching_replays_a_changed_template_and_the_golden_diff_shows_the_samples(
    copy: Path, template: Path, capsys
) -> None:
    assert main(["replay", str(copy), "--chat-template", str(template)]) == 1
    out = capsys.readouterr().out
    assert "first difference: engine request differs: input_ids at token 257" in out  # strict by default

    assert main(["replay", str(copy), "--chat-template", str(template), "--engine-match", "order"]) == 1
    out = capsys.readouterr().out
    assert "warning: engine request differs: input_ids at token 257" in out and "(user)" in out
    assert "golden changed:" in out
    assert "-  sample 0: reward 1, 283 tokens" in out and "+  sample 0: reward 1, 284 tokens" in out

    assert main(["replay", str(copy), "--chat-template", str(template), "--update-goldens"]) == 0
    capsys.readouterr()
    assert main(["replay", str(copy), "--chat-template", str(template), "--engine-match", "order"]) == 0
    assert "1 session(s): 1 ok, 0 failed" in capsys.readouterr().out


def test_a_changed_fork_threshold_turns_the_realign_into_a_fork(copy: Path, capsys) -> None:
    assert main(["replay", str(copy), "--fork-threshold", "0", "--engine-match", "order"]) == 1
    out = capsys.readouterr().out
    assert "-  realign(divergence inside the response of turn 0) turn=1" in out
    assert "+  fork(threshold) turn=1" in out and "forks threshold:1" in out


def test_unusable_what_if_options_exit_2_with_one_line(copy: Path, tmp_path: Path, capsys) -> None:
    assert main(["replay", str(copy), "--chat-template", str(tmp_path / "missing.jinja")]) == 2
    assert capsys.readouterr().err.startswith("tito replay: --chat-template")
    assert main(["replay", str(copy), "--tool-parser", "no-such-parser"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown tool parser 'no-such-parser'" in err
    with pytest.raises(SystemExit):
        main(["replay", str(copy), "--engine-match", "fuzzy"])


def test_the_plugin_takes_the_same_what_if_options(copy: Path, template: Path) -> None:
    (copy.parent / "cassettes").mkdir()
    for f in copy.parent.glob("drift_realign.*"):
        f.rename(copy.parent / "cassettes" / f.name)
    (copy.parent / "pytest.ini").write_text(INI)
    run = pytest_run(copy.parent, "-q", "--tito-chat-template", str(template), "--tito-engine-match", "order")
    assert run.returncode == 1 and "1 failed" in run.stdout
    assert "warning: engine request differs" in run.stdout and "+  sample 0: reward 1, 284 tokens" in run.stdout
