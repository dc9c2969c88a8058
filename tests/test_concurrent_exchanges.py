"""Two exchanges of one session in flight at once, through a gateway that calls the engine from a thread of its own
(issue #45, 3): each engine call belongs to the exchange whose request it renders, whatever order the calls reach
the engine in, and every way of replaying says so alike.

The gateway is `tests/gateway_double.py` served from its own thread and event loop (`create_threaded`, as slime's
`run_app_in_thread` serves its gateway); the client runs two sub-agents at once on one session
(`tests/scenarios/parallel_subagents.yaml`); at the recording the double's `overtake` knob makes the second
sub-agent's first engine call reach the engine before the first one's, the order a threaded gateway may take. The
recorder used to give a session's calls to its requests in arrival order, so the two sub-agents' calls were
swapped in the cassette: `--update-goldens` noted the changed prompt and went on, every plain replay failed at
"engine request differs: input_ids at token 6" (the other sub-agent's system prompt).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process_helpers import ROOT, free_port, tito
from tests.test_pytest_plugin import INI, pytest_run
from tests.test_targets_record_replay import replay
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import CassetteReader, read_cassette
from tito_rl.recorder.taps.attribution import Attribution, Owner
from tito_rl.replayer.cassette_tools.cut_merge import new_cassette
from tito_rl.replayer.replay.plan import plan_session
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

# One worker runs this module (tests/xdist_groups.py): its module-scoped recording is made once.
pytestmark = pytest.mark.xdist_group("concurrent_exchanges")

SCENARIO = ROOT / "tests" / "scenarios" / "parallel_subagents.yaml"
THREADED = "tests.gateway_double:create_threaded"
AGENTS = ("configuration searcher", "test-suite searcher", "main coding agent")
ROUNDS = 10
KEY = {"X-SMG-Routing-Key": "s1"}


def agent_of(text: str) -> str:
    """Which conversation a request or a prompt is: the system prompt it carries."""
    return next(a for a in AGENTS if a in text)


# --- the attribution itself, no servers -------------------------------------------------------------------------

CONFIG = ("You are a configuration searcher.", "Find where the config is read.")
TESTS = ("You are a test-suite searcher.", "Find where the tests live.")


def agent_body(system: str, task: str) -> bytes:
    return json.dumps({"system": system, "messages": [{"role": "user", "content": task}]}).encode()


def chat(system: str, task: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": task}]


def test_a_session_s_concurrent_requests_get_their_own_engine_calls_whatever_order_they_come_in() -> None:
    """Two sub-agents of one session in flight; their engine calls come second first. By the text each call's
    prompt holds (its ids decoded, or its messages), each goes to its own request, not to the older one."""
    tokenizer = load_tokenizer()
    a = Attribution("X-SMG-Routing-Key", lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
    config = a.begin("s1", "bearer", None, agent_body(*CONFIG))
    tests = a.begin("s1", "bearer", None, agent_body(*TESTS))
    ids = {
        name: tokenizer.apply_chat_template(chat(*spec), tokenize=True, add_generation_prompt=True)
        for name, spec in (("config", CONFIG), ("tests", TESTS))
    }
    for name in ("config", "tests"):  # plain lists, whatever apply_chat_template returns
        ids[name] = list(ids[name]["input_ids"] if hasattr(ids[name], "keys") else ids[name])
    second = a.owner("/generate", KEY, {"input_ids": ids["tests"]})
    assert second is not None and second.flight is tests  # the order rule gave it to `config`, the older
    a.generate_started(second, {"rid": "t"})
    first = a.owner("/generate", KEY, {"input_ids": ids["config"]})
    assert first is not None and first.flight is config
    # a messages-in call (SGLang's or vLLM's chat) is read by its messages' text, with no tokenizer
    plain = Attribution("X-SMG-Routing-Key")
    config, tests = (
        plain.begin("s1", "bearer", None, agent_body(*CONFIG)),
        plain.begin("s1", "bearer", None, agent_body(*TESTS)),
    )
    found = plain.owner("/v1/chat/completions", KEY, {"messages": chat(*TESTS)})
    assert found is not None and found.flight is tests
    # alike requests (a client's re-send) say nothing by their text: the order rule decides, as before
    same = Attribution("X-SMG-Routing-Key")
    older, newer = (
        same.begin("s1", "bearer", None, agent_body(*CONFIG)),
        same.begin("s1", "bearer", None, agent_body(*CONFIG)),
    )
    found = same.owner("/v1/chat/completions", KEY, {"messages": chat(*CONFIG)})
    assert found is not None and found.flight is older
    same.generate_started(Owner("s1", "bearer", older), {})
    assert same.owner("/v1/chat/completions", KEY, {"messages": chat(*CONFIG)}).flight is newer


def test_a_long_session_s_calls_are_read_by_their_first_and_last_tokens() -> None:
    """The main agent's history is long (a big tool result); a sub-agent runs beside it. Only the prompt's first
    and last tokens are decoded, and each request's system prompt and newest lines sought there: still each call
    is its own request's."""
    tokenizer = load_tokenizer()
    a = Attribution("X-SMG-Routing-Key", lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
    output = "\n".join(
        f"src/module_{i}.py:{i}: def handler_{i}(request): return request.value + {i}" for i in range(600)
    )
    main = [
        {"role": "system", "content": "You are the main coding agent."},
        {"role": "user", "content": "Find the handlers."},
        {"role": "assistant", "content": "Searching."},
        {"role": "user", "content": output},
        {"role": "user", "content": "Now count them."},
    ]
    main_flight = a.begin("s1", "bearer", None, json.dumps({"messages": main}).encode())
    sub_flight = a.begin("s1", "bearer", None, agent_body(*CONFIG))

    def ids(messages: list[dict[str, str]]) -> list[int]:
        rendered = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)

    long = ids(main)
    assert len(long) > 3 * 4096  # past the two windows read
    assert a.owner("/generate", KEY, {"input_ids": ids(chat(*CONFIG))}).flight is sub_flight
    assert a.owner("/generate", KEY, {"input_ids": long}).flight is main_flight


