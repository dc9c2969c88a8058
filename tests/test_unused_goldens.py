"""A golden nobody checks is lost coverage: `tito replay DIR` fails on a golden whose cassette is gone and on
a golden section for a session its cassette no longer has, until `--update-goldens` deletes or trims them;
`--allow-unused-goldens` makes them warnings. (The pytest side: tests/test_pytest_plugin.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.process_helpers import ROOT
from tito_rl.main import main
from tito_rl.replayer.goldens import files as goldens

CASSETTE = ROOT / "cassettes" / "drift_realign.tito"
STALE = "sid-0000000000000000"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """The committed cassette and its golden, plus a stale section in that golden and an orphan golden."""
    for suffix in (".tito", ".golden"):
        shutil.copy(CASSETTE.with_suffix(suffix), tmp_path / CASSETTE.with_suffix(suffix).name)
    golden = tmp_path / "drift_realign.golden"
    text = golden.read_text()
    golden.write_text(text + f"\n== session {STALE} ==\nstats: turns 1\n")
    (tmp_path / "deleted.golden").write_text(text)
    return tmp_path


def test_replaying_a_folder_fails_on_unused_goldens_until_update_goldens_removes_them(folder: Path, capsys) -> None:
    before = (CASSETTE.with_suffix(".golden")).read_text()
    assert main(["replay", str(folder)]) == 1
    out = capsys.readouterr().out
    assert (
        f"FAIL: unused golden section {STALE} in {folder / 'drift_realign.golden'}: drift_realign.tito has no "
        "such session (--update-goldens removes it; --allow-unused-goldens makes this a warning)" in out
    )
    assert f"FAIL: unused golden {folder / 'deleted.golden'}: its cassette deleted.tito is gone" in out
    assert out.splitlines()[-1] == "1 session(s): 1 ok, 0 failed; 2 unused golden(s)"

    assert main(["replay", str(folder), "--allow-unused-goldens"]) == 0
    out = capsys.readouterr().out
    assert out.count("warning: unused golden") == 2 and out.splitlines()[-1] == "1 session(s): 1 ok, 0 failed"

    assert main(["replay", str(folder / "drift_realign.tito")]) == 1  # the cassette's own golden is its business
    out = capsys.readouterr().out
    assert f"FAIL: unused golden section {STALE}" in out
    assert f"note: {folder / 'deleted.golden'} has no cassette beside it" in out  # the folder's is not

    assert main(["replay", str(folder), "--update-goldens"]) == 0
    out = capsys.readouterr().out
    assert f"removed unused golden {folder / 'deleted.golden'}" in out and "removed unused golden section" in out
    assert not (folder / "deleted.golden").exists()
    assert (folder / "drift_realign.golden").read_text() == before  # trimmed back to the committed golden

    assert main(["replay", str(folder)]) == 0
    assert "unused" not in capsys.readouterr().out


def test_removing_an_unused_golden_twice_is_harmless(folder: Path) -> None:
    golden = folder / "drift_realign.golden"
    section = goldens.Unused(golden, STALE)
    assert goldens.unused_sections(golden, ["sid-19f0295d317854b9"]) == [STALE]
    assert section.remove() is True and section.remove() is False
    assert goldens.unused_sections(golden, ["sid-19f0295d317854b9"]) == []
    assert golden.read_text() == CASSETTE.with_suffix(".golden").read_text()
    whole = goldens.Unused(folder / "deleted.golden")
    assert whole.remove() is True and whole.remove() is False
