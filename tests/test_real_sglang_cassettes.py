"""The cassettes recorded live against the real SGLang (`cassettes/real_sglang/`: sglang 0.5.23 on the CPU with the
tiny random models of `make real-sglang`, each server started with `--random-seed 7`): the scripted client through
tito's adapter in SGLang's `/generate` dialect in front of the dense Qwen3, the same in front of the Qwen3-MoE started
with `--enable-return-routed-experts` (the samples carry its routes), and around slime's adapters.

In `make test`, with no engine: each replays clean (exit 0) to its golden, the replay's samples equal to the live
ones (the MoE's routes included), every generation a `/generate` with token ids in and out, and the audits of the
tito-target ones fire nothing. slime's replays only where slime is importable (`TITO_SLIME_PATH`), skipped otherwise.
Marked `real_engine` (`make test-real-sglang`): a fresh seeded server recording the same scenario again gives the
committed engine leg, and that recording replays to its live samples.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.target_support import slime_missing
from tito_rl.cassette.reader import read_cassette
from tito_rl.recorder.real_engine.sglang_cassettes import (
    REAL_SGLANG_CASSETTES,
    SGLANG_CASSETTES,
    SglangCassette,
    record_fresh,
)
from tito_rl.recorder.real_engine.sglang_paths import SERVED_NAMES
from tito_rl.replayer.audit.runner import audit_cassette
from tito_rl.replayer.comparison.differences import samples_difference
from tito_rl.replayer.replay.cassette_replay import replay_cassette_async
from tito_rl.trajectory.dialects.registry import is_generation, record_view

ROOT = Path(__file__).resolve().parent.parent
MAX_TOKENS = 12  # the scenarios' max_tokens: a random model never ends a turn, so every reply is cut there
LAYERS, TOP_K, EXPERTS = 2, 2, 8  # the tiny Qwen3-MoE of `make real-sglang`
# Values the engine or the adapter draws per call (ids, wall time, latencies): never compared.
VOLATILE_KEYS = frozenset({"id", "rid", "created", "request_id", "e2e_latency", "response_sent_to_client_ts"})
BY_NAME = {c.name: c for c in SGLANG_CASSETTES}
ROUTE_RULES = {"routes-never-asked", "routes-missing", "routes-misaligned", "routes-differ", "routes-invalid"}


def skip_without_target(cassette: SglangCassette) -> None:
    if cassette.needs_slime and slime_missing() is not None:
        pytest.skip(f"needs slime: {slime_missing()}")


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


def replayed_to_live_samples(path: Path) -> list[dict[str, Any]]:
    """Replays `path` with no engine (through the target it was recorded around); every session must be clean and
    each finish's replayed samples equal the live ones (token for token, routes too). Returns the samples."""
    result = asyncio.run(replay_cassette_async(path))
    samples = []
    for session in result.sessions:
        assert session.ok and not session.differences, (session.session, session.differences)
        assert session.finishes, session.session
        for finish in session.finishes:
            assert finish.live and samples_difference(finish.live, finish.samples, str) is None, session.session
            samples += finish.samples
    return samples


def routes_of(answer: dict[str, Any]) -> np.ndarray:
    """`meta_info.routed_experts`: base64 of raw little-endian int32, one flat row of layers x top_k per token, here
    in slime's layout `[rows, layers, top_k]` (layer-major, as SGLang's capturer fills a row)."""
    raw = base64.b64decode(answer["meta_info"]["routed_experts"])
    return np.frombuffer(raw, dtype="<i4").reshape(-1, LAYERS, TOP_K)


@pytest.mark.parametrize("name", BY_NAME)
def test_committed_cassette_replays_with_no_engine_to_its_live_samples(name: str) -> None:
    cassette = BY_NAME[name]
    skip_without_target(cassette)
    path = REAL_SGLANG_CASSETTES / f"{name}.tito"
    samples = replayed_to_live_samples(path)
    recorded = read_cassette(path)
    assert len(samples) == len(recorded.sessions) == (2 if cassette.needs_slime else 4)
    generations = [e for log in recorded.sessions.values() for e in log.engine if is_generation(e.path)]
    assert len(generations) == 2 * len(recorded.sessions)
    for call in generations:
        view = record_view(call)
        assert (call.status, call.path, call.dialect) == (200, "/generate", "sglang")
        assert view.prompt_ids and view.finish_reason == "length" and len(view.output_ids or []) == MAX_TOKENS
        assert view.logprobs is not None and len(view.logprobs) == MAX_TOKENS
    moe = cassette.start.moe
    assert all(bool(call.request.get("return_routed_experts")) == moe for call in generations)
    assert all(("routed_experts" in call.response["meta_info"]) == moe for call in generations)
    if not cassette.needs_slime:
        assert recorded.header.adapter["engine_dialect"] == "sglang"
        assert recorded.header.engine["served_model_name"] == SERVED_NAMES[cassette.start.kind]
    for sample in samples:
        routes = sample.get("rollout_routed_experts")
        if not moe:
            assert routes is None
            continue
        # The engine's rows are flat; the adapter split them as the model folder the real server names says
        # (`model_path`, learned at start, kept in the header): slime's `[tokens - 1, layers, top_k]`, no note.
        array = np.asarray(routes)
        assert array.shape == (len(sample["tokens"]) - 1, LAYERS, TOP_K)
        assert array.min() >= 0 and array.max() < EXPERTS  # every row known: no -1
        assert "routes_layout" not in sample["metadata"]
    if moe:
        assert recorded.header.adapter["engine_routes_layout"] == [LAYERS, TOP_K]


