"""Target drivers over real HTTP on loopback: the gateway double written in these tests (as a driver and as a
process) and the built-in `slime` driver around slime's own adapters, each against the fake engine; and finding
drivers by name.

The slime tests need a slime checkout (`TITO_SLIME_PATH=/path/to/slime`, or slime on the path) and are skipped
with that reason elsewhere.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import logging
import os
import subprocess
import sys
import threading
import time
from importlib.metadata import entry_points
from pathlib import Path

import aiohttp
import msgspec
import pytest

from tests.target_support import (
    TOOLS,
    TURNS,
    check_samples,
    client_script,
    mask_paths,
    reply_payloads,
    samples_of,
    session_id,
    slime_missing,
    start_logged_engine,
    system_prompt,
)
from tito_rl.recorder.scripted.client import run_script
from tito_rl.recorder.scripted.script import TOOL_CATALOG, Disconnect, Step
from tito_rl.recorder.scripted.wires import WIRE_CODECS
from tito_rl.recorder.targets import slime_env
from tito_rl.recorder.targets.base import ENTRY_POINT_GROUP, ROUTING_HEADER, TargetError, TargetFinish, TargetOptions
from tito_rl.recorder.targets.registry import create_driver, load_factory

ROOT = Path(__file__).resolve().parent.parent
WIRES = [("anthropic", True), ("anthropic", False), ("chat", True), ("chat", False)]
DROPPED = "gone-anthropic-sse"
DOUBLE = "tests.gateway_double:create"


needs_slime = pytest.mark.skipif(slime_missing() is not None, reason=f"needs slime: {slime_missing()}")

DRIVERS = [
    pytest.param(DOUBLE, {}, id="double"),
    pytest.param(DOUBLE, {"routing_key": False}, id="double-no-routing-key"),
    pytest.param("slime", {}, id="slime", marks=needs_slime),
]


def _threads() -> set[threading.Thread]:
    # The test loop's own to_thread workers (asyncio_N) belong to pytest-asyncio's loop, not to the driver.
    return {t for t in threading.enumerate() if t.is_alive() and not t.name.startswith("asyncio_")}


async def _refused(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as http, http.get(url + "/health", timeout=aiohttp.ClientTimeout(5)):
            return False
    except aiohttp.ClientConnectorError:
        return True


@pytest.mark.parametrize(("name", "extra"), DRIVERS)
async def test_driver_records_a_session_on_every_wire(name: str, extra: dict) -> None:
    """Each wire the driver serves, JSON and SSE: a three-turn tool loop over HTTP, finished with a reward; the
    samples keep the invariants, the routing key reached the engine; then a drop, an unknown finish, a stop."""
    sids = [session_id(w, s) for w, s in WIRES]
    before = _threads()
    engine = start_logged_engine([*sids, DROPPED])
    driver = create_driver(name, TargetOptions(extra=extra))
    url = ""
    try:
        url = await driver.start(engine.url)
        results = await run_script(client_script(WIRES), url)
        assert [r.error for r in results] == [None] * len(WIRES)
        assert [r.requests for r in results] == [len(TURNS)] * len(WIRES)
        for wire, stream in WIRES:
            sid = session_id(wire, stream)
            generations = engine.of(f"agent {sid},")
            assert len(generations) == len(TURNS)
            keyed = extra.get("routing_key", True)
            assert [g.routing_key for g in generations] == [sid if keyed else None] * len(TURNS)
            finished = await driver.finish(sid, 1.0)
            samples = samples_of(finished)
            # slime renders an OpenAI client's echo without its reasoning: the drift realigns, masking the
            # earlier outputs (see SLIME_NOTES); every other case trains each output once.
            every = not (name == "slime" and wire == "chat")
            trained = check_samples(samples, generations, every_output=every)
            assert {s["reward"] for s in samples} == {1.0}
            if isinstance(finished, TargetFinish):
                stats = finished.stats
                assert stats["turns"] == len(TURNS) and stats["samples"] == len(samples)
                assert stats["trained_tokens"] == sum(sum(s["loss_mask"]) for s in samples)
                assert stats["untrained_turns"] == len(TURNS) - trained
            assert samples_of(await driver.finish(sid, 1.0)) == []  # finished: gone
        gone = await run_script(client_script([("anthropic", True)], max_turns=1, prefix="gone"), url)
        assert gone[0].error is None and gone[0].requests == 1
        await driver.drop(DROPPED)
        assert samples_of(await driver.finish(DROPPED, 1.0)) == []
        assert samples_of(await driver.finish("never-seen", 0.5)) == []
    finally:
        await driver.stop()
        engine.server.stop()
    assert url and await _refused(url)
    assert _threads() <= before, f"left running: {[t.name for t in _threads() - before]}"


# --- slime ----------------------------------------------------------------------------------------------------


@needs_slime
async def test_slime_finish_stats_show_its_drift_decisions() -> None:
    """slime's own linearization, observed: the Anthropic loop is one clean chain; the chat client's echo
    without reasoning realigns each later turn, so only the last output stays trained."""
    engine = start_logged_engine([session_id(w, s) for w, s in WIRES])
    driver = create_driver("slime", TargetOptions())
    try:
        url = await driver.start(engine.url)
        await run_script(client_script([("anthropic", True), ("chat", True)]), url)
        clean = await driver.finish(session_id("anthropic", True), 1.0)
        drifted = await driver.finish(session_id("chat", True), 1.0)
    finally:
        await driver.stop()
        engine.server.stop()
    assert isinstance(clean, TargetFinish) and isinstance(drifted, TargetFinish)
    assert {k: clean.stats[k] for k in ("turns", "samples", "leaves", "forks", "realigns", "untrained_turns")} == {
        "turns": 3,
        "samples": 1,
        "leaves": 1,
        "forks": {},
        "realigns": 0,
        "untrained_turns": 0,
    }
    assert {k: drifted.stats[k] for k in ("turns", "samples", "forks", "realigns", "untrained_turns")} == {
        "turns": 3,
        "samples": 1,
        "forks": {},
        "realigns": 2,
        "untrained_turns": 2,
    }
    assert drifted.stats["realigned_tokens"] > 0
    assert (
        drifted.stats["masked_tokens"]
        == sum(s["response_length"] for s in drifted.samples) - drifted.stats["trained_tokens"]
    )


@needs_slime
async def test_slime_engine_error_is_logged_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """slime answers an engine 529 with a 500 and raises, which aiohttp logs with a traceback: the driver keeps it
    to one line; the client's retry then succeeds and the failed attempt leaves no turn."""
    sid = session_id("anthropic", True)
    turns = [{**TURNS[0], "faults": {"status": 529}, "fault_attempts": 1}, *TURNS[1:]]
    engine = start_logged_engine([sid], turns)
    driver = create_driver("slime", TargetOptions())
    try:
        url = await driver.start(engine.url)
        with caplog.at_level(logging.WARNING):
            results = await run_script(client_script([("anthropic", True)]), url)
        finished = await driver.finish(sid, 1.0)
    finally:
        await driver.stop()
        engine.server.stop()
    assert results[0].error is None and results[0].retries == 1 and results[0].requests == len(TURNS)
    assert isinstance(finished, TargetFinish) and finished.stats["turns"] == len(TURNS)
    errors = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert errors and all(r.exc_info is None for r in errors)
    assert "RuntimeError: sglang upstream 529" in errors[0].getMessage()