# --- recorded around a threaded gateway, replayed every way -------------------------------------------------------


def record(out: Path, engine: str) -> None:
    """`tito record` around the threaded double, its engine calls overtaking (`overtake`: the first sub-agent's
    first call waits until the other sub-agent's has been answered)."""
    env = {**os.environ, "GATEWAY_DOUBLE_EXTRA": json.dumps({"overtake": "searcher"})}
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl", "record", "--engine", engine, "--agent", "scripted", "--scenario",
         str(SCENARIO), "--out", str(out), "--listen", f"127.0.0.1:{free_port()}", "--quiet", "--target", THREADED],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recording, its calls overtaking (`overtaken`). The double holds the first request to reach it, which is
    nearly always the first to reach the recorder; where the two swapped on their way, it is recorded again."""
    folder = tmp_path_factory.mktemp("concurrent")
    port = free_port()
    with tito(
        "fake-engine",
        "--script",
        str(SCENARIO),
        "--listen",
        f"127.0.0.1:{port}",
        ready=f"http://127.0.0.1:{port}/health",
    ):
        for attempt in range(3):
            out = folder / f"try{attempt}" / "parallel_subagents.tito"
            out.parent.mkdir()
            record(out, f"http://127.0.0.1:{port}")
            if overtaken(out):
                return out
    raise AssertionError("three recordings, and no engine call overtook another")


def overtaken(path: Path) -> bool:
    """Two requests of the session in flight together whose engine calls reached the engine the other way round."""
    (log,) = read_cassette(path).sessions.values()
    times = [(e.record.started_s, e.engine[0].started_s) for e in plan_session(log).exchanges if e.engine]
    return any(a[0] < b[0] and a[1] > b[1] for a in times for b in times)


def test_the_recording_gives_each_exchange_the_engine_calls_of_its_own_request(recorded: Path) -> None:
    tokenizer = load_tokenizer()
    (log,) = read_cassette(recorded).sessions.values()
    plan = plan_session(log)
    assert len(plan.exchanges) == 6  # main 2, each sub-agent 2
    for exchange in plan.exchanges:
        (call,) = exchange.engine
        assert agent_of(tokenizer.decode(call.request["input_ids"])) == agent_of(exchange.record.body.decode())
    assert overtaken(recorded)  # the hard case: two requests in flight together, their calls the other way round


@contextlib.contextmanager
def env_var(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


@pytest.mark.slow
def test_update_goldens_plain_jobs_ray_and_pytest_agree_ten_times_in_a_row(recorded: Path, tmp_path: Path) -> None:
    """Goldens written on a copy, then every way of replaying, ROUNDS times over: all green, the same bytes."""
    folder = tmp_path / "cassettes"
    folder.mkdir()
    copy = folder / recorded.name
    shutil.copy(recorded, copy)
    written = replay(str(copy), "--update-goldens", "--target", THREADED)
    assert written.returncode == 0 and "1 ok" in written.stdout, written.stdout + written.stderr
    assert "warning" not in written.stdout and "differs" not in written.stdout, written.stdout  # nothing noted
    outputs: set[str] = set()
    with contextlib.ExitStack() as stack:
        modes: list[tuple[str, ...]] = [(), ("--jobs", "2")]
        if importlib.util.find_spec("ray") is not None:  # the `ray` extra (`make test` installs it)
            from tests.ray_support import LOOPBACK, local_cluster

            for name, value in LOOPBACK.items():
                stack.enter_context(env_var(name, value))
            modes.append(("--ray", stack.enter_context(local_cluster(cpus=2))))
        for _ in range(ROUNDS):
            for mode in modes:
                run = replay(str(copy), "--target", THREADED, *mode)
                assert run.returncode == 0 and "1 session(s): 1 ok" in run.stdout, run.stdout + run.stderr
                outputs.add(run.stdout)
    assert len(outputs) == 1
    # the pytest plugin: ROUNDS copies of the cassette and its golden, one item each, in one pytest run
    (tmp_path / "pytest.ini").write_text(INI + f"tito_target = {THREADED}\n")  # the user names the gateway
    for i in range(1, ROUNDS):
        shutil.copy(copy, folder / f"copy{i}.tito")
        shutil.copy(copy.with_suffix(".golden"), folder / f"copy{i}.golden")
    run = pytest_run(tmp_path, "-q", PYTHONPATH=str(ROOT))
    assert run.returncode == 0 and f"{ROUNDS} passed" in run.stdout, run.stdout[-3000:]


def swapped(source: Path, out: Path) -> None:
    """`source` with the two sub-agents' first engine calls traded: a recording made when calls went to a
    session's requests in their order of arrival, and arrived the other way round."""
    with CassetteReader(source) as reader:
        records = list(reader.records())
    tokenizer = load_tokenizer()
    firsts: dict[str, int] = {}
    for i, record in enumerate(records):
        if isinstance(record, EngineRecord):
            agent = agent_of(tokenizer.decode(record.request["input_ids"]))
            if agent != AGENTS[2]:
                firsts.setdefault(agent, i)
    i, j = firsts[AGENTS[0]], firsts[AGENTS[1]]
    first, second = records[i], records[j]
    first.seq, second.seq = second.seq, first.seq  # each keeps the place it takes
    records[i], records[j] = second, first
    with new_cassette(out, read_cassette(source).header) as writer:
        for record in records:
            writer.append_redacted(record)


