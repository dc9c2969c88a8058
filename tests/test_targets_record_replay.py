"""Record around a target and replay through it: a driver's gateway, a running gateway over http://, a GRPO group.

Everything over real HTTP on loopback, with `tito record`/`tito replay` as real processes: the scripted
client -> agent tap -> target -> engine tap -> the fake engine, then the cassette back through the target.
The target here is tito's own adapter run as a driver behind the generic taps (`tito_rl.recorder.targets.tito`), and
`tito serve` as a separate process for the http:// kind; tests/test_gateway_double.py does the same with a
gateway of another design.
"""

from __future__ import annotations

import contextlib
import io
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process_helpers import ROOT, free_port, tito
from tito_rl import main as tito_cli
from tito_rl.cassette.format.records import AgentRecord, EngineRecord
from tito_rl.cassette.reader import read_cassette
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

# One worker runs this module (tests/xdist_groups.py): its module-scoped fixture is made once.
pytestmark = pytest.mark.xdist_group("targets_record_replay")

TITO_DRIVER = "tito_rl.recorder.targets.tito:create"
TOOL_LOOP = ROOT / "cassettes" / "scenarios" / "tool_loop.yaml"
WORDS = ("amber", "birch", "cedar", "dune", "ember", "fjord", "grove", "heath")