@needs_slime
@pytest.mark.parametrize("stream", [True, False], ids=["sse", "json"])
async def test_slime_aborts_the_engine_when_the_client_walks_away(stream: bool) -> None:
    """Run as slime's own launcher runs it (handler cancellation): a client that closes mid-generation cancels
    slime's handler, which aborts the engine request and records no turn; the re-sent request is the turn."""
    sid = session_id("anthropic", stream)
    turns = [TURNS[0], {**TURNS[1], "faults": {"token_delay_ms": 40}}, TURNS[2]]
    engine = start_logged_engine([sid], turns)
    driver = create_driver("slime", TargetOptions())
    script = client_script([("anthropic", stream)])
    script = msgspec.structs.replace(
        script,
        sessions=(
            msgspec.structs.replace(
                script.sessions[0], disconnects=(Disconnect(request=1, after_ms=300, resend_after_ms=300),)
            ),
        ),
    )
    try:
        url = await driver.start(engine.url)
        results = await run_script(script, url)
        finished = await driver.finish(sid, 1.0)
    finally:
        await driver.stop()
        engine.server.stop()
    assert results[0].error is None and results[0].disconnects == 1
    generations = engine.of(f"agent {sid},")
    assert len(generations) == len(TURNS) + 1
    sent_twice = [g for g in generations if [h.prompt for h in generations].count(g.prompt) == 2]
    lengths = sorted(len(g.output) for g in sent_twice)
    assert len(lengths) == 2 and lengths[0] < lengths[1]  # the abandoned generation was aborted, cut short
    assert isinstance(finished, TargetFinish)
    assert (finished.stats["turns"], finished.stats["samples"]) == (len(TURNS), 1)