def test_a_recording_whose_concurrent_calls_were_swapped_replays_each_call_against_its_twin(
    recorded: Path, tmp_path: Path
) -> None:
    """Cassettes recorded before the fix hold a session's concurrent calls swapped: replay serves each call the
    recorded answer to its own prompt (the exchanges trade the two recorded calls), so they replay green too."""
    out = tmp_path / "swapped.tito"
    swapped(recorded, out)
    tokenizer = load_tokenizer()
    (log,) = read_cassette(out).sessions.values()
    wrong = [
        e.index
        for e in plan_session(log).exchanges
        if agent_of(tokenizer.decode(e.engine[0].request["input_ids"])) != agent_of(e.record.body.decode())
    ]
    assert len(wrong) == 2  # as the recorder wrote them then
    written = replay(str(out), "--update-goldens", "--target", THREADED)
    assert written.returncode == 0 and "differs" not in written.stdout, written.stdout
    for mode in ((), ("--jobs", "2")):
        run = replay(str(out), "--target", THREADED, *mode)
        assert run.returncode == 0 and "1 ok" in run.stdout, run.stdout + run.stderr
    # each exchange was answered as live: the samples are the right recording's, line for line
    right = tmp_path / "right.tito"
    shutil.copy(recorded, right)
    assert replay(str(right), "--update-goldens", "--target", THREADED).returncode == 0
    golden = out.with_suffix(".golden").read_text().replace("swapped.tito", "right.tito")
    assert golden == right.with_suffix(".golden").read_text()