def run_tito(*args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s
    )


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    """`tito replay ARGS` in this process (its tokenizer and parsers loaded once for all the tests)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), contextlib.chdir(ROOT):
        code = tito_cli.main(["replay", *args])
    return subprocess.CompletedProcess(["tito", "replay", *args], code, out.getvalue(), err.getvalue())


def record(out: Path, engine: str, scenario: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    run = run_tito(
        "record",
        "--engine",
        engine,
        "--agent",
        "scripted",
        "--scenario",
        str(scenario),
        "--out",
        str(out),
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--quiet",
        *extra,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    port = free_port()
    with tito(
        "fake-engine",
        "--script",
        str(TOOL_LOOP),
        "--listen",
        f"127.0.0.1:{port}",
        ready=f"http://127.0.0.1:{port}/health",
    ):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def around_driver(engine: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("driver") / "tool_loop.tito"
    record(out, engine, TOOL_LOOP, "--target", TITO_DRIVER)
    return out


def test_a_recording_around_a_driver_holds_both_legs_in_tito_s_layout(around_driver: Path) -> None:
    cassette = read_cassette(around_driver)
    assert cassette.header.target is not None
    assert cassette.header.target["kind"] == "driver" and cassette.header.target["ref"] == TITO_DRIVER
    assert cassette.header.target["name"] == "tito" and cassette.header.target["version"]
    (log,) = cassette.sessions.values()
    kinds = [type(r).__name__ for r in log.records if isinstance(r, AgentRecord | EngineRecord)]
    # every agent exchange comes right after the /generate it caused, as tito's adapter writes them
    assert kinds == ["EngineRecord", "AgentRecord"] * 7
    assert [e.headers.get("X-SMG-Routing-Key") for e in log.engine] == [log.name] * 7  # the name, not the id
    assert all(a.status == 200 and a.reply_events for a in log.agent)  # streamed replies kept as SSE events
    (sample,) = log.samples
    assert sum(sample["loss_mask"]) > 0 and sample["reward"] == 1.0


def test_no_secret_reaches_a_cassette_recorded_around_a_target(around_driver: Path) -> None:
    data = around_driver.read_bytes()
    assert b"corpus-tool-loop-0000" not in data  # the session id was the bearer token


def test_a_cassette_recorded_around_a_driver_replays_through_it_twice_byte_identical(around_driver: Path) -> None:
    written = replay(str(around_driver), "--update-goldens")
    assert written.returncode == 0, written.stdout + written.stderr
    golden = around_driver.with_suffix(".golden").read_text()
    assert f"stats (target {TITO_DRIVER}): turns 7, samples 1" in golden
    first = replay(str(around_driver))
    second = replay(str(around_driver), "--jobs", "4")
    assert first.returncode == second.returncode == 0, first.stdout + first.stderr
    assert first.stdout == second.stdout and " ok" in first.stdout
    # the same cassette through tito's adapter in-process: the same samples (goldens belong to the recorded target)
    through_tito = replay(str(around_driver), "--target", "tito")
    assert through_tito.returncode == 0, through_tito.stdout
    assert "goldens not checked" in through_tito.stdout


def test_a_one_token_edit_in_the_target_fails_the_replay_naming_that_token(around_driver: Path) -> None:
    run = replay(str(around_driver), "--target", "tests.target_variants:edited")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "engine request differs: input_ids at token 24 (recorded 286 tokens, replayed 287)" in run.stdout
    replayed = next(line for line in run.stdout.splitlines() if line.strip().startswith("replayed:"))
    assert "be brief' | '.!\\n\\n# Tools" in replayed  # the token, decoded, where it differs
    assert "in rendered message 0 (system)" in run.stdout


def test_unusable_targets_are_one_line_and_exit_2(around_driver: Path, engine: str, tmp_path: Path) -> None:
    for args in (
        ["--target", "no-such-target"],
        ["--target", "tests.target_variants:not_a_driver"],
        ["--target", "http://127.0.0.1:9"],
    ):  # a running gateway needs --engine-listen
        run = replay(str(around_driver), *args)
        assert run.returncode == 2, run.stdout + run.stderr
        assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr, run.stderr
    run = run_tito("record", "--engine", engine, "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "x.tito"))
    assert run.returncode == 2 and "--engine-listen" in run.stderr


GRPO = """\
name: grpo_group
after_last: error
sessions:
{engine}
client:
  sessions:
{client}
"""


def grpo_scenario(folder: Path) -> Path:
    """Eight sessions of one prompt, as a GRPO group samples them: identical first prompts, different outputs."""
    engine = "\n".join(
        f"  - match: {{routing_key: grpo-{i:04d}}}\n    turns:\n"
        f"      - reasoning: I pick a word.\n        text: My word is {w}."
        for i, w in enumerate(WORDS)
    )
    client = "\n".join(
        f"    - id: grpo-{i:04d}\n      wire: {'anthropic' if i % 2 else 'chat'}\n      stream: true\n"
        "      system: You answer with one word.\n      tools: [Bash]\n"
        "      steps:\n        - prompt: Pick a word.\n        - finish: 1.0"
        for i in range(len(WORDS))
    )
    path = folder / "grpo_group.yaml"
    path.write_text(GRPO.format(engine=engine, client=client))
    return path


def test_a_grpo_group_gets_each_session_its_own_output_back_on_replay(tmp_path: Path) -> None:
    scenario = grpo_scenario(tmp_path)
    out = tmp_path / "grpo.tito"
    port = free_port()
    with tito(
        "fake-engine",
        "--script",
        str(scenario),
        "--listen",
        f"127.0.0.1:{port}",
        ready=f"http://127.0.0.1:{port}/health",
    ):
        record(out, f"http://127.0.0.1:{port}", scenario, "--target", TITO_DRIVER)
    cassette = read_cassette(out)
    tokenizer = load_tokenizer()
    assert len(cassette.sessions) == len(WORDS)
    prompts = set()
    for log in cassette.sessions.values():
        (call,) = [e for e in log.engine if e.path == "/generate"]
        word = next(w for w in WORDS if w in tokenizer.decode(call.response["output_ids"]))
        (exchange,) = log.agent
        reply = "".join(exchange.reply_events or [])
        assert word in reply and not [w for w in WORDS if w != word and w in reply]  # its own output, no other
        assert f"My word is {word}." in tokenizer.decode(log.samples[0]["tokens"])
        prompts.add((tuple(call.request["input_ids"][-40:]), exchange.path))
    assert len({p for p, _ in prompts}) <= 2  # the first prompts were identical (one per wire)
    assert replay(str(out), "--update-goldens").returncode == 0
    for jobs in ("1", "8"):
        run = replay(str(out), "--jobs", jobs)
        # each reply was compared with the recorded one: a session served another's output would differ
        assert run.returncode == 0 and f"{len(WORDS)} session(s): {len(WORDS)} ok" in run.stdout, run.stdout


def test_a_running_gateway_is_recorded_and_replayed_over_http(engine: str, tmp_path: Path) -> None:
    """`tito serve` started by hand is the gateway: tito taps both legs without starting it."""
    engine_listen, gateway = free_port(), free_port()
    out = tmp_path / "http.tito"
    with tito(
        "serve",
        "--engine",
        f"http://127.0.0.1:{engine_listen}",
        "--listen",
        f"127.0.0.1:{gateway}",
        ready=f"http://127.0.0.1:{gateway}/health",
    ):
        record(
            out,
            engine,
            TOOL_LOOP,
            "--target",
            f"http://127.0.0.1:{gateway}",
            "--engine-listen",
            f"127.0.0.1:{engine_listen}",
        )
        cassette = read_cassette(out)
        assert cassette.header.target["kind"] == "http"
        (log,) = cassette.sessions.values()
        assert len(log.agent) == 7 and len(log.samples) == 1  # its own session API gave the samples
        for _ in range(2):
            run = replay(str(out), "--engine-listen", f"127.0.0.1:{engine_listen}", "--update-goldens")
            assert run.returncode == 0, run.stdout + run.stderr
        run = replay(str(out), "--engine-listen", f"127.0.0.1:{engine_listen}")
        assert run.returncode == 0 and " ok" in run.stdout, run.stdout + run.stderr


def test_kill_9_of_a_recording_around_a_target_keeps_every_completed_exchange(engine: str, tmp_path: Path) -> None:
    out, port = tmp_path / "killed.tito", free_port()
    body = (
        b'{"model":"m","max_tokens":256,"stream":false,"system":"You are a coding agent.",'
        b'"messages":[{"role":"user","content":"List the files."}]}'
    )
    with tito(
        "record",
        "--engine",
        engine,
        "--target",
        TITO_DRIVER,
        "--listen",
        f"127.0.0.1:{port}",
        "--out",
        str(out),
        ready=f"http://127.0.0.1:{port}/v1/models",
    ) as rec:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/messages",
            data=body,
            method="POST",
            headers={"Authorization": "Bearer killed-session-1", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status == 200
        deadline = time.monotonic() + 120  # a hang's bound: the append takes milliseconds
        while time.monotonic() < deadline and not any(
            a.path == "/v1/messages" for log in read_cassette(out).sessions.values() for a in log.agent
        ):
            time.sleep(0.05)
        rec.send_signal(signal.SIGKILL)
        rec.wait(timeout=60)
    cassette = read_cassette(out)
    turns = [a for log in cassette.sessions.values() for a in log.agent if a.path == "/v1/messages"]
    assert len(turns) == 1 and turns[0].status == 200
    assert sum(e.path == "/generate" for log in cassette.sessions.values() for e in log.engine) == 1
    assert b"killed-session-1" not in out.read_bytes()