def test_the_moe_samples_routes_are_the_engine_answers_end_to_end() -> None:
    """Each session's sample routes are its turns' answers laid end to end: the first asked from row 0, each next
    one from where the rows known so far end (`routed_experts_start_len`), so together they cover every row once."""
    path = REAL_SGLANG_CASSETTES / "tito_sglang_moe.tito"
    recorded = read_cassette(path)
    result = asyncio.run(replay_cassette_async(path))
    assert len(result.sessions) == 4
    for session in result.sessions:
        [finish] = session.finishes
        [sample] = finish.samples
        calls = [e for e in recorded.sessions[session.session].engine if is_generation(e.path)]
        starts = [int(c.request["routed_experts_start_len"]) for c in calls]
        answers = [routes_of(c.response) for c in calls]
        assert starts == [0, len(answers[0])]
        assert np.array_equal(np.asarray(sample["rollout_routed_experts"]), np.concatenate(answers))


def test_tito_replay_exits_0_and_the_tito_target_audits_fire_nothing() -> None:
    paths = [REAL_SGLANG_CASSETTES / f"{c.name}.tito" for c in SGLANG_CASSETTES if not c.needs_slime]
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", *map(str, paths)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "8 session(s): 8 ok, 0 failed" in run.stdout
    for path in paths:
        audit = audit_cassette(path)
        assert not [rule for rule, result in audit.findings.rules.items() if result.fired], path.name
        assert audit.coverage == 1.0 and audit.emitted == 4 * 2 * MAX_TOKENS
    # The MoE's: routes were not asked for by a flag but learned from the engine, and the channel rules ran on them.
    assert paths[1].stem == "tito_sglang_moe" and read_cassette(paths[1]).header.adapter["engine_routes"] is None
    assert set(audit_cassette(paths[1]).findings.rules) >= ROUTE_RULES


@pytest.mark.real_engine
@pytest.mark.parametrize("name", BY_NAME)
def test_recording_again_from_a_fresh_seeded_start_gives_the_committed_engine_leg(name: str, tmp_path: Path) -> None:
    """One server start for this recording (the committed one had its own): the same seeded request sequence gives
    the same engine leg, routes included, and the recording replays to its live samples."""
    from tito_rl.recorder.real_engine import sglang_paths

    cassette = BY_NAME[name]
    skip_without_target(cassette)
    if sglang_paths.read_ready() is None:
        pytest.skip(f"the real SGLang is not built in {sglang_paths.real_sglang_home()}: run `make real-sglang`")
    again = tmp_path / "again.tito"
    record_fresh(cassette, again)
    leg = engine_leg(again)
    assert sum(len(calls) for calls in leg.values()) >= 2 * len(leg)
    assert leg == engine_leg(REAL_SGLANG_CASSETTES / f"{name}.tito")
    samples = replayed_to_live_samples(again)
    assert samples
    if cassette.start.moe and not cassette.needs_slime:
        # The split learned at start from the folder the real server names (`model_path`), kept in the header: the
        # replay (which reads no folder) splits each sample's rows as the live run did, slime's layout.
        assert read_cassette(again).header.adapter["engine_routes_layout"] == [LAYERS, TOP_K]
        for sample in samples:
            assert np.asarray(sample["rollout_routed_experts"]).shape == (len(sample["tokens"]) - 1, LAYERS, TOP_K)
            assert "routes_layout" not in sample["metadata"]


def test_the_audit_of_slime_before_the_real_sglang_shows_its_retokenized_random_output() -> None:
    """slime re-renders the history each turn: the random model's output re-tokenizes differently (or loses its
    leading space), so the next engine prompt breaks the prefix and slime realigns the first turn away, never
    training it; nothing is trained twice or with another logprob."""
    cassette = BY_NAME["slime_sglang"]
    skip_without_target(cassette)
    audit = audit_cassette(REAL_SGLANG_CASSETTES / f"{cassette.name}.tito")
    fired = {rule for rule, result in audit.findings.rules.items() if result.fired}
    assert fired == {"coverage", "never-trained", "prefix-break"}
    assert audit.emitted == 2 * 2 * MAX_TOKENS and audit.coverage == 0.5


def test_the_recorder_refuses_an_unknown_name_or_folder_in_one_line_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tito_rl.recorder.real_engine.sglang_cassettes import main

    assert main(["tito_sglang_nope", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        "real-sglang-cassettes: no cassette 'tito_sglang_nope'; known: tito_sglang_dense, tito_sglang_moe, "
        "slime_sglang\n"
    )
    assert main(["--out", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"real-sglang-cassettes: --out {tmp_path / 'missing'} is not a folder\n"
    assert list(tmp_path.iterdir()) == []
