"""Record around a gateway of another design and replay through it (`tests/gateway_double.py`: the whole history
re-rendered with `apply_chat_template` every turn, a regex for tool calls, uuid4 ids and wall-clock times in its
replies, a sample per chain with a turn count in its metadata), with no slime: as a driver tito starts, and as
a process tito did not start (`http://`), with and without a routing key. Replay's options work through it as
through tito's adapter: goldens, `--session`, `--export-samples`, `--engine-match order`, `-j`; so does the
pytest plugin's `--tito-target` (flag and ini key).

`tito record` and the gateway run as real processes over loopback; `tito replay` runs in this process.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.gateway_double import VOLATILE
from tests.process_helpers import ROOT, free_port, stop, tito, wait_http
from tests.test_pytest_plugin import copy_project, project, pytest_run  # noqa: F401 - `project` is a fixture
from tests.test_targets_record_replay import TOOL_LOOP, engine, record, replay  # noqa: F401 - `engine` too
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import read_cassette
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

# One worker runs this module (tests/xdist_groups.py): its module-scoped fixture is made once.
pytestmark = pytest.mark.xdist_group("gateway_double")

DRIVER = "tests.gateway_double:create"
TWO_SESSIONS = """\
name: two_sessions
after_last: error
sessions:
  - match: {prompt_contains: "the apples"}
    turns:
      - {reasoning: I count them., text: Counting., tool_calls: [{name: shell, arguments: {command: ls apples}}]}
      - {text: There are three apples.}
  - match: {prompt_contains: "the pears"}
    turns:
      - {reasoning: I look., text: Looking., tool_calls: [{name: shell, arguments: {command: ls pears}}]}
      - {reasoning: Two files., text: There are two pears.}
client:
  concurrency: 1
  sessions:
    - {id: double-apples-0001, wire: chat, stream: true, system: You count fruit., tools: [Bash],
       results: {Bash: "a1\\na2\\na3"}, steps: [{prompt: "How many are the apples?"}, {finish: 1.0}]}
    - {id: double-pears-00002, wire: anthropic, stream: false, system: You count fruit., tools: [Bash],
       results: {Bash: "p1\\np2"}, steps: [{prompt: "How many are the pears?"}, {finish: 1.0}]}
