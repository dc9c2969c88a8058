"""The built-in `miles` target around miles' real session server, against tito's fake engine in `sglang-openai`.

miles is not on PyPI and its server needs torch, ray and an sglang other than tito's pin (recorder/targets/miles.py
says why), so these tests need a miles checkout (`TITO_MILES_PATH`) and a Python with miles' requirements
(`TITO_MILES_PYTHON`, default this one); without the checkout they are skipped with that reason. The checks that
need neither (the driver missing, its registration) always run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.process_helpers import free_port, wait_http
from tito_rl.recorder.processes import stop as stop_process
from tito_rl.recorder.targets import miles
from tito_rl.recorder.targets.base import TargetOptions, TargetUnavailable
from tito_rl.recorder.targets.registry import BUILTIN, available, create_driver
from tito_rl.trajectory.records import Sample

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "cassettes" / "targets" / "scenarios" / "rllm_mixed.yaml"  # chat wire, session in the URL
needs_miles = pytest.mark.skipif(
    not os.environ.get(miles.PATH_ENV), reason=f"{miles.PATH_ENV} is not set (a miles checkout; see docs/targets.md)"
)


def test_miles_is_built_in_and_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "miles" in BUILTIN and "miles" in available()
    monkeypatch.delenv(miles.PATH_ENV, raising=False)
    with pytest.raises(TargetUnavailable) as caught:
        create_driver("miles", TargetOptions())
    assert "\n" not in str(caught.value) and miles.PATH_ENV in str(caught.value)


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tito_rl",
            "fake-engine",
            "--demo",
            "--port",
            str(port),
            "--openai-dialect",
            "sglang-openai",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", proc)
        yield url
    finally:
        stop_process(proc)


async def two_turns(engine_url: str, echo_reasoning: bool) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    driver = create_driver("miles", TargetOptions())
    url = await driver.start(engine_url)
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": "hi there"}]
        async with aiohttp.ClientSession() as http:
            for _ in range(2):
                body = {"model": "m", "messages": messages}
                async with http.post(
                    f"{url}/sessions/s-1/v1/chat/completions", json=body, headers={"Authorization": "Bearer s-1"}
                ) as response:
                    assert response.status == 200, await response.text()
                    message = (await response.json())["choices"][0]["message"]
                echoed = message if echo_reasoning else {"role": "assistant", "content": message["content"]}
                messages += [echoed, {"role": "user", "content": "again"}]
        finished = await driver.finish("s-1", 0.5)
        assert (await driver.finish("unknown", 1.0)).samples == []
        return finished.samples, finished.stats
    finally:
        await driver.stop()


@needs_miles
def test_a_two_turn_session_is_one_merged_sample(engine: str) -> None:
    samples, stats = asyncio.run(two_turns(engine, echo_reasoning=True))
    assert len(samples) == 1 and stats["turns"] == 2 and stats["merges"] == 1 and stats["untrained_turns"] == 0
    sample = Sample.from_dict(samples[0])
    assert sample.reward == 0.5 and sample.metadata["status"] == "completed" and "lifecycle" not in sample.metadata
    mask = sample.loss_mask
    # both outputs trained, the second user turn between them masked: [1.. 0.. 1..]
    first_gap = mask.index(0)
    assert all(mask[:first_gap]) and first_gap > 0 and any(mask[first_gap:]) and mask[-1] == 1
    assert all(lp <= 0 for lp in sample.rollout_log_probs)


@needs_miles
def test_an_echo_without_reasoning_rolls_the_session_back_and_drops_the_first_turn(engine: str) -> None:
    """miles' strict matcher compares `reasoning_content`; a client that drops it on echo (most do) makes miles
    roll the session back to empty, so only the last turn is trained."""
    samples, stats = asyncio.run(two_turns(engine, echo_reasoning=False))
    assert len(samples) == 1 and stats["turns"] == 2 and stats["discarded_turns"] == 1
    assert stats["untrained_turns"] == 1 and all(samples[0]["loss_mask"])


@needs_miles
def test_simulate_through_miles_then_replay_with_no_engine(tmp_path: Path) -> None:
    out = tmp_path / "miles_mixed.tito"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tito_rl",
            "simulate",
            "--scenario",
            str(SCENARIO),
            "--out",
            str(out),
            "--target",
            "miles",
            "--engine-dialect",
            "sglang-openai",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "rllm-json-drop: ok" in run.stderr + run.stdout
    replay = subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert replay.returncode == 0, replay.stdout[-3000:] + replay.stderr[-3000:]
    assert "4 ok, 0 failed" in replay.stdout
