"""Replay speed: a 40-turn, ~150k-token session against the adapter alone, and a 100-session corpus in pytest.

The long session is recorded here, through the real adapter app and the scripted fake engine with the real
Qwen3 tokenizer: 40 turns whose tool results grow the prompt to about 150k tokens. Then, in this process:
- replay: `tito replay`'s work (read the cassette, replay through the adapter app and manager with every
  engine request, reply and sample compared, and the golden rendered and checked);
- adapter-only, the baseline: the same agent requests pushed through the same adapter app and manager (Unix
  socket, same settings), the engine answered from a list in order, with no matching, comparing or goldens.
Both run after a warm-up, best of 3. The corpus (100 sessions in 10 cassettes) is replayed by pytest with the
plugin, `-n 1` then `-n 2`, printed as sessions per second. The last line is the figure:
`replay: X s, adapter-only: Y s, overhead: X/Y` (goal: at most 1.3).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402
from aiohttp import web  # noqa: E402

from tests.replay_support import Live, record, tool_loop, tool_loop_scenario  # noqa: E402
from tito_rl.replayer.goldens import files as goldens  # noqa: E402
from tito_rl.replayer.replay.agent_leg import request_headers, request_target  # noqa: E402
from tito_rl.replayer.replay.cassette_replay import replay_loaded, run_sync  # noqa: E402
from tito_rl.replayer.replay.loading import adapter_settings, load_cassette  # noqa: E402
from tito_rl.replayer.replay.options import ReplayOptions  # noqa: E402
from tito_rl.trajectory.adapters.app import create_app  # noqa: E402
from tito_rl.trajectory.adapters.engine.transport import EngineAnswer  # noqa: E402
from tito_rl.trajectory.golden import TokenizerNames  # noqa: E402
from tito_rl.trajectory.manager import TrajectoryManager  # noqa: E402
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer  # noqa: E402

TURNS = 40
CONTEXT = 262_144
LINE = "src/module_{i}/handler_{j}.py:{k}: def handle_{j}(request, context): return process(request, {k})\n"
CORPUS_CASSETTES, CORPUS_SESSIONS = 10, 10


def tool_output(turn: int, lines: int = 110) -> str:
    return "".join(LINE.format(i=turn, j=j, k=(turn * 7919 + j * 104729) % 997) for j in range(lines))


def record_long_session(path: Path) -> int:
    async def drive(live: Live) -> None:
        c = live.conversation("bench-long-session-0001")
        reply = await c.turn("Find every handler and summarise what they do.")
        turn = 0
        while c.tool_results(reply, tool_output(turn)):
            reply = await c.turn()
            turn += 1
        await live.finish("bench-long-session-0001", 1.0)

    record(path, tool_loop_scenario(TURNS), drive, engine_options={"context_length": CONTEXT}, context_length=CONTEXT)
    cassette, _ = load_cassette(path)
    (log,) = cassette.sessions.values()
    return max(len(e.request["input_ids"]) for e in log.engine)


def replay_once(path: Path, names: TokenizerNames) -> float:
    started = time.perf_counter()
    cassette, tokenizer = load_cassette(path)
    result = run_sync(replay_loaded(cassette, str(path), tokenizer, None, ReplayOptions()))
    goldens.check(result, result.all_sessions, names)
    assert result.ok, [s.differences or s.golden for s in result.sessions]
    return time.perf_counter() - started


class InOrder:
    """The baseline's engine: recorded answers in order, nothing checked."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = deque(answers)

    async def send(self, method: str, url: str, body: Any, headers: dict[str, str]) -> EngineAnswer:
        record = self.answers.popleft()
        return EngineAnswer(record.status, record.response)

    async def close(self) -> None:
        pass


async def adapter_only(path: Path) -> float:
    """From the cassette read to the finish answered, as `replay_once`; only the checks are left out."""
    started = time.perf_counter()
    cassette, tokenizer = load_cassette(path)
    (log,) = cassette.sessions.values()
    settings = adapter_settings(cassette.header, tokenizer, {})
    manager = TrajectoryManager(**cassette.header.adapter.get("manager", {}))
    app = create_app(settings, manager, None, InOrder(log.engine))
    folder = tempfile.mkdtemp(prefix="tito-bench-")
    socket = os.path.join(folder, "adapter.sock")
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, socket).start()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket, force_close=True)) as http:
            for i, agent in enumerate(log.agent):
                async with http.request(
                    agent.method,
                    "http://bench" + request_target(agent),
                    data=agent.body,
                    headers=request_headers(agent, log.source, log.name, i),
                ) as resp:
                    await resp.read()
            async with http.post(f"http://bench/tito/sessions/{log.name}/finish", json={"reward": 1.0}) as resp:
                await resp.read()
    finally:
        await runner.cleanup()
    return time.perf_counter() - started


def steal_fraction(before: list[int], after: list[int]) -> float:
    total = sum(after) - sum(before)
    return (after[7] - before[7]) / total if total else 0.0


def cpu_times() -> list[int]:
    return [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]


def build_corpus(folder: Path) -> None:
    cassettes = folder / "cassettes"
    cassettes.mkdir(parents=True)
    (folder / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    for c in range(CORPUS_CASSETTES):
        sids = [f"bench-corpus-{c:02d}-{s:02d}" for s in range(CORPUS_SESSIONS)]

        async def drive(live: Live, sids: list[str] = sids) -> None:
            await asyncio.gather(*(tool_loop(live.conversation(sid)) for sid in sids))
            for sid in sids:
                await live.finish(sid, 1.0)

        record(cassettes / f"corpus_{c:02d}.tito", tool_loop_scenario(4), drive)
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--update-goldens"],
        cwd=folder,
        check=True,
        capture_output=True,
    )


def corpus_rate(folder: Path, workers: int) -> float:
    started = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers)],
        cwd=folder,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - started
    assert run.returncode == 0, run.stdout[-2000:]
    return CORPUS_CASSETTES * CORPUS_SESSIONS / elapsed


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tito-bench-replay-") as tmp:
        root = Path(tmp)
        build_corpus(root / "corpus")
        n1, n2 = corpus_rate(root / "corpus", 1), corpus_rate(root / "corpus", 2)
        sessions = CORPUS_CASSETTES * CORPUS_SESSIONS
        print(
            f"corpus: {sessions} sessions in {CORPUS_CASSETTES} cassettes: {n1:.1f} sessions/s with -n 1, "
            f"{n2:.1f} sessions/s with -n 2 (pytest start-up and per-worker loading included)"
        )

        path = root / "long.tito"
        prompt = record_long_session(path)
        names = TokenizerNames(load_tokenizer())
        write_golden(path, names)
        replay_once(path, names)  # warm-up: every lazy load paid
        asyncio.run(adapter_only(path))
        before = cpu_times()
        replayed = min(replay_once(path, names) for _ in range(3))
        baseline = min(asyncio.run(adapter_only(path)) for _ in range(3))
        steal = steal_fraction(before, cpu_times())
        print(
            f"long session: {TURNS} turns, last prompt {prompt} tokens, {path.stat().st_size} cassette bytes; "
            f"host steal during the timed runs: {steal:.1%}"
        )
        print(f"replay: {replayed:.2f} s, adapter-only: {baseline:.2f} s, overhead: {replayed / baseline:.2f}")


def write_golden(path: Path, names: TokenizerNames) -> None:
    cassette, tokenizer = load_cassette(path)
    result = run_sync(replay_loaded(cassette, str(path), tokenizer, None, ReplayOptions(strict=False)))
    goldens.check(result, result.all_sessions, names, update=True)


if __name__ == "__main__":
    main()