"""


@contextmanager
def gateway(engine_url: str, *extra: str) -> Iterator[str]:
    """The double as a process of its own (as a team runs its gateway), its engine at `engine_url`."""
    import subprocess

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.gateway_double", "--engine", engine_url, "--listen", f"127.0.0.1:{port}", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def volatile_flags() -> list[str]:
    return [flag for path in VOLATILE for flag in ("--volatile", path)]


@pytest.fixture(scope="module")
def around_driver(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("double") / "tool_loop.tito"
    record(out, engine, TOOL_LOOP, "--target", DRIVER)
    assert replay(str(out), "--target", DRIVER, "--update-goldens").returncode == 0
    return out


def test_a_driver_of_another_design_is_recorded_and_replayed_twice_byte_identical(around_driver: Path) -> None:
    cassette = read_cassette(around_driver)
    target = cassette.header.target
    assert (target["kind"], target["ref"], target["name"]) == ("driver", DRIVER, "gateway-double")
    assert tuple(target["volatile"]) == VOLATILE
    (log,) = cassette.sessions.values()
    assert len(log.agent) == 7 and [s["metadata"] for s in log.samples] == [{"turns": 7}]
    golden = around_driver.with_suffix(".golden").read_text()
    assert f"stats (target {DRIVER}):" in golden and "masked 187), turns 7\n" in golden  # its metadata, as it is
    first, second = (
        replay(str(around_driver), "--target", DRIVER),
        replay(str(around_driver), "--target", DRIVER, "--jobs", "2"),
    )
    assert first.returncode == second.returncode == 0, first.stdout + first.stderr
    assert first.stdout == second.stdout and "1 session(s): 1 ok" in first.stdout
    # its replies carry fresh uuid4 ids and times on every run: the volatile paths, and nothing else, differ
    starts = [
        json.loads(e.split("data: ", 1)[1]) for a in log.agent for e in a.reply_events or [] if "message_start" in e
    ]
    assert len(starts) == 7 and len({s["message"]["id"] for s in starts}) == 7  # random, one per reply


def test_session_export_and_engine_match_order_through_a_foreign_target(around_driver: Path, tmp_path: Path) -> None:
    cassette = read_cassette(around_driver)
    (name,) = cassette.sessions
    exported = tmp_path / "samples.jsonl"
    run = replay(str(around_driver), "--target", DRIVER, "--session", name, "--export-samples", str(exported))
    assert run.returncode == 0, run.stdout + run.stderr
    (row,) = [json.loads(line) for line in exported.read_text().splitlines()]
    (live,) = cassette.sessions[name].samples
    assert row["session"] == name and row["tokens"] == live["tokens"] and row["loss_mask"] == live["loss_mask"]
    assert replay(str(around_driver), "--target", DRIVER, "--session", "sid-not-there").returncode == 2
    # order: each exchange is served its recorded generation even where its prompt changed (here it did not)
    run = replay(str(around_driver), "--target", DRIVER, "--engine-match", "order")
    assert run.returncode == 0 and "1 ok" in run.stdout, run.stdout
    # tito's own recording through the double, as the conformance table does: prompts differ, order serves them
    run = replay(str(ROOT / "cassettes" / "tool_loop.tito"), "--target", DRIVER, "--engine-match", "order")
    assert "replayed through" in run.stdout and "goldens not checked" in run.stdout, run.stdout
    assert "Traceback" not in run.stdout + run.stderr


def test_a_gateway_tito_did_not_start_is_recorded_and_replayed_over_http(engine: str, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "http.tito"
    listen = free_port()
    with gateway(f"http://127.0.0.1:{listen}") as url:
        record(out, engine, TOOL_LOOP, "--target", url, "--engine-listen", f"127.0.0.1:{listen}", *volatile_flags())
    cassette = read_cassette(out)
    target = cassette.header.target
    assert target["kind"] == "http" and tuple(target["volatile"]) == VOLATILE
    (log,) = cassette.sessions.values()
    assert len(log.agent) == 7 and len(log.samples) == 1  # its own session API gave the samples
    assert all(e.headers.get("X-SMG-Routing-Key") == log.name for e in log.engine)
    # replay: the team starts its gateway again, its engine at replay's --engine-listen; new port, new ids
    listen = free_port()
    with gateway(f"http://127.0.0.1:{listen}") as url:
        args = (str(out), "--target", url, "--engine-listen", f"127.0.0.1:{listen}")
        assert replay(*args, "--update-goldens").returncode == 0
        first, second = replay(*args), replay(*args)
    assert first.returncode == second.returncode == 0, first.stdout + first.stderr
    assert first.stdout == second.stdout and "1 ok" in first.stdout


def test_a_gateway_with_no_routing_key_gets_its_calls_attributed_by_prompt(tmp_path: Path) -> None:
    """Two sessions, no routing key (`--routing-header none`): each /generate goes to the session whose prompt it
    continues, or (a first turn) to the oldest request in flight; each session's engine calls are its own. One
    session at a time: concurrent first turns are told apart only by the order the gateway forwards them, which
    a loaded machine may swap (docs/recording.md says so; a routing key never depends on it)."""
    scenario = tmp_path / "two.yaml"
    scenario.write_text(TWO_SESSIONS)
    out, listen, port = tmp_path / "nokey.tito", free_port(), free_port()
    with (
        tito(
            "fake-engine",
            "--script",
            str(scenario),
            "--listen",
            f"127.0.0.1:{port}",
            ready=f"http://127.0.0.1:{port}/health",
        ),
        gateway(f"http://127.0.0.1:{listen}", "--no-routing-key") as url,
    ):
        record(
            out,
            f"http://127.0.0.1:{port}",
            scenario,
            "--target",
            url,
            "--engine-listen",
            f"127.0.0.1:{listen}",
            "--routing-header",
            "none",
            *volatile_flags(),
        )
    cassette = read_cassette(out)
    assert cassette.header.target["routing_header"] is None
    tokenizer = load_tokenizer()
    fruits = {}
    for log in cassette.sessions.values():
        calls = [e for e in log.engine if isinstance(e, EngineRecord) and e.path == "/generate"]
        assert len(calls) == 2 and not any("X-SMG-Routing-Key" in e.headers for e in calls)
        prompts = [tokenizer.decode(e.request["input_ids"]) for e in calls]
        fruit = "apples" if "the apples" in prompts[0] else "pears"
        fruits[fruit] = log
        assert all(f"the {fruit}" in p for p in prompts)  # both calls carry this session's own prompt
        assert f"There are {'three' if fruit == 'apples' else 'two'} {fruit}." in tokenizer.decode(
            calls[1].response["output_ids"]
        )
    assert set(fruits) == {"apples", "pears"}
    listen = free_port()
    with gateway(f"http://127.0.0.1:{listen}", "--no-routing-key") as url:
        args = (str(out), "--target", url, "--engine-listen", f"127.0.0.1:{listen}")
        assert replay(*args, "--update-goldens").returncode == 0
        run = replay(*args)
    assert run.returncode == 0 and "2 session(s): 2 ok" in run.stdout, run.stdout + run.stderr


def test_no_key_of_the_agent_reaches_a_cassette_recorded_around_a_gateway(engine: str, tmp_path: Path) -> None:  # noqa: F811
    out, listen, port = tmp_path / "keys.tito", free_port(), free_port()
    secrets = ("sk-ant-secret-0123456789abcdef", "secret-bearer-session-7")
    body = json.dumps(
        {
            "model": "m",
            "max_tokens": 64,
            "system": "You are a coding agent.",
            "messages": [{"role": "user", "content": "List the files."}],
        }
    ).encode()
    with (
        gateway(f"http://127.0.0.1:{listen}") as url,
        tito(
            "record",
            "--engine",
            engine,
            "--target",
            url,
            "--engine-listen",
            f"127.0.0.1:{listen}",
            "--listen",
            f"127.0.0.1:{port}",
            "--out",
            str(out),
            ready=f"http://127.0.0.1:{port}/health",
        ) as rec,
    ):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/messages",
            data=body,
            method="POST",
            headers={
                "Authorization": f"Bearer {secrets[1]}",
                "x-api-key": secrets[0],
                "Content-Type": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status == 200 and secrets[0] not in resp.read().decode()
        rec.send_signal(signal.SIGINT)
        rec.wait(timeout=30)
    data = out.read_bytes()
    assert all(s.encode() not in data for s in secrets)
    (log,) = read_cassette(out).sessions.values()  # the readiness checks' GET /health named no session: none
    assert len(log.agent) == 1 and log.agent[0].status == 200 and len(log.engine) == 1


def test_the_pytest_plugin_replays_through_the_target_its_flag_or_ini_key_names(
    project: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A cassette recorded through tito's adapter, replayed by pytest through another target: a one-token edit
    of the adapter (`tests.target_variants:edited`), named by `--tito-target` or the `tito_target` ini key."""
    copy = copy_project(project, tmp_path / "p")
    env = {"PYTHONPATH": str(ROOT)}
    assert pytest_run(copy, "-q", "--update-goldens", **env).returncode == 0
    assert pytest_run(copy, "-q", **env).returncode == 0
    edited = pytest_run(copy, "-q", "--tito-target", "tests.target_variants:edited", **env)
    assert edited.returncode == 1 and "2 failed" in edited.stdout, edited.stdout
    assert "engine request differs: input_ids at token" in edited.stdout
    (copy / "pytest.ini").write_text((copy / "pytest.ini").read_text() + "tito_target = tests.target_variants:edited\n")
    by_ini = pytest_run(copy, "-q", **env)
    assert by_ini.returncode == 1 and "engine request differs: input_ids at token" in by_ini.stdout, by_ini.stdout
    shutil.rmtree(copy)
