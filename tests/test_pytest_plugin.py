"""The pytest plugin as a user meets it: `pytest` in a project with a `cassettes/` folder (the installed
`pytest11` entry point, real pytest processes): one item per session, `-k`, `-n 2`, ids that paste back,
goldens (readable diffs, unused ones failing), fixtures, settings from flags, ini and `tito_config`, and
pytest-recording loaded in the same session."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_helpers import ROOT
from tests.replay_support import Live, record, tool_loop, tool_loop_scenario
from tito_rl.main import main as tito_main
from tito_rl.trajectory.adapters.session import session_digest

SIDS = ("plugin-token-a-000001", "plugin-token-b-000002")
INI = "[pytest]\nasyncio_default_fixture_loop_scope = function\n"


# hypothesis (a dev dependency of tito's, not of a user's project) adds ~0.9 s to every pytest process through its
# plugin: the runs here leave it out, as a user's project without hypothesis would.
NO_HYPOTHESIS = ("-p", "no:hypothesispytest")


def pytest_run(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k not in ("NO_COLOR", "FORCE_COLOR")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *NO_HYPOTHESIS, *args],
        cwd=project,
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=600,
    )


def copy_project(project: Path, to: Path) -> Path:
    (to / "cassettes").mkdir(parents=True)
    (to / "pytest.ini").write_text(INI)
    shutil.copy(project / "cassettes" / "loop.tito", to / "cassettes" / "loop.tito")
    return to


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


@pytest.mark.slow
def test_sessions_are_items_that_replay_in_parallel_and_write_goldens_on_request(project: Path) -> None:
    names = [session_digest(s) for s in SIDS]
    listed = pytest_run(project, "--collect-only", "-q")
    assert [line for line in listed.stdout.splitlines() if "::" in line] == [f"cassettes/loop.tito::{n}" for n in names]

    missing = pytest_run(project, "-q")
    assert missing.returncode == 1 and "2 failed" in missing.stdout
    assert "golden missing: create it with `tito replay cassettes/loop.tito --update-goldens`" in missing.stdout

    written = pytest_run(project, "-q", "-n", "2", "--update-goldens")
    assert written.returncode == 0 and "2 passed" in written.stdout, written.stdout
    golden = (project / "cassettes" / "loop.golden").read_text()
    assert all(f"== session {n} ==" in golden for n in names)  # both workers' sections kept

    parallel = pytest_run(project, "-q", "-n", "2")
    assert parallel.returncode == 0 and "2 passed" in parallel.stdout, parallel.stdout
    one = pytest_run(project, "-v", "-k", names[1])
    assert one.returncode == 0 and "1 passed, 1 deselected" in one.stdout
    (shown,) = [line.split()[0] for line in one.stdout.splitlines() if line.endswith("PASSED") or " PASSED " in line]
    assert shown == f"cassettes/loop.tito::{names[1]}"  # the id itself, not `cassettes/loop::tito::...`
    pasted = pytest_run(project, "-q", shown)  # pasted back as printed
    assert pasted.returncode == 0 and "1 passed" in pasted.stdout and "deselected" not in pasted.stdout


@pytest.mark.slow
def test_ids_of_sessions_with_odd_names_paste_back(tmp_path: Path) -> None:
    """Session names come from the cassette (untrusted): one holding `::` would read as two parts of an id; its id
    percent-encodes it (and `%`), so what `pytest -v` prints selects exactly that session, and no two collide."""
    from tests.cassette_helpers import header, play, session_traffic
    from tito_rl.cassette.writer import CassetteWriter
    from tito_rl.trajectory.tokens.tokenizer import fingerprint, load_tokenizer

    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "cassettes").mkdir()
    names = ("odd::name [1]", "odd%3A%3Aname [1]", "100% ok", "plain-name")
    writer = CassetteWriter(tmp_path / "cassettes" / "odd.tito", header(fingerprint()))
    for name in names:
        play(writer, session_traffic(load_tokenizer(), 2, session=name), session=name, source="path")
    writer.close()
    listed = pytest_run(tmp_path, "--collect-only", "-q")
    ids = [line for line in listed.stdout.splitlines() if line.startswith("cassettes/odd.tito::")]
    assert ids == [
        "cassettes/odd.tito::odd%3A%3Aname [1]",
        "cassettes/odd.tito::odd%253A%253Aname [1]",
        "cassettes/odd.tito::100%25 ok",
        "cassettes/odd.tito::plain-name",
    ], listed.stdout
    for shown in ids:
        pasted = pytest_run(tmp_path, "--collect-only", "-q", shown)
        assert pasted.returncode == 0 and [line for line in pasted.stdout.splitlines() if "::" in line] == [shown]


@pytest.mark.slow
def test_a_failing_session_shows_its_report_not_a_traceback(project: Path, tmp_path: Path) -> None:
    copy = copy_project(project, tmp_path / "p")
    assert tito_main(["replay", str(copy / "cassettes"), "--update-goldens"]) == 0  # as the plugin writes it (below)
    golden = copy / "cassettes" / "loop.golden"
    first, second = (session_digest(s) for s in SIDS)
    text = re.sub(r"\(trained \d+,", "(trained 999,", golden.read_text(), count=1)  # the first section's sample
    head, _, tail = text.partition(f"== session {second} ==\n")
    junk = "".join(f"stale line {i}\n" for i in range(100))  # a second section that shares nothing: a long diff
    golden.write_text(head + f"== session {second} ==\n" + junk)
    run = pytest_run(copy, "-q")
    assert run.returncode == 1 and "2 failed" in run.stdout, run.stdout
    assert "FAIL: golden changed" in run.stdout and "+  sample 0: reward 1" in run.stdout
    assert "-  sample 0: reward 1" in run.stdout and "(trained 999," in run.stdout
    assert re.search(r"\n +\?.*\(trained \[-999-\]\{\+\d+\+\}, masked", run.stdout)  # marks the change
    assert re.search(r"… \d+ more diff line\(s\) cut; -vv shows it whole", run.stdout)
    assert "-stale line 99" not in run.stdout and "\x1b[" not in run.stdout  # cut; no colour into a pipe
    assert "Traceback" not in run.stdout and "def runtest" not in run.stdout

    whole = pytest_run(copy, "-vv", "--color=yes")
    assert whole.returncode == 1 and "-stale line 99" in whole.stdout and "more diff line(s) cut" not in whole.stdout
    assert "\x1b[1m\x1b[7m999\x1b[0m" in whole.stdout  # the changed token highlighted in place, on a terminal
    assert f"\ncassettes/loop.tito::{first} " in whole.stdout  # -vv prints the id too


@pytest.mark.slow
def test_unused_goldens_fail_until_update_goldens_removes_them_also_with_two_workers(
    project: Path, tmp_path: Path
) -> None:
    copy = copy_project(project, tmp_path / "p")
    assert tito_main(["replay", str(copy / "cassettes"), "--update-goldens"]) == 0  # the plugin's bytes: see below
    golden = copy / "cassettes" / "loop.golden"
    written = golden.read_text()
    section = written[written.index("== session ") :].split("\n\n== session ")[0]
    stale = section.replace(section.split(" ==")[0], "== session sid-gone0000000000", 1)
    golden.write_text(written + "\n" + stale + "\n")  # a section for a session the cassette no longer has
    (copy / "cassettes" / "gone.golden").write_text(written)  # a golden whose cassette was deleted

    run = pytest_run(copy, "-q", "-n", "2")
    assert run.returncode == 1 and "2 failed, 2 passed" in run.stdout, run.stdout
    assert "FAILED cassettes/gone.golden::unused" in run.stdout
    assert "FAILED cassettes/loop.tito::sid-gone0000000000" in run.stdout
    assert "unused golden cassettes/gone.golden: its cassette gone.tito is gone" in run.stdout
    assert "unused golden section sid-gone0000000000 in cassettes/loop.golden" in run.stdout
    assert "--tito-allow-unused-goldens makes this a warning" in run.stdout

    allowed = pytest_run(copy, "-q", "--tito-allow-unused-goldens")  # the flag, as without workers
    assert allowed.returncode == 0 and "4 passed, 2 warnings" in allowed.stdout, allowed.stdout
    assert "UnusedGoldenWarning" in allowed.stdout and (copy / "cassettes" / "gone.golden").exists()

    updated = pytest_run(copy, "-q", "-n", "2", "--update-goldens")
    assert updated.returncode == 0 and "4 passed" in updated.stdout, updated.stdout
    assert not (copy / "cassettes" / "gone.golden").exists() and golden.read_text() == written

    clean = pytest_run(copy, "-q")
    assert clean.returncode == 0 and "2 passed" in clean.stdout and "failed" not in clean.stdout


USER_TEST = """
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
    assert tito_vcr.record_mode == "once"  # pytest-recording's --record-mode