@needs_slime
async def test_slime_volatile_fields_are_exactly_its_random_ones() -> None:
    """The same request twice on each wire, JSON and SSE: the replies differ, and equal each other once the
    driver's volatile paths are masked; every path names a field slime really fills."""
    engine_sids = ["vol-anthropic", "vol-chat"]
    engine = start_logged_engine(engine_sids)
    driver = create_driver("slime", TargetOptions())
    hits: set[str] = set()
    try:
        url = await driver.start(engine.url)
        async with aiohttp.ClientSession() as http:
            for wire, stream in WIRES:
                codec = WIRE_CODECS[wire]
                tools = tuple(TOOL_CATALOG[t] for t in TOOLS[wire])
                body = codec.body(
                    "tito-policy",
                    system_prompt(f"vol-{wire}"),
                    tools,
                    [codec.user("What is this project?")],
                    4096,
                    stream,
                    "vol",
                )
                replies = []
                for sid in (f"vol-{wire}-{stream}-a", f"vol-{wire}-{stream}-b"):
                    await asyncio.sleep(1.01 - time.time() % 1)  # a new wall-clock second: `created` differs
                    async with http.post(
                        url + codec.path, json=body, headers={"Authorization": f"Bearer {sid}"}
                    ) as resp:
                        assert resp.status == 200
                        replies.append(reply_payloads(await resp.read(), resp.headers["Content-Type"]))
                assert replies[0] != replies[1]
                masked = []
                for payloads in replies:
                    out = []
                    for payload in payloads:
                        value, hit = mask_paths(payload, driver.info.volatile)
                        hits |= hit
                        out.append(value)
                    masked.append(out)
                assert masked[0] == masked[1], f"{wire} stream={stream}: a random field is not named volatile"
    finally:
        await driver.stop()
        engine.server.stop()
    assert hits == set(driver.info.volatile)


@needs_slime
def test_slime_info_names_the_checkout_commit_and_settings() -> None:
    driver = create_driver("slime", TargetOptions(reasoning_parser="qwen3", tool_parser="qwen25", fork_threshold=77))
    root = slime_env.locate()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert driver.info.version == head.stdout.strip()
    assert driver.info.name == "slime" and driver.info.routing_header == ROUTING_HEADER
    settings = driver.info.settings
    assert settings["reasoning_parser"] == "qwen3" and settings["tool_parser"] == "qwen25"
    assert settings["fork_threshold_tokens"] == 77 and settings["tokenizer_fingerprint"].startswith("sha256:")


def _dataclass_fields(source: str, class_name: str) -> list[tuple[str, str | None]]:
    """(name, default as source) of each annotated field of a class, nested dataclasses included, in order."""
    tree = ast.parse(source)
    found = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    out: list[tuple[str, str | None]] = []
    for stmt in found.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out.append((stmt.target.id, ast.unparse(stmt.value) if stmt.value else None))
        elif isinstance(stmt, ast.ClassDef):
            members = [ast.unparse(s) for s in stmt.body if isinstance(s, ast.Assign)]
            out.append((f"class {stmt.name}", "; ".join(members) or None))
            out += [
                (f"{stmt.name}.{name}", default) for name, default in _dataclass_fields(ast.unparse(stmt), stmt.name)
            ]
    return out


@needs_slime
def test_sample_stand_in_has_slimes_fields() -> None:
    """Field for field (names, order, defaults, nested Status/SpecInfo/PrefixCacheInfo) against slime's source."""
    slimes = (slime_env.locate() / "slime" / "utils" / "types.py").read_text(encoding="utf-8")
    ours = (ROOT / "recorder" / "targets" / "slime_sample.py").read_text(encoding="utf-8")
    assert _dataclass_fields(ours, "Sample") == _dataclass_fields(slimes, "Sample")


@needs_slime
def test_slime_target_without_torch_says_so_in_one_line() -> None:
    code = (
        "import asyncio\nfrom tito_rl.recorder.targets.registry import create_driver\n"
        "from tito_rl.recorder.targets.base import TargetOptions\n"
        "d = create_driver('slime', TargetOptions())\nprint(d.info.settings['sample_stand_in'])\n"
    )
    env = {**os.environ, "TITO_SLIME_PATH": str(slime_env.locate())}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    try:
        importlib.import_module("torch")  # by name: torch is no dependency of tito's, nor typed here
    except ImportError:
        assert done.stdout.strip() == "True"
        assert done.stderr.count("\n") == 1 and "stands in slime.utils.types.Sample" in done.stderr
    else:
        assert done.stdout.strip() == "False" and done.stderr == ""


