"""`make corpus` (recorder/corpus.py): dispatch on each scenario's client, a failed scenario reported while the
others go on, and its committed cassette left untouched. Real processes (fake engine, tito record) on
loopback; the scripted client only, so no CLI is needed (tests/test_simulate.py covers a real one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_simulate import FAILING
from tito_rl.recorder import corpus

ROOT = Path(__file__).resolve().parent.parent


def test_client_of_dispatches_on_client_agent(tmp_path: Path) -> None:
    paths = {}
    for name, client in (("s", {"sessions": []}), ("c", {"agent": "gemini-cli", "task": "t"}), ("bare", None)):
        data: dict[str, Any] = {"turns": [{"text": "x"}]} | ({"client": client} if client is not None else {})
        paths[name] = tmp_path / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(data))
    assert corpus.client_of(paths["s"]) == "scripted" and corpus.client_of(paths["c"]) == "gemini-cli"
    with pytest.raises(corpus.CorpusError, match=r"^bare: no client: section \(scripted or a pinned CLI\)$"):
        corpus.client_of(paths["bare"])


def test_install_clis_names_what_can_not_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"turns": [{"text": "x"}], "client": {"agent": "codex", "task": "t", "oops": 1}}))
    (why,) = corpus.install_clis([bad]).values()
    assert list(corpus.install_clis([bad])) == ["bad"] and why.startswith("client: unknown key 'oops'; allowed: ")


@pytest.mark.slow
def test_a_failed_scenario_is_reported_and_leaves_its_cassette_the_others_are_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    good = scenarios / "good.yaml"
    good.write_text((ROOT / "cassettes" / "scenarios" / "length_truncated.yaml").read_text())
    failing = scenarios / "failing.yaml"
    failing.write_text(yaml.safe_dump(FAILING | {"name": "failing"}))
    bare = scenarios / "bare.yaml"
    bare.write_text(yaml.safe_dump({"turns": [{"text": "x"}]}))
    (tmp_path / "failing.tito").write_bytes(b"committed")

    done, failed = corpus.record_all([bare, failing, good], jobs=2, out_dir=tmp_path)

    out = capsys.readouterr().out.splitlines()
    assert [r.name for r in done] == ["good"] and (tmp_path / "good.tito").stat().st_size > 1000
    assert sorted(failed) == ["bare", "failing"] and "tito record exited with 1" in failed["failing"]
    assert (tmp_path / "failing.tito").read_bytes() == b"committed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failing.tito", "good.tito", "scenarios"]
    assert "bare: FAILED (bare: no client: section (scripted or a pinned CLI))" in out
    assert "failing [scripted]: FAILED (failing: tito record exited with 1); the committed cassette is untouched" in out
    (good_line,) = [line for line in out if line.startswith("good [scripted]: ")]
    assert good_line.endswith("s)") and " bytes, " in good_line
    assert len(out) == 3  # one line per scenario


def test_main_refuses_unknown_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert corpus.main(["no_such_scenario"]) == 1
    assert capsys.readouterr().err.startswith("make corpus: no such scenario: ")
    assert corpus.main(["--scripted", "no_such_scenario"]) == 1
    assert capsys.readouterr().err.startswith("make cassettes: no such scenario: ")


def test_a_trial_run_needs_an_existing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert corpus.main(["tool_loop", "--out-dir", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err == f"make corpus: folder {tmp_path / 'missing'} does not exist\n"
    assert not (tmp_path / "missing").exists()
