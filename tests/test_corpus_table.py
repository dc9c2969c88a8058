"""The README corpus table (replayer/corpus_table.py): its parts on small inputs, the README block rewritten
only between its markers, a clear one-line error without them, and the committed README's table equal to
what the committed cassettes give (regenerate with `make corpus-table`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tito_rl.replayer import corpus_table as ct

ROOT = Path(__file__).resolve().parent.parent


def test_clients_from_the_header() -> None:
    assert ct.clients_of({"client": "claude-code", "version": "2.1.330", "package": "x"}) == "claude-code 2.1.330"
    assert ct.clients_of({"client": "scripted", "version": "0.1.0"}) == "scripted"
    assert (
        ct.clients_of({"client": "mixed", "agents": {"codex": "0.169.0", "claude-code": "2.1.330"}})
        == "claude-code 2.1.330, codex 0.169.0"
    )
    assert ct.clients_of(None) == "?"


def test_pins_prefers_description_then_the_first_sentence_of_the_comment(tmp_path: Path) -> None:
    described = tmp_path / "a.yaml"
    described.write_text("# Long comment. More.\nname: a\ndescription: 'Pins a | b'\nturns: []\n")
    commented = tmp_path / "b.yaml"
    commented.write_text(
        "# A turn that runs out of tokens: the reply\n# stops at length. The client goes on.\nname: b\n"
    )
    assert ct.pins_of(described) == "Pins a \\| b"
    assert ct.pins_of(commented) == "A turn that runs out of tokens: the reply stops at length."
    assert ct.pins_of(tmp_path / "none.yaml") == "(no scenario file)"
    long = tmp_path / "c.yaml"
    long.write_text("# " + "word " * 60 + "\n")
    assert len(ct.pins_of(long)) == ct.PINS_WIDTH and ct.pins_of(long).endswith("…")


def test_the_pair_table_never_invents_numbers() -> None:
    (line,) = ct.pair_table({})
    assert "claude_continue_preserved.tito, cassettes/claude_continue_dropped.tito not recorded yet" in line
    preserved = ct.Figures(
        "claude_continue_preserved", "claude-code 2.1.330", "x", samples=1, sample_tokens=1000, trained=200
    )
    dropped = ct.Figures(
        "claude_continue_dropped",
        "claude-code 2.1.330",
        "x",
        samples=2,
        sample_tokens=1900,
        trained=200,
        forks=Counter({"earlier-response": 1}),
    )
    lines = ct.pair_table({f.name: f for f in (preserved, dropped)})
    assert lines[-2:] == [
        "| earlier reasoning preserved | `claude_continue_preserved` | 1 | none | 1000 | 200 | 20.0% |",
        "| dropped (the Qwen3 template's rendering) | `claude_continue_dropped` | 2 | earlier-response 1 | 1900 | "
        "200 | 10.5% |",
    ]
    (only,) = ct.pair_table({"claude_continue_dropped": dropped})
    assert "cassettes/claude_continue_preserved.tito not recorded yet" in only and "dropped.tito" not in only


def test_readme_block_is_replaced_between_the_markers_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(ct, "block", lambda cassettes: ["| new |", "", "pair"])
    readme = tmp_path / "README.md"
    readme.write_text(f"# T\nintro\n{ct.START}\nold table\n{ct.END}\nafter\n")
    assert ct.main(["--readme", str(readme), "--check"]) == 1
    assert "README.md's table differs from the cassettes; run `make corpus-table`" in capsys.readouterr().err
    assert ct.main(["--readme", str(readme)]) == 0
    assert readme.read_text() == f"# T\nintro\n{ct.START}\n| new |\n\npair\n{ct.END}\nafter\n"
    assert ct.main(["--readme", str(readme), "--check"]) == 0
    assert capsys.readouterr().out.endswith("corpus-table: README.md is up to date\n")


@pytest.mark.parametrize("text", ["no markers\n", f"{ct.END}\n{ct.START}\n", f"{ct.START}\n{ct.START}\n{ct.END}\n"])
def test_missing_or_misplaced_markers_are_one_clear_line(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert ct.main(["--readme", str(readme)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"corpus-table: {readme}: needs one line {ct.START} and, after it, one line {ct.END} around the table\n"
    )
    assert readme.read_text() == text


def test_figures_come_from_a_replay() -> None:
    """The committed reasoning_drop_fork cassette: its golden says one earlier-response fork and two samples."""
    fig = ct.figures(ROOT / "cassettes" / "reasoning_drop_fork.tito")
    golden = (ROOT / "cassettes" / "reasoning_drop_fork.golden").read_text()
    assert fig.clients == "scripted" and fig.clean and fig.sessions == 1
    assert fig.samples == 2 and fig.forks == Counter({"earlier-response": 1}) and fig.turns == 4
    assert f"turns {fig.turns}, side turns 0, leaves 1, samples {fig.samples}, forks {fig.fork_text}," in golden
    assert f"trained {fig.trained}" in golden and 0 < fig.trained < fig.sample_tokens


def test_the_coverage_column_shows_the_tokens_a_realign_loses() -> None:
    """The same drift fault: realigned with splicing off (the drifted reply's 43 tokens lost), then spliced."""
    realigned = ct.figures(ROOT / "cassettes" / "drift_realign.tito")
    golden = (ROOT / "cassettes" / "drift_realign.golden").read_text()
    assert (realigned.trained, realigned.emitted, realigned.coverage) == (21, 64, "0.328")
    assert "trained 21, emitted 64, coverage 0.328" in golden
    spliced = ct.figures(ROOT / "cassettes" / "drift_spliced.tito")
    assert spliced.coverage == "1.0" and spliced.trained == spliced.emitted > 0
    assert (
        "| `drift_realign` |" in "\n".join(ct.corpus_table([realigned]))
        and "| 0.328 |" in ct.corpus_table([realigned])[-1]
    )


def test_the_committed_readme_table_is_up_to_date() -> None:
    """Replays every committed cassette: a cassette added or re-recorded without `make corpus-table` fails."""
    readme = ROOT / "README.md"
    _, old, _ = ct.split_readme(readme.read_text(encoding="utf-8"), readme)
    assert old == "\n".join(ct.block(ROOT / "cassettes")), "README's corpus table is stale: run `make corpus-table`"


def test_first_sentence_skips_code_and_ellipses() -> None:
    assert (
        ct.first_sentence("Run `claude -p ... --continue`, twice. Then more.")
        == "Run `claude -p ... --continue`, twice."
    )
    assert ct.first_sentence("It waits... then goes. Next.") == "It waits... then goes."
    assert ct.first_sentence("Claude Code 2.1.330 runs. Next.") == "Claude Code 2.1.330 runs."
    assert ct.first_sentence("no end") == "no end"


def test_the_coverage_column_is_the_lowest_session_s() -> None:
    """A loss in one session of ten is not averaged away, and a token trained twice shows in any session."""

    def figure(*sessions: tuple[int, int]) -> str:
        return ct.Figures(
            "c",
            "scripted",
            "-",
            trained=sum(t for t, _ in sessions),
            emitted=sum(e for _, e in sessions),
            per_session=list(sessions),
        ).coverage

    assert figure((10, 10), (10, 10)) == "1.0"
    assert figure(*[(100, 100)] * 9, (50, 100)) == "0.500"  # averaged over the ten it would read 0.950
    assert figure((10, 10), (12, 10), (5, 10)) == "1.200 (trained more than emitted)"
    assert figure((0, 0)) == "-"
