"""Gateways around an MoE engine that serves expert routes (issue 46, point 5): the committed recordings made with
the fake engine started as `--enable-return-routed-experts` with `moe: 2,2,8` (`cassettes/targets/moe_*.tito`,
`slime_moe.tito`, `miles_moe.tito`), what reaches each gateway's samples, and their replays through the gateway
where it is installed (skipped, saying why, where it is not). The audit needs no gateway: it runs everywhere."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.target_support import slime_missing
from tito_rl.cassette.format.records import EngineRecord, SamplesRecord
from tito_rl.cassette.reader import CassetteReader
from tito_rl.replayer.audit.runner import CassetteAudit, audit_cassette

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "cassettes" / "targets"
SLIME = TARGETS / "slime_moe.tito"


def fired(result: CassetteAudit) -> dict[str, int]:
    return {r: res.total for r, res in result.findings.rules.items() if res.fired}


def legs(path: Path) -> tuple[list[EngineRecord], list[dict[str, Any]]]:
    with CassetteReader(path) as reader:
        records = list(reader.records())
    engine = [r for r in records if isinstance(r, EngineRecord)]
    samples = [s for r in records if isinstance(r, SamplesRecord) for s in r.samples]
    return engine, samples


def test_slimes_adapters_never_ask_the_moe_engine_for_routes() -> None:
    """slime's agent adapters (slime/agent/adapters/common.py) ask `/generate` for `return_logprob` only: the engine
    serves routes, no call asks, no answer carries them, and slime's samples have none; the audit names each call
    `routes-never-asked` (a trainer with routing replay on would refuse these samples, or train without R3)."""
    engine, samples = legs(SLIME)
    assert engine and all(not r.request.get("return_routed_experts") for r in engine)
    assert all("routed_experts" not in (r.response.get("meta_info") or {}) for r in engine)
    assert samples and all("rollout_routed_experts" not in s for s in samples)
    result = audit_cassette(SLIME)
    assert fired(result)["routes-never-asked"] == len(engine)
    assert not {"routes-missing", "routes-misaligned", "routes-differ", "routes-invalid"} & fired(result).keys()


@pytest.mark.skipif(slime_missing() is not None, reason=f"needs slime: {slime_missing()}")
def test_slime_moe_replays_through_slime() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", str(SLIME)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and "1 session(s): 1 ok, 0 failed" in run.stdout, run.stdout + run.stderr


VERIFIERS = TARGETS / "moe_verifiers.tito"


def test_no_route_reaches_verifiers_on_vllm_0_31s_generate_api() -> None:
    """verifiers 0.4.0 reads vLLM 0.31's `/inference/v1/generate` (the driver starts the engine as 0.31.0), whose
    answers carry no `routed_experts` though the engine serves them (the header says so): neither the engine leg
    nor verifiers' samples hold any, and no channel rule has anything to read."""
    with CassetteReader(VERIFIERS) as reader:
        assert (reader.header.extra or {}).get("engine_server_info") == {"enable_return_routed_experts": True}
    engine, samples = legs(VERIFIERS)
    assert engine and all(r.dialect == "vllm-generate" for r in engine)
    assert all("routed_experts" not in c for r in engine for c in r.response["choices"])
    assert samples and all("rollout_routed_experts" not in s for s in samples)
    assert not audit_cassette(VERIFIERS).findings.channels


def _verifiers_missing() -> str | None:
    from tito_rl.recorder.targets.base import TargetUnavailable
    from tito_rl.recorder.targets.own_python.envs import gateway_python

    try:
        gateway_python("verifiers")
    except TargetUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.skipif(_verifiers_missing() is not None, reason=f"needs verifiers: {_verifiers_missing()}")
def test_moe_verifiers_replays_through_verifiers() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", str(VERIFIERS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and "1 session(s): 1 ok, 0 failed" in run.stdout, run.stdout + run.stderr


