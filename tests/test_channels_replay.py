"""A recording with channels replays with them: the replay asks what the recording asked (never the engine's
`/get_server_info`, which no recording holds), its samples equal the live ones channels included, the golden pins
them in compact lines, `--export-samples` writes them, `tito inspect` shows a token's route and version, and the
replay notices a route that changed. Recorded in-process through tito's adapter and the cassette writer, in front
of the SGLang double that serves the channels (`channel_support.ChannelEngine`)."""

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

from tests.channel_support import ChannelEngine, expected_rows, script, stack, tool_loop
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.recorder.taps.proxy import build_header
from tito_rl.replayer.comparison.differences import samples_difference
from tito_rl.replayer.inspection.gather import channel_tip
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.records import Sample

ROOT = Path(__file__).resolve().parent.parent


def tito(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ)
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    path = tmp_path_factory.mktemp("channels") / "routed.tito"
    engine = ChannelEngine(load_tokenizer(), script())

    async def main() -> list[dict[str, Any]]:
        manager = TrajectoryManager()
        writer = CassetteWriter(path, build_header(AdapterSettings(), None, {"client": "test"}, manager=manager))
        try:
            async with stack(engine, writer, manager) as url:
                return await tool_loop(url, "routed-session-token-0001", top_p=0.9)
        finally:
            writer.close()

    return path, asyncio.run(main())


def test_a_recording_with_channels_replays_with_them_and_the_golden_pins_them(
    recorded: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    path, [live] = recorded
    assert np.array_equal(
        np.asarray(live["rollout_routed_experts"]).reshape(len(live["tokens"]) - 1, -1), expected_rows(live["tokens"])
    )
    exported, live_file = tmp_path / "replayed.jsonl", tmp_path / "live.jsonl"
    run = tito(
        "replay",
        str(path),
        "--update-goldens",
        "--export-samples",
        str(exported),
        "--export-live-samples",
        str(live_file),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 ok" in run.stdout and "differs" not in run.stdout  # asked for routes and kept sets as recorded
    # The replayed samples, channels included, are the live ones byte for byte.
    assert exported.read_bytes() == live_file.read_bytes()
    [row] = [json.loads(line) for line in exported.read_text().splitlines()]
    assert row["rollout_routed_experts"] == live["rollout_routed_experts"]
    assert row["rollout_top_p_token_offsets"] == live["rollout_top_p_token_offsets"]
    assert row["weight_versions"] == ["v1", "v1", "v1"]
    text = path.with_suffix(".golden").read_text()
    n = len(live["tokens"]) - 1
    assert f"  routes   {n}x1x6 #" in text and "  versions v1 x3" in text and "tokens with kept sets" in text
    again = tito("replay", str(path))
    assert again.returncode == 0 and "1 ok" in again.stdout, again.stdout + again.stderr


def test_inspect_shows_a_tokens_route_and_version(recorded: tuple[Path, list[dict[str, Any]]], tmp_path: Path) -> None:
    path, _ = recorded
    page = tmp_path / "page.html"
    run = tito("inspect", str(path), "--html", str(page))
    assert run.returncode == 0, run.stdout + run.stderr
    html = page.read_text()
    assert "experts L0: " in html and "weight version v1" in html and "top-p kept set: 2 ids" in html
    assert "experts: no row (the sample&#x27;s last token was never forwarded)" in html
    text = tito("inspect", str(path))
    assert text.returncode == 0 and "routes   " in text.stdout and "versions v1 x3" in text.stdout


def test_a_changed_route_is_a_difference_and_a_recording_without_channels_is_not(
    recorded: tuple[Path, list[dict[str, Any]]],
) -> None:
    _, [live] = recorded
    changed = json.loads(json.dumps(live))
    changed["rollout_routed_experts"][5][0][2] += 1
    summary, detail, _ = samples_difference([live], [changed], lambda ids: str(ids)) or ("", [], None)
    assert summary == "sample 0: rollout_routed_experts differ" and "first difference at row 5" in detail[0]
    old = {k: v for k, v in live.items() if not k.startswith("rollout_routed") and k != "weight_versions"}
    old = {k: v for k, v in old.items() if not k.startswith("rollout_top_p")}
    assert samples_difference([old], [changed], str) is None  # recorded before channels: not compared
    assert samples_difference([old], [changed], str, channels_both_ways=True) is not None  # tito diff
    # The same ids split otherwise (a replay that knows the model's top_k where the recording did not) are equal.
    split = {
        **live,
        "rollout_routed_experts": [[row[0][:2], row[0][2:4], row[0][4:]] for row in live["rollout_routed_experts"]],
    }
    assert samples_difference([live], [split], str) is None


def test_the_tooltip_names_unknown_rows_and_says_nothing_without_channels() -> None:
    base: dict[str, Any] = {"tokens": [1, 2, 3], "response_length": 1, "loss_mask": [1], "rollout_log_probs": [0.0]}
    sample = Sample(**base, rollout_routed_experts=np.array([[[-1, -1]], [[4, 5]]], np.int16))
    assert channel_tip(sample, 0, None, False) == ["experts: unknown (no engine answer covered this token)"]
    assert channel_tip(sample, 1, None, False) == ["experts L0: 4,5"]
    assert channel_tip(Sample(**base), 1, 0, True) == []


def test_a_recording_from_before_kept_sets_replays_without_asking_for_them(tmp_path: Path) -> None:
    """An older cassette's header has no `engine_kept_sets`, and its adapter never asked for kept sets though the
    agent sampled with top_p < 1: the replay asks as it did, so its engine requests match."""
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    path = tmp_path / "old.tito"
    engine = ChannelEngine(load_tokenizer(), script(), serves_routes=False)

    async def main() -> None:
        manager = TrajectoryManager()
        settings = AdapterSettings(engine_kept_sets=False)
        header = build_header(settings, None, {"client": "test"}, manager=manager)
        del header.adapter["engine_kept_sets"], header.adapter["engine_routes"]
        writer = CassetteWriter(path, header)
        try:
            async with stack(engine, writer, manager, engine_kept_sets=False) as url:
                await tool_loop(url, "old-session-token-0001", top_p=0.9)
        finally:
            writer.close()

    asyncio.run(main())
    assert not any("custom_params" in r["sampling_params"] for r in engine.requests)
    for args in (["--update-goldens"], []):
        run = tito("replay", str(path), *args)
        assert run.returncode == 0 and "1 ok" in run.stdout, run.stdout + run.stderr
        assert "differs" not in run.stdout  # the replayed /generate asked what the recorded one asked
