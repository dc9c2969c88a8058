"""Gateways around an MoE engine that serves expert routes (issue 46, point 5): the committed recordings made with
the fake engine started as `--enable-return-routed-experts` with `moe: 2,2,8` (`cassettes/targets/moe_*.tito`,
`slime_moe.tito`), what reaches each gateway's samples, and their replays through the gateway where it is installed
(skipped, saying why, where it is not). The audit needs no gateway: it runs everywhere."""

from __future__ import annotations

import asyncio
import json
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
