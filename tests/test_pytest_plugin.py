"""The pytest plugin as a user meets it: `pytest` in a project with a `cassettes/` folder (the installed
`pytest11` entry point, real pytest processes): one item per session, `-k`, `-n 2`, goldens, fixtures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_helpers import ROOT
from tests.replay_support import Live, record, tool_loop, tool_loop_scenario
from trajectory.adapters.session import session_digest

SIDS = ("plugin-token-a-000001", "plugin-token-b-000002")
INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"


def pytest_run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=project,
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "pytest.ini").write_text(INI)
    (root / "cassettes").mkdir()

    async def drive(live: Live) -> None:
        for sid in SIDS:
            await tool_loop(live.conversation(sid))
            await live.finish(sid, 1.0)

    record(root / "cassettes" / "loop.tito", tool_loop_scenario(2), drive)
    return root


def test_sessions_are_items_that_replay_in_parallel_and_write_goldens_on_request(project: Path) -> None:
    names = [session_digest(s) for s in SIDS]
    listed = pytest_run(project, "--collect-only", "-q")
    assert [line for line in listed.stdout.splitlines() if "::" in line] == [
        f"cassettes/loop.tito::{n}" for n in names]

    missing = pytest_run(project, "-q")
    assert missing.returncode == 1 and "2 failed" in missing.stdout
    assert "golden missing: create it with `tito replay cassettes/loop.tito --update-goldens`" in missing.stdout

    written = pytest_run(project, "-q", "-n", "2", "--update-goldens")
    assert written.returncode == 0 and "2 passed" in written.stdout, written.stdout
    golden = (project / "cassettes" / "loop.golden").read_text()
    assert all(f"== session {n} ==" in golden for n in names)  # both workers' sections kept

    parallel = pytest_run(project, "-q", "-n", "2")
    assert parallel.returncode == 0 and "2 passed" in parallel.stdout, parallel.stdout
    one = pytest_run(project, "-q", "-k", names[1])
    assert one.returncode == 0 and "1 passed, 1 deselected" in one.stdout


def test_a_failing_session_shows_its_report_not_a_traceback(project: Path, tmp_path: Path) -> None:
    copy = tmp_path / "p"
    (copy / "cassettes").mkdir(parents=True)
    (copy / "pytest.ini").write_text(INI)
    (copy / "cassettes" / "loop.tito").write_bytes((project / "cassettes" / "loop.tito").read_bytes())
    assert pytest_run(copy, "-q", "--update-goldens").returncode == 0
    golden = copy / "cassettes" / "loop.golden"
    golden.write_text(re.sub(r"\(trained \d+,", "(trained 999,", golden.read_text(), count=1))
    (copy / "cassettes" / "gone.golden").write_text("stale\n")
    run = pytest_run(copy, "-q")
    assert run.returncode == 1 and "1 failed, 1 passed" in run.stdout, run.stdout
    assert "FAIL: golden changed" in run.stdout and "+  sample 0: reward 1" in run.stdout
    assert "-  sample 0: reward 1" in run.stdout and "(trained 999," in run.stdout
    assert "Traceback" not in run.stdout and "def runtest" not in run.stdout
    assert "cassettes/gone.golden has no cassette beside it" in run.stdout


USER_TEST = '''
import json
import urllib.request

SCENARIO = {"name": "user", "turns": [{"text": "Hello from the scripted engine."}]}


def post(url, body, sid):
    request = urllib.request.Request(url + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": "Bearer " + sid, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return json.loads(resp.read())


def test_my_adapter_flow(tito_fake_engine, tito_adapter):
    engine_url = tito_fake_engine(SCENARIO)
    adapter = tito_adapter(engine_url)
    reply = post(adapter.url, {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
                               "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}, "user-session-1")
    assert reply["content"][-1]["text"] == "Hello from the scripted engine."
    samples = adapter.finish("user-session-1", reward=1.0)
    assert len(samples) == 1 and samples[0]["reward"] == 1.0


def test_my_cassette_replays(tito_replay):
    result = tito_replay("cassettes/loop.tito")
    assert result.ok and [len(s.finishes[0].samples) for s in result.sessions] == [1, 1]


def test_vcr_mode(tito_vcr, request):
    assert tito_vcr.record_mode == request.config.getoption("record_mode", default=None) or "none"
'''


def test_fixtures_serve_users_own_tests(project: Path) -> None:
    (project / "test_mine.py").write_text(USER_TEST)
    try:
        run = pytest_run(project, "-q", "test_mine.py", "--record-mode", "once")
        assert run.returncode == 0 and "3 passed" in run.stdout, run.stdout + run.stderr
    finally:
        (project / "test_mine.py").unlink()


def test_the_committed_corpus_replays_with_two_workers() -> None:
    run = pytest_run(ROOT, "-q", "-n", "2", "cassettes")
    sessions = sum(1 for _ in (ROOT / "cassettes").glob("*.tito"))
    assert run.returncode == 0, run.stdout[-3000:]
    passed = int(re.search(r"(\d+) passed", run.stdout).group(1))
    assert passed >= sessions >= 6 and "failed" not in run.stdout