"""


def test_fixtures_serve_users_own_tests(project: Path, tmp_path: Path) -> None:
    copy = copy_project(project, tmp_path / "p")  # its own goldens: not those another test (or worker) writes
    assert tito_main(["replay", str(copy / "cassettes"), "-q", "--update-goldens"]) == 0
    (copy / "test_mine.py").write_text(USER_TEST)
    run = pytest_run(copy, "-q", "test_mine.py", "--record-mode", "once")
    assert run.returncode == 0 and "3 passed" in run.stdout, run.stdout + run.stderr


PYPROJECT = """
[tool.pytest.ini_options]
asyncio_default_fixture_loop_scope = "function"
tito_cassette_dir = "recordings"
tito_record_mode = "new_episodes"
tito_allow_unused_goldens = true
"""

SETTINGS_TEST = """
import os

import pytest


def test_both_plugins_serve_this_session(tito_vcr, record_mode, vcr_config):
    assert record_mode == os.environ["WANT_RECORDING"]  # pytest-recording's own fixtures
    assert tito_vcr.record_mode == os.environ["WANT_VCR"]


def test_replay_as_recorded(tito_replay):
    result = tito_replay("recordings/drift_realign.tito")
    assert [s.golden for s in result.sessions] == ["ok"]


class TestCandidate:
    @pytest.fixture
    def tito_config(self):
        return {"record_mode": "none", "fork_threshold": 0, "engine_match": "order", "vcr": {"match_on": ["path"]}}

    def test_tito_config_sets_the_fixtures_options(self, tito_replay, tito_vcr):
        assert tito_vcr.record_mode == os.environ["WANT_CONFIG_VCR"] and tito_vcr.match_on == ["path"]
        (session,) = tito_replay("recordings/drift_realign.tito").sessions
        assert session.golden == "changed" and not session.differences  # the realign became a fork
        assert any(line.startswith("+  fork(threshold)") for line in session.golden_diff)