# --- without slime ---------------------------------------------------------------------------------------------


def test_slime_missing_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_SLIME_PATH", str(tmp_path))
    with pytest.raises(TargetError) as caught:
        slime_env.locate()
    message = str(caught.value)
    assert "\n" not in message and "TITO_SLIME_PATH" in message and "slime/agent/adapters" in message


def test_git_commit_is_read_from_loose_and_packed_refs_and_worktrees(tmp_path: Path) -> None:
    sha, other = "a" * 40, "b" * 40
    git = tmp_path / "clone" / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{other} refs/heads/dev\n{sha} refs/heads/main\n")
    assert slime_env.git_commit(tmp_path / "clone") == sha
    (git / "refs" / "heads" / "main").write_text(other + "\n")  # a loose ref wins over the packed one
    assert slime_env.git_commit(tmp_path / "clone") == other
    worktree_git = git / "worktrees" / "wt"
    worktree_git.mkdir(parents=True)
    (worktree_git / "HEAD").write_text("ref: refs/heads/dev\n")
    (worktree_git / "commondir").write_text("../..\n")
    (tmp_path / "wt").mkdir()
    (tmp_path / "wt" / ".git").write_text(f"gitdir: {worktree_git}\n")
    assert slime_env.git_commit(tmp_path / "wt") == other
    (worktree_git / "HEAD").write_text(sha + "\n")  # detached
    assert slime_env.git_commit(tmp_path / "wt") == sha
    assert slime_env.git_commit(tmp_path) is None


def test_tito_and_slime_are_registered_entry_points() -> None:
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    assert found.get("tito") == "tito_rl.recorder.targets.tito:create"
    assert found.get("slime") == "tito_rl.recorder.targets.slime:create"
    from tito_rl.recorder.targets import slime

    assert load_factory("slime") is slime.create  # importing the driver's module does not import slime


def test_a_driver_is_found_as_module_attribute() -> None:
    from tests import gateway_double

    assert load_factory(DOUBLE) is gateway_double.create
    driver = create_driver(DOUBLE, TargetOptions(extra={"routing_key": False}))
    assert driver.info.name == "gateway-double" and driver.info.routing_header is None


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("no-such-gateway", "unknown target 'no-such-gateway'"),
        ("tests.gateway_double:nothing_here", "has no attribute 'nothing_here'"),
        ("tests.no_such_module:create", "cannot import tests.no_such_module"),
        ("tests.gateway_double:VOLATILE", "is not callable"),
    ],
)
def test_a_bad_target_name_is_one_clear_line(name: str, says: str) -> None:
    with pytest.raises(TargetError) as caught:
        create_driver(name, TargetOptions())
    assert says in str(caught.value) and "\n" not in str(caught.value)
    if name == "no-such-gateway":
        assert "slime" in str(caught.value) and "tito" in str(caught.value)


# --- the gateway double as a process (the http:// target) -----------------------------------------------------


@pytest.mark.parametrize("routing_key", [True, False], ids=["routing-key", "no-routing-key"])
async def test_gateway_double_process_serves_the_session_api(routing_key: bool) -> None:
    wires = [("anthropic", True), ("chat", False)]
    sids = [session_id(w, s) for w, s in wires]
    engine = start_logged_engine(sids)
    command = [sys.executable, "-m", "tests.gateway_double", "--engine", engine.url, "--listen", "127.0.0.1:0"]
    process = await asyncio.create_subprocess_exec(
        *command,
        *([] if routing_key else ["--no-routing-key"]),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
        assert line.startswith("gateway double listening on http://127.0.0.1:"), line
        url = line.split()[4]
        script = client_script(wires)
        with_finish = msgspec.structs.replace(
            script,
            sessions=tuple(msgspec.structs.replace(s, steps=(*s.steps, Step(finish=0.5))) for s in script.sessions),
        )
        results = await run_script(with_finish, url)
        # The chat client echoes without reasoning: each later prompt does not extend the double's held tokens,
        # so its simple linearization forks at every turn.
        assert [(r.error, r.samples) for r in results] == [(None, 1), (None, len(TURNS))]
        keys = {g.routing_key for g in engine.generations}
        assert keys == (set(sids) if routing_key else {None})
    finally:
        process.terminate()
        code = await asyncio.wait_for(process.wait(), 30)
        engine.server.stop()
    assert code == 0
    assert (await process.stderr.read()).decode() == ""
