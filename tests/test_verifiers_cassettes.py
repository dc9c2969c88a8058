"""The committed cassettes recorded around verifiers' interception server (`cassettes/targets/verifiers_*.tito`: the
scripted client and a real OpenAI-chat CLI against the fake engine in `vllm-generate`), replayed through a fresh
verifiers (0.4.0, in a Python of its own) with no engine: verified against their goldens, byte-identical twice, their
samples those of the live run, and failing, with the field named, when verifiers' engine request changes (the
rollout's sampling `temperature` set in `TITO_VERIFIERS_CONFIG`). Also the driver's settings file.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.replay_support import live_samples, replayed_twice
from tito_rl.cassette.format.records import EngineRecord, SessionStart
from tito_rl.cassette.reader import CassetteReader
from tito_rl.recorder.targets.base import TargetError, TargetOptions, TargetUnavailable
from tito_rl.recorder.targets.own_python import verifiers
from tito_rl.recorder.targets.own_python.envs import gateway_python

try:
    gateway_python("verifiers")
except TargetUnavailable as exc:
    pytest.skip(str(exc), allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "cassettes" / "targets"
CASSETTES = sorted(TARGETS.glob("verifiers_*.tito"))
MIXED = TARGETS / "verifiers_mixed.tito"


def run_tito(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != verifiers.CONFIG_ENV} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=full
    )


def test_the_corpus_has_the_scripted_and_both_cli_recordings() -> None:
    assert [p.stem for p in CASSETTES] == [
        "verifiers_mixed",
        "verifiers_opencode_tool_loop",
        "verifiers_qwen_tool_loop",
    ]
    for path in CASSETTES:
        assert path.with_suffix(".golden").is_file(), path
        assert (TARGETS / "scenarios" / f"{path.stem}.yaml").is_file(), path


@pytest.mark.parametrize("path", CASSETTES, ids=lambda p: p.stem)
def test_recorded_around_verifiers_on_vllm_generate_routed_by_session_id(path: Path) -> None:
    with CassetteReader(path) as reader:
        header, records = reader.header, list(reader.records())
    assert header.target["name"] == "verifiers" and header.target["version"] == "0.4.0"
    assert header.target["routing_header"] == "X-Session-ID"
    engine = [r for r in records if isinstance(r, EngineRecord)]
    sessions = {r.session for r in records if isinstance(r, SessionStart)}
    assert engine and {r.dialect for r in engine if r.path.endswith("/generate")} == {"vllm-generate"}
    generate = [r for r in engine if r.path == "/inference/v1/generate"]
    assert generate and all(r.request["sampling_params"]["logprobs"] == 1 and r.request["token_ids"] for r in generate)
    assert all(r.session in sessions for r in generate)


@pytest.mark.slow
def test_each_verifiers_cassette_replays_with_no_engine_twice_identical_with_the_live_samples(tmp_path: Path) -> None:
    replayed = replayed_twice(run_tito, CASSETTES, tmp_path)
    for rows in replayed.values():
        for row in rows:
            assert len(row["loss_mask"]) == row["response_length"] == len(row["rollout_log_probs"])
    live: dict[str, list[dict[str, Any]]] = {}
    for path in CASSETTES:
        live |= live_samples(path)
    assert replayed == live
    assert sum(len(v) for v in replayed.values()) >= 4


@pytest.mark.slow
def test_a_verifiers_whose_engine_request_changes_fails_the_replay_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "verifiers.yaml"
    config.write_text("sampling: {temperature: 0.5}\n")
    run = run_tito("replay", str(MIXED), env={verifiers.CONFIG_ENV: str(config)})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "engine request differs at sampling_params.temperature: recorded '<absent>', replayed 0.5" in run.stdout
    assert "POST /inference/v1/generate (vllm-generate)" in run.stdout


def test_the_settings_file_is_checked_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "vf.yaml"
    for text, why in (
        ("colour: red\n", "unknown field"),
        ("sampling: 3\n", "must be a mapping"),
        ("- a\n", "a mapping"),
    ):
        config.write_text(text)
        monkeypatch.setenv(verifiers.CONFIG_ENV, str(config))
        with pytest.raises(TargetError, match=why):
            verifiers.create(TargetOptions())
    config.write_text("sampling: {temperature: 0.7}\nrenderer: {name: qwen3, enable_thinking: false}\n")
    target = verifiers.create(TargetOptions())
    assert target.info.settings["sampling"] == {"temperature": 0.7}
    assert target.info.settings["renderer"] == {"name": "qwen3", "enable_thinking": False}


def test_a_python_that_is_not_there_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TITO_VERIFIERS_PYTHON", "/nonexistent/python")
    with pytest.raises(TargetError, match="TITO_VERIFIERS_PYTHON=/nonexistent/python is not an executable"):
        verifiers.create(TargetOptions())


def test_the_fake_engine_plays_the_vllm_release_verifiers_reads_wherever_it_is_recorded() -> None:
    """verifiers' generate client reads vLLM 0.31's logprob entries; its driver says so, and `tito simulate` (so
    `make corpus` and the live conformance run) starts the fake engine imitating that release for it, unless the
    caller named a release itself. Other targets get the fake engine's default."""
    from tito_rl.recorder.simulate import driver_engine_args

    around = ["--target", "verifiers", "--engine-dialect", "vllm-generate"]
    assert driver_engine_args(around) == ("--vllm-version", "0.31.0")
    assert driver_engine_args(around, ("--vllm-version", "0.32.0")) == ()
    assert driver_engine_args(["--target", "tito"]) == driver_engine_args([]) == ()
    assert driver_engine_args(["--target", "http://127.0.0.1:9"]) == driver_engine_args(["--target"]) == ()
    assert driver_engine_args(["--target", "no_such_module:create"]) == ()  # recording it says why