"""


@pytest.mark.slow
def test_pytest_recording_loads_beside_tito_and_settings_come_from_flags_tito_config_and_pyproject(
    tmp_path: Path,
) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    (tmp_path / "recordings").mkdir()
    for suffix in (".tito", ".golden"):
        shutil.copy(ROOT / "cassettes" / f"drift_realign{suffix}", tmp_path / "recordings" / f"drift_realign{suffix}")
    (tmp_path / "recordings" / "stale.golden").write_text("")  # unused, a warning by the ini setting
    (tmp_path / "test_settings.py").write_text(SETTINGS_TEST)

    ini = pytest_run(
        tmp_path, "-q", "-p", "recording", WANT_RECORDING="none", WANT_VCR="new_episodes", WANT_CONFIG_VCR="none"
    )  # -p: pytest-recording must be there, not silently absent
    assert ini.returncode == 0 and "5 passed, 1 warning" in ini.stdout, ini.stdout + ini.stderr
    assert "unused golden recordings/stale.golden" in ini.stdout  # the cassette folder from the ini file

    flags = pytest_run(
        tmp_path, "-q", "--record-mode", "once", WANT_RECORDING="once", WANT_VCR="once", WANT_CONFIG_VCR="once"
    )  # pytest-recording's flag beats tito_config and the ini file
    assert flags.returncode == 0 and "5 passed" in flags.stdout, flags.stdout + flags.stderr
    ours = pytest_run(
        tmp_path,
        "-q",
        "--record-mode",
        "once",
        "--tito-record-mode",
        "rewrite",
        "--tito-cassette-dir",
        "elsewhere",
        WANT_RECORDING="once",
        WANT_VCR="all",
        WANT_CONFIG_VCR="all",
    )  # tito's own flags first (rewrite: vcrpy's all, the old file ignored)
    assert ours.returncode == 0 and "3 passed" in ours.stdout and "warning" not in ours.stdout, ours.stdout

    bad = pytest_run(tmp_path, "-q", "-o", "tito_fork_threshold=many")
    assert bad.returncode == 4 and "ini tito_fork_threshold = 'many': expected int" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.slow
def test_the_committed_corpus_replays_with_two_workers(request: pytest.FixtureRequest) -> None:
    """`pytest -n 2 cassettes` in the repository passes. Where this run is itself that replay (`make test`: pytest
    with workers and no path, so the plugin collects the cassettes folder as a user's run does), its own items
    replay every session, each passing or failing on its own in this run's summary: then the test checks that
    the run holds every session of the corpus as an item, rather than replaying the whole corpus a second time."""
    from tito_rl.replayer.pytest_plugin.plugin import SessionItem, item_name, loaded

    workers = getattr(request.config, "workerinput", {}).get("workercount", 0)
    here = {item.nodeid for item in request.session.items if isinstance(item, SessionItem)}
    corpus = sorted((ROOT / "cassettes").rglob("*.tito"))
    wanted = {f"{path.relative_to(ROOT)}::{item_name(name)}" for path in corpus for name in loaded(path)[0].sessions}
    assert len(corpus) >= 6 and wanted
    if workers >= 2 and wanted <= here:
        return  # this run replays every session of the corpus, with workers: its items pass or fail on their own
    run = pytest_run(ROOT, "-q", "-n", "2", "cassettes")
    sessions = sum(1 for _ in (ROOT / "cassettes").glob("*.tito"))
    assert run.returncode == 0, run.stdout[-3000:]
    passed = int(re.search(r"(\d+) passed", run.stdout).group(1))
    assert passed >= sessions >= 6 and "failed" not in run.stdout
