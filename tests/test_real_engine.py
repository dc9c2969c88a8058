"""The real vLLM as a test tool: its build and start commands (always), and, marked real_engine, the engine itself:
`tito check-engine` against it with and without its start flags, the committed contract answers re-recorded live
with no structural drift, seeded answers that repeat, and a model that rebuilds byte for byte.

The marked tests run only under `make test-real-engine` (TITO_REAL_ENGINE=1); elsewhere they skip saying so.
"""

from __future__ import annotations

import json
import subprocess
from argparse import Namespace
from pathlib import Path

import pytest

from tests.real_engine_support import RealEngines
from tito_rl.recorder.engine_contract.answers import load_recording
from tito_rl.recorder.engine_contract.check import check_engine, run
from tito_rl.recorder.engine_contract.exchange import send
from tito_rl.recorder.engine_contract.requests import BARE, FULL, TOOLS, vllm_requests
from tito_rl.recorder.engine_contract.runner import base_values, drift, record_live, served_model
from tito_rl.recorder.real_engine.build import weights_digest
from tito_rl.recorder.real_engine.paths import HOME_ENV, SERVED_MODEL_NAME, VLLM_VERSION, ReadyEngine, read_ready
from tito_rl.recorder.real_engine.server import (
    RealEngineError,
    RealVllmServer,
    StartFlags,
    server_command,
    shell_start_command,
)
from tito_rl.trajectory.tokens.tokenizer import default_tokenizer_dir, load_tokenizer

FULL_FLAGS = StartFlags(scale_out=True, tools=True, reasoning=True)
TOOLS_FLAGS = StartFlags(scale_out=True, tools=True, reasoning=False)
BARE_FLAGS = StartFlags(scale_out=False, tools=False, reasoning=False)


def no_drift(url: str, mode: str) -> list[str]:
    """The contract's requests of one start mode sent live, against the committed answers: structural drift."""
    committed = load_recording("vllm", VLLM_VERSION)
    live = load_recording("vllm", VLLM_VERSION)
    live.values = base_values(load_tokenizer(), *served_model(url))
    live.exchanges = record_live(url, [r for r in vllm_requests() if r.mode == mode], live.values)
    committed.exchanges = [e for e in committed.exchanges if e.request.mode == mode]
    assert committed.exchanges
    if "$stop_id" in live.values:  # seeded: the same third token as when the answers were recorded
        assert live.values["$stop_id"] == committed.values["$stop_id"]
    return drift(committed, live)


# ---- always: the commands and the READY file ----------------------------------------------------------------


def ready_at(home: Path) -> ReadyEngine:
    python = home / "venv" / "bin" / "python"
    model = home / "model"
    python.parent.mkdir(parents=True)
    python.write_text("")
    model.mkdir()
    (model / "config.json").write_text("{}")
    ready = ReadyEngine(
        python=str(python),
        model=str(model),
        served_model_name=SERVED_MODEL_NAME,
        vllm_version=VLLM_VERSION,
        model_sha256="0" * 64,
        env={},
        start_command="",
    )
    (home / "READY").write_text(ready.to_json())
    return ready


def test_start_flags_are_what_each_dialect_needs():
    assert StartFlags().arguments() == [
        "--enable-scale-out",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
    ]
    assert (
        FULL_FLAGS.arguments()[-2:] == ["--reasoning-parser", "qwen3"]
        and FULL_FLAGS.label() == "scale-out+tools+reasoning"
    )
    assert BARE_FLAGS.arguments() == [] and BARE_FLAGS.label() == "bare"


def test_the_server_command_runs_vllms_module_on_loopback(tmp_path):
    ready = ready_at(tmp_path)
    argv = server_command(ready, 8123, StartFlags(scale_out=True, tools=False))
    assert argv[:3] == [ready.python, "-m", "vllm.entrypoints.openai.api_server"]  # `vllm serve` needs `vllm`
    assert argv[argv.index("--served-model-name") + 1] == SERVED_MODEL_NAME
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8123"
    assert "--enable-scale-out" in argv and "--enable-auto-tool-choice" not in argv
    at = argv.index("--dtype")
    assert argv[at : at + 5] == ["--dtype", "float32", "--max-model-len", "8192", "--enforce-eager"]
    line = shell_start_command(ready.python, ready.model)
    assert line.startswith("env ") and "VLLM_CPU_KVCACHE_SPACE=1" in line and "HF_HUB_OFFLINE=1" in line


def test_ready_names_a_built_engine_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    assert read_ready() is None  # nothing built
    ready = ready_at(tmp_path)
    assert read_ready() == ready
    Path(ready.python).unlink()
    assert read_ready() is None  # READY naming a venv that is gone
    (tmp_path / "READY").write_text("not json")
    assert read_ready() is None