def test_the_slime_moe_scenario_through_titos_adapter_carries_the_routes(tmp_path: Path) -> None:
    """The same client and MoE engine recorded through tito's adapter with `tito record` (its writer process
    included): tito asks, the sample holds a row per token but the last, and no channel rule fires. The fake serves
    no model folder, so `tito simulate` tells the adapter the shape it started the fake with (`moe: 2,2,8`): the
    samples are slime's `[len(tokens) - 1, 2, 2]`, the fake's own routes, the header keeps `[2, 2]` and no path of
    this run, and the replay splits the same way."""
    from tito_rl.fake_engine.channels.moe import MoeShape, routes
    from tito_rl.recorder.simulate import simulate
    from tito_rl.replayer.replay.cassette_replay import replay_cassette_async

    out = tmp_path / "slime_moe_through_tito.tito"
    simulate(TARGETS / "scenarios" / "slime_moe.yaml", out, target="tito", golden=False)
    engine, samples = legs(out)
    assert engine and all(r.request.get("return_routed_experts") for r in engine)
    assert samples and all(len(s["rollout_routed_experts"]) == len(s["tokens"]) - 1 for s in samples)
    for sample in samples:
        rows = np.asarray(sample["rollout_routed_experts"])
        assert rows.shape == (len(sample["tokens"]) - 1, 2, 2)
        assert np.array_equal(rows, routes(sample["tokens"], MoeShape(2, 2, 8))[:-1])
        assert "routes_layout" not in sample["metadata"]
    with CassetteReader(out) as reader:
        header = reader.header
    assert header.adapter["engine_routes_layout"] == [2, 2]
    assert str(tmp_path) not in json.dumps(header.to_dict(), default=str)
    [session] = asyncio.run(replay_cassette_async(out)).sessions
    assert session.ok and not session.differences, session.differences
    replayed = [s for finish in session.finishes for s in finish.samples]
    assert [np.asarray(s["rollout_routed_experts"]).shape for s in replayed] == [
        np.asarray(s["rollout_routed_experts"]).shape for s in samples
    ]
    rules = fired(audit_cassette(out))
    assert not {r for r in rules if r.startswith(("routes", "kept", "version", "stale"))}, rules


MILES = TARGETS / "miles_moe.tito"
MILES_CONFIG = TARGETS / "miles_moe.miles.yaml"  # TITO_MILES_CONFIG when it was recorded: routing replay on


def test_miles_asks_for_routes_with_routing_replay_and_they_reach_its_samples() -> None:
    """miles' session server with `use_rollout_routing_replay` asks every chat call for `return_routed_experts` and
    `return_meta_info` (no `routed_experts_start_len`: v1 without in-place pauses), reads the routes from the
    choice's `meta_info`, and each sample holds the last turn's rows over its whole sequence: exactly what the
    engine routed for every token but the last. The weight version comes once per merged turn; no kept set is
    asked or kept. The audit fires no channel rule; what it fires is the `reasoning-dropped` rollback (the chat echo
    drops `reasoning_content`: miles re-renders the session, and the first turn of `miles-moe-env` is never
    trained)."""
    from tito_rl.fake_engine.channels.moe import MoeShape, routes

    engine, samples = legs(MILES)
    assert len(engine) == 7 and all(r.dialect == "sglang-openai" for r in engine)
    for record in engine:
        request, response = record.request or {}, record.response or {}
        assert request.get("return_routed_experts") is True and request.get("return_meta_info") is True
        assert "routed_experts_start_len" not in request and "return_top_p_token_ids" not in str(request)
        meta = response["choices"][0]["meta_info"]
        assert meta["routed_experts"] and meta["weight_version"] == "7"
    shape = MoeShape.parse("2,2,8")
    merged_turns = []
    for sample in samples:
        rows = np.asarray(sample["rollout_routed_experts"])
        assert rows.shape == (len(sample["tokens"]) - 1, 2, 2)
        assert np.array_equal(rows, routes(sample["tokens"], shape)[:-1])
        assert "rollout_top_p_token_ids" not in sample
        merged_turns.append(sample["weight_versions"])
    assert sorted(merged_turns) == [["7"], ["7", "7"], ["7", "7", "7"]]
    result = audit_cassette(MILES)
    assert result.findings.channels  # the channel rules read it, and none fires
    assert set(fired(result)) == {"coverage", "never-trained", "prefix-break"}


def _miles_missing() -> str | None:
    from tito_rl.recorder.targets import miles
    from tito_rl.recorder.targets.base import TargetError
    from tito_rl.recorder.targets.own_python.envs import gateway_python

    try:
        miles.locate()
        gateway_python("miles")
    except TargetError as exc:  # TargetUnavailable included
        return str(exc)
    return None


def replay_miles(*args: str, config: Path | None = MILES_CONFIG) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TITO_MILES_CONFIG"}
    if config is not None:
        env["TITO_MILES_CONFIG"] = str(config)
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", str(MILES), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.mark.skipif(_miles_missing() is not None, reason=f"needs miles: {_miles_missing()}")
def test_miles_moe_replays_through_a_fresh_miles_session_server() -> None:
    run = replay_miles()
    assert run.returncode == 0 and "3 session(s): 3 ok, 0 failed" in run.stdout, run.stdout + run.stderr


@pytest.mark.slow
@pytest.mark.skipif(_miles_missing() is not None, reason=f"needs miles: {_miles_missing()}")
def test_miles_without_routing_replay_stops_asking_and_the_replay_names_the_field() -> None:
    run = replay_miles("--session", "miles-moe-files", config=None)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "engine request differs at return_routed_experts: recorded true, replayed '<absent>'" in run.stdout
