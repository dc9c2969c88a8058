"""The pytest plugin's audit, as a team pins it: `--tito-audit` (or ini `tito_audit`) fails a session item whose
recording fires a pinned rule not allowed beside its cassette, and the `tito_audit` fixture audits a recording in
the team's own tests. Real pytest processes in a project holding two committed cassettes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
USER_TEST = """
def test_pinned(tito_audit):
    audit = tito_audit("cassettes/tool_loop.tito", expect="coverage>=1.0, trained-twice, logprob-mismatch")
    assert audit.coverage == 1.0


def test_fails_with_what_broke(tito_audit):
    tito_audit("cassettes/drift_realign.tito", expect="coverage>=0.9")
"""


def pytest_run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "cassettes").mkdir()
    (tmp_path / "pytest.ini").write_text(INI)
    for name in ("tool_loop", "drift_realign"):
        for suffix in (".tito", ".golden"):
            shutil.copy(ROOT / "cassettes" / f"{name}{suffix}", tmp_path / "cassettes" / f"{name}{suffix}")
    return tmp_path


@pytest.mark.slow
def test_session_items_fail_on_pinned_rules_unless_allowed(project: Path) -> None:
    plain = pytest_run(project, "-q", "cassettes")
    assert plain.returncode == 0, plain.stdout[-2000:]
    pinned = pytest_run(project, "-q", "cassettes", "--tito-audit", "coverage>=1.0, trained-twice")
    assert pinned.returncode == 1 and "1 failed, 1 passed" in pinned.stdout, pinned.stdout[-2000:]
    assert (
        "tito audit: cassettes/drift_realign.tito session sid-19f0295d317854b9: coverage 21/64 = 0.328, "
        "below 1.0" in pinned.stdout
    )
    assert "Traceback" not in pinned.stdout
    # the same pin from the ini file; then the cassette's allowlist says the realign is expected
    (project / "pytest.ini").write_text(INI + "tito_audit = coverage>=1.0, trained-twice\n")
    assert pytest_run(project, "-q", "cassettes").returncode == 1
    shutil.copy(ROOT / "cassettes" / "drift_realign.audit.toml", project / "cassettes")
    allowed = pytest_run(project, "-q", "cassettes")
    assert allowed.returncode == 0, allowed.stdout[-2000:]


def test_a_bad_pin_fails_in_one_line(project: Path) -> None:
    run = pytest_run(project, "-q", "cassettes/tool_loop.tito", "--tito-audit", "no-such-rule")
    assert run.returncode == 1 and "tito audit: unknown rule(s) no-such-rule" in run.stdout


def test_the_fixture_audits_a_teams_own_recordings(project: Path) -> None:
    (project / "test_mine.py").write_text(USER_TEST)
    run = pytest_run(project, "-q", "test_mine.py")
    assert "1 failed, 1 passed" in run.stdout, run.stdout[-2000:]
    assert "tito audit of cassettes/drift_realign.tito: coverage 21/64 = 0.328, below 0.9" in run.stdout