def test_an_unbuilt_engine_skips_in_one_line_and_cannot_start(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    with pytest.raises(pytest.skip.Exception) as skipped:
        RealEngines().get(FULL_FLAGS)
    assert str(skipped.value) == f"the real vLLM is not built in {tmp_path}: run `make real-engine`"
    with pytest.raises(RealEngineError, match="run `make real-engine`"):
        RealVllmServer(FULL_FLAGS)


def test_a_server_that_dies_while_starting_says_why_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    ready = ready_at(tmp_path)
    Path(ready.python).write_text("#!/bin/sh\necho 'ValueError: no such model' >&2\nexit 3\n")
    Path(ready.python).chmod(0o755)
    with pytest.raises(RealEngineError) as failed:
        RealVllmServer(FULL_FLAGS, start_timeout_s=30).start()
    message = str(failed.value)
    assert "\n" not in message and "exited with 3 while starting: ValueError: no such model" in message


# ---- the real engine (make test-real-engine) ----------------------------------------------------------------


@pytest.mark.real_engine
def test_check_engine_on_the_real_vllm_with_every_flag(real_engines):
    server = real_engines.get(FULL_FLAGS)
    report = check_engine(server.url)
    assert report.model == SERVED_MODEL_NAME
    assert report.faithful == ["vllm-generate", "vllm-openai"]
    checks = {c.route: c for c in report.checks}
    assert not checks["POST /generate"].served and checks["POST /generate"].status == 404
    assert all(not c.missing and not c.notes for c in report.checks if c.served)
    assert run(Namespace(url=server.url, json=False), say=lambda line: None) == 0


@pytest.mark.real_engine
def test_seeded_answers_repeat_and_agree_across_routes(real_engines):
    server = real_engines.get(FULL_FLAGS)
    prompt = list(load_tokenizer().encode("The capital of France is", add_special_tokens=False))
    params = {"max_tokens": 8, "seed": 11, "logprobs": 0}
    generate = [
        send(server.url, "POST", "/inference/v1/generate", {"token_ids": prompt, "sampling_params": params})
        for _ in range(2)
    ]
    completion = send(
        server.url,
        "POST",
        "/v1/completions",
        {"model": SERVED_MODEL_NAME, "prompt": prompt, "return_token_ids": True, **params},
    )
    ids = [a.body["choices"][0]["token_ids"] for a in generate]
    assert ids[0] == ids[1] == completion.body["choices"][0]["token_ids"] and len(ids[0]) == 8


@pytest.mark.real_engine
def test_no_drift_from_the_committed_answers_with_every_flag(real_engines):
    server = real_engines.get(FULL_FLAGS)
    assert no_drift(server.url, FULL) == []


@pytest.mark.real_engine
def test_no_drift_with_tools_and_no_reasoning_parser(real_engines):
    server = real_engines.get(TOOLS_FLAGS)
    assert no_drift(server.url, TOOLS) == []
    assert check_engine(server.url).faithful == ["vllm-generate", "vllm-openai"]


@pytest.mark.real_engine
def test_check_engine_on_the_real_vllm_without_its_flags(real_engines):
    server = real_engines.get(BARE_FLAGS)
    report = check_engine(server.url)
    checks = {c.route: c for c in report.checks}
    generate = checks["POST /inference/v1/generate"]
    assert (generate.status, generate.faithful) == (403, False)
    assert generate.missing == ["--enable-scale-out (vLLM serves /inference/v1/generate only with it)"]
    chat = checks["POST /v1/chat/completions"]
    assert chat.faithful and any("--enable-auto-tool-choice" in note for note in chat.notes)
    assert report.faithful == ["vllm-openai"]
    assert run(Namespace(url=server.url, json=False), say=lambda line: None) == 0


@pytest.mark.real_engine
def test_no_drift_from_the_committed_answers_without_flags(real_engines):
    server = real_engines.get(BARE_FLAGS)
    assert no_drift(server.url, BARE) == []


@pytest.mark.real_engine
def test_the_model_rebuilds_byte_for_byte_from_its_seed(tmp_path):
    ready = read_ready()
    if ready is None:
        pytest.skip("the real vLLM is not built: run `make real-engine`")
    script = Path(__file__).resolve().parent.parent / "recorder" / "real_engine" / "tiny_qwen3.py"
    seed = int((Path(ready.model) / ".tito-model-complete").read_text().split()[1])  # "seed N"
    subprocess.run(
        [ready.python, str(script), str(tmp_path), str(default_tokenizer_dir()), str(seed)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert weights_digest(tmp_path) == ready.model_sha256
    assert json.loads((tmp_path / "generation_config.json").read_text()) == {
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    }


def test_build_writes_ready_once_and_then_reuses_it(tmp_path, monkeypatch):
    """The build's bookkeeping with its two slow steps stood in for: READY names what was built, and a second build
    runs no step at all."""
    from tito_rl.recorder.real_engine import build

    steps: list[str] = []

    def venv(home: Path, quiet: bool) -> Path:
        steps.append("venv")
        python = home / "venv" / "bin" / "python"
        python.parent.mkdir(parents=True, exist_ok=True)
        python.write_text("")
        return python

    def model(home: Path, python: Path, seed: int, quiet: bool) -> Path:
        steps.append(f"model {seed}")
        folder = home / f"tiny-qwen3-seed{seed}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(b"weights")
        return folder

    monkeypatch.setattr(build, "ensure_venv", venv)
    monkeypatch.setattr(build, "ensure_model", model)
    ready = build.build(tmp_path, seed=5, quiet=True)
    assert steps == ["venv", "model 5"]
    assert read_ready(tmp_path) == ready and ready.model == str(tmp_path / "tiny-qwen3-seed5")
    assert ready.model_sha256 == weights_digest(tmp_path / "tiny-qwen3-seed5")
    assert ready.start_command.endswith("--enable-scale-out --enable-auto-tool-choice --tool-call-parser hermes")
    assert build.build(tmp_path, seed=5, quiet=True) == ready and steps == ["venv", "model 5"]
