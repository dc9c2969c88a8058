"""The built-in `miles` target around miles' real session server, against tito's fake engine in `sglang-openai`.

miles is not on PyPI and its server needs torch, ray and an sglang other than tito's pin (recorder/targets/miles.py
says why), so these tests need a miles checkout (`TITO_MILES_PATH`) and a Python with miles' requirements
(`TITO_MILES_PYTHON`, else the cached one `python -m tito_rl.recorder.targets.own_python.envs miles` makes over the
real SGLang); without either they are skipped with that reason. The checks that need neither (the driver missing,
its registration, its settings file, how its Python is made) always run.
"""

from __future__ import annotations

import asyncio
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
from tito_rl.recorder.targets.base import TargetError, TargetOptions, TargetUnavailable
from tito_rl.recorder.targets.own_python import envs
from tito_rl.recorder.targets.own_python.envs import gateway_python
from tito_rl.recorder.targets.registry import BUILTIN, available, create_driver
from tito_rl.trajectory.records import Sample

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "cassettes" / "targets" / "scenarios" / "rllm_mixed.yaml"  # chat wire, session in the URL


def miles_missing() -> str | None:
    """Why the miles target cannot run here (no checkout, no Python with its requirements), or None."""
    try:
        miles.locate()
        gateway_python("miles")
    except TargetError as exc:  # TargetUnavailable included
        return str(exc)
    return None


needs_miles = pytest.mark.skipif(miles_missing() is not None, reason=f"needs miles: {miles_missing()}")


def test_miles_is_built_in_and_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    assert "miles" in BUILTIN and "miles" in available()
    monkeypatch.delenv(miles.PATH_ENV, raising=False)
    with pytest.raises(TargetUnavailable) as caught:
        create_driver("miles", TargetOptions())
    assert "\n" not in str(caught.value) and miles.PATH_ENV in str(caught.value)


def test_the_settings_file_is_laid_over_miles_args_and_checked_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`TITO_MILES_CONFIG` names miles' own arguments (routing replay and the model's layer count for an MoE run);
    the keys the driver sets for the server itself are refused, and a bad file is one line."""
    config = tmp_path / "miles.yaml"
    monkeypatch.setenv(miles.CONFIG_ENV, str(config))
    for text, why in (
        ("hf_checkpoint: /elsewhere\n", "hf_checkpoint set by tito's driver"),
        ("- a\n", "expected a mapping"),
        ("a: [\n", "while parsing"),
    ):
        config.write_text(text)
        with pytest.raises(TargetError, match=why) as caught:
            miles.config_file()
        assert "\n" not in str(caught.value)
    config.write_text("use_rollout_routing_replay: true\nnum_layers: 48\nsession_message_matcher: loose_tool_call\n")
    args = miles.miles_args(TargetOptions())
    assert args["use_rollout_routing_replay"] is True and args["num_layers"] == 48
    assert args["session_message_matcher"] == "loose_tool_call" and args["use_session_server"] is True
    monkeypatch.delenv(miles.CONFIG_ENV)
    assert miles.miles_args(TargetOptions())["use_rollout_routing_replay"] is False  # miles' own default


def test_its_python_is_a_layer_over_the_real_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """miles' Python is made over the real SGLang's venv (torch, fastapi, transformers there already): its
    `.pth` names that venv's site-packages before pip runs, sglang 0.5.16 goes in without its dependencies, then
    ray and miles' transformers pin; where the real SGLang is not built it is said in one line and not made."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("TITO_MILES_PYTHON", raising=False)
    env = envs.ENVS["miles"]
    assert env.over_real_sglang and env.no_deps == ("sglang==0.5.16",)
    monkeypatch.setattr(envs, "real_sglang_python", lambda: None)
    assert envs.ensure("miles", quiet=True) is None and not env.folder.exists()
    with pytest.raises(TargetUnavailable, match="make real-sglang"):
        gateway_python("miles")

    site = tmp_path / "layer-site"
    steps: list[list[str]] = []

    def run(step: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        if step[1:] == ["-c", envs.SITE]:
            site.mkdir(exist_ok=True)
            return subprocess.CompletedProcess(step, 0, f"{site}\n", "")
        if step[1:3] == ["-m", "venv"]:
            Path(step[3]).mkdir(parents=True)
        if step[1:3] == ["-m", "pip"]:
            assert (site / "tito-real-sglang.pth").read_text() == f"{envs.real_sglang_site()}\n"
        steps.append(step)
        return subprocess.CompletedProcess(step, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)  # the module envs runs steps with
    assert envs._make(env, "/real-sglang/bin/python")
    pip = [s[s.index("--disable-pip-version-check") + 1 :] for s in steps if s[1:3] == ["-m", "pip"]]
    assert steps[0][:3] == ["/real-sglang/bin/python", "-m", "venv"]
    assert pip == [["--no-deps", "sglang==0.5.16"], ["ray==2.60.0", "transformers==5.12.1"]]
    assert "encoding_dsv4" in steps[-1][-1]
    assert env.stamp.read_text() == env.stamp_text and str(envs.real_sglang_site()) in env.stamp_text


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
