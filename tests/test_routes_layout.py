"""How SGLang's flat route rows split into layers x top_k (issue 46): learned from the engine, not from the tokenizer
folder by luck. SGLang states the split in no answer: it sizes a row from the served model's config.json
(`num_hidden_layers` x `num_experts_per_tok`) and its `/get_server_info` names that model's folder (`model_path`).

With tito's embedded tokenizer (no config.json) in front of the real fake engine started with `--moe 3,2,8` and a
`--model-path` folder whose config.json states that shape, the samples hold `[n, 3, 2]`, equal to slime's layout of
the fake's own routes; `--routes-layout` wins over the engine and a bad one is refused in one line; the learned
layout is kept in the recording's header, so the cassette replays to the same `[n, 3, 2]` samples with the folder
gone; and where nothing says, the rows stay flat and the samples say so.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from tests.channel_support import BASH
from tito_rl.cassette.reader import read_cassette
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.fake_engine.app import EngineOptions
from tito_rl.fake_engine.app import create_app as engine_app
from tito_rl.fake_engine.channels.moe import MoeShape, config_shape, routes
from tito_rl.fake_engine.cli import model_moe
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.recorder.scenario_file import record_args_problem
from tito_rl.recorder.taps.proxy import build_header
from tito_rl.replayer.replay.cassette_replay import replay_cassette_async
from tito_rl.replayer.replay.loading import settings_problem
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.app import create_app as adapter_app
from tito_rl.trajectory.adapters.engine.routes_layout import engine_layout, parse_routes_layout
from tito_rl.trajectory.adapters.serve import learn_routes_layout
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
REAL_ANSWERS = ROOT / "recorder" / "engine_contract" / "answers" / "sglang-0.5.23.json"
SHAPE = MoeShape(3, 2, 8)  # 6 ids a row: split 3 x 2, not 2 x 3 nor 1 x 6
SID = "layout-session-token-0001"
SCENARIO = {
    "name": "layout",
    "turns": [
        {"tool_calls": [{"name": "Bash", "arguments": {"command": "ls"}}]},
        {"text": "There are 3 files."},
    ],
}


def model_folder(root: Path, shape: MoeShape = SHAPE) -> Path:
    """A model folder as SGLang serves one: its config.json states the MoE shape (Qwen3-MoE's names)."""
    folder = root / "tiny-moe"
    folder.mkdir()
    config = {
        "model_type": "qwen3_moe",
        "architectures": ["Qwen3MoeForCausalLM"],
        "num_hidden_layers": shape.layers,
        "num_experts_per_tok": shape.top_k,
        "num_experts": shape.experts,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


async def _session(url: str) -> list[dict[str, Any]]:
    """Two turns echoing the reply, then the finish's samples."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "List the files."}]
    headers = {"Authorization": f"Bearer {SID}"}
    async with aiohttp.ClientSession() as http:
        for n in range(2):
            body = {"model": "tito", "messages": messages, "tools": [BASH]}
            async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                reply = (await resp.json())["choices"][0]["message"]
            messages = [*messages, reply]
            for call in reply.get("tool_calls") or ():
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"out {n}"})
        async with http.post(url + f"/tito/sessions/{SID}/finish", json={"reward": 1.0}) as resp:
            samples: list[dict[str, Any]] = (await resp.json())["samples"]
    return samples


def record(
    path: Path | None, model_path: str, learn_at_start: bool = True, **adapter: Any
) -> tuple[list[dict[str, Any]], AdapterSettings]:
    """One session through tito's adapter (embedded tokenizer: no config.json) in front of the fake engine serving
    `model_path` with routes, recorded to `path` as `tito record` records it: the layout learned before the header."""
    tokenizer = load_tokenizer()

    async def main() -> tuple[list[dict[str, Any]], AdapterSettings]:
        policy = ScriptedPolicy(parse_scenario(SCENARIO), tokenizer)
        options = EngineOptions(tokenizer=tokenizer, return_routed_experts=True, moe=SHAPE, model_path=model_path)
        engine = TestServer(engine_app(policy, options), host="127.0.0.1")
        await engine.start_server()
        manager = TrajectoryManager()
        settings = AdapterSettings(engine_url=str(engine.make_url("")).rstrip("/"), **adapter)
        if learn_at_start:
            await learn_routes_layout(settings)
        writer = (
            CassetteWriter(path, build_header(settings, None, {"client": "test"}, manager=manager)) if path else None
        )
        server = TestServer(adapter_app(settings, manager, writer), host="127.0.0.1")
        await server.start_server()
        try:
            return await _session(str(server.make_url("")).rstrip("/")), settings
        finally:
            await server.close()
            await engine.close()
            if writer is not None:
                writer.close()

    return asyncio.run(main())


def slime_layout(sample: dict[str, Any], shape: MoeShape = SHAPE) -> np.ndarray:
    """slime's `rollout_routed_experts` for the sample's tokens: `[len(tokens) - 1, layers, top_k]`, the fake's rows."""
    return routes(sample["tokens"], shape)[:-1]


def test_the_engines_model_folder_splits_the_rows_and_a_replay_keeps_the_split_without_it(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    path = tmp_path / "layout.tito"
    [sample], settings = record(path, str(folder))
    assert settings.engine_routes_layout == (3, 2)
    rows = np.asarray(sample["rollout_routed_experts"])
    assert rows.shape == (len(sample["tokens"]) - 1, 3, 2)
    assert np.array_equal(rows, slime_layout(sample))
    assert "routes_layout" not in sample["metadata"]
    assert read_cassette(path).header.adapter["engine_routes_layout"] == [3, 2]
    shutil.rmtree(folder)  # the replay reads the split from the header, not the folder
    result = asyncio.run(replay_cassette_async(path))
    [session] = result.sessions
    assert session.ok and not session.differences, session.differences
    [finish] = session.finishes
    [replayed] = finish.samples
    again = np.asarray(replayed["rollout_routed_experts"])
    assert again.shape == rows.shape and np.array_equal(again, rows)
    assert "routes_layout" not in replayed["metadata"]


def test_the_adapter_learns_the_split_with_the_routes_flag_when_not_told_at_start(tmp_path: Path) -> None:
    [sample], settings = record(None, str(model_folder(tmp_path)), learn_at_start=False)
    assert settings.engine_routes_layout is None  # learned by the engine client, from its /get_server_info
    assert np.array_equal(np.asarray(sample["rollout_routed_experts"]), slime_layout(sample))


def test_a_recording_whose_engine_was_not_up_at_start_replays_split_as_recorded(tmp_path: Path) -> None:
    """`tito record` started before its engine: the header is written with no layout, the adapter learns it before
    its first generation, and the recorded samples keep it. A replay (in process, and `tito replay` through its
    planner and a worker) splits as they do, with the model folder gone, and exports the live samples' bytes."""
    folder = model_folder(tmp_path)
    path = tmp_path / "late.tito"
    [sample], settings = record(path, str(folder), learn_at_start=False)
    assert settings.engine_routes_layout is None
    assert read_cassette(path).header.adapter["engine_routes_layout"] is None  # learned after the header
    rows = np.asarray(sample["rollout_routed_experts"])
    assert rows.shape == (len(sample["tokens"]) - 1, 3, 2) and np.array_equal(rows, slime_layout(sample))
    shutil.rmtree(folder)
    [session] = asyncio.run(replay_cassette_async(path)).sessions
    assert session.ok and not session.differences, session.differences
    [replayed] = session.finishes[0].samples
    assert np.array_equal(np.asarray(replayed["rollout_routed_experts"]), rows)
    assert "routes_layout" not in replayed["metadata"]
    exported, live = tmp_path / "replayed.jsonl", tmp_path / "live.jsonl"
    command = ["replay", str(path), "--update-goldens", "--export-samples", str(exported)]
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl", *command, "--export-live-samples", str(live)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    [row] = [json.loads(line) for line in exported.read_text().splitlines()]
    assert np.array_equal(np.asarray(row["rollout_routed_experts"]), rows)
    assert exported.read_bytes() == live.read_bytes()


def test_a_recording_kept_flat_replays_flat(tmp_path: Path) -> None:
    """Where the live samples kept the rows flat (nothing said the split), the replay reads no split from them."""
    path = tmp_path / "flat.tito"
    [sample], _ = record(path, "tito-test/not-a-cached-model", learn_at_start=False)
    assert sample["metadata"]["routes_layout"].startswith("flat:")
    [session] = asyncio.run(replay_cassette_async(path)).sessions
    assert session.ok and not session.differences, session.differences
    [replayed] = session.finishes[0].samples
    assert np.asarray(replayed["rollout_routed_experts"]).shape == (len(sample["tokens"]) - 1, 1, 6)
    assert replayed["metadata"]["routes_layout"] == sample["metadata"]["routes_layout"]


def test_the_option_wins_over_the_engine(tmp_path: Path) -> None:
    [sample], settings = record(None, str(model_folder(tmp_path)), engine_routes_layout=(2, 3))
    assert settings.engine_routes_layout == (2, 3)  # not relearned from the engine
    rows = np.asarray(sample["rollout_routed_experts"])
    assert rows.shape == (len(sample["tokens"]) - 1, 2, 3)
    assert np.array_equal(rows.reshape(len(rows), -1), slime_layout(sample).reshape(len(rows), -1))


def test_with_nothing_to_say_the_rows_stay_flat_and_the_sample_says_so(tmp_path: Path) -> None:
    # A Hub id this machine has not cached, and the embedded tokenizer has no config.json: nothing states the split.
    [sample], settings = record(None, "tito-test/not-a-cached-model")
    assert settings.engine_routes_layout is None
    rows = np.asarray(sample["rollout_routed_experts"])
    assert rows.shape == (len(sample["tokens"]) - 1, 1, 6)
    assert np.array_equal(rows.reshape(-1), slime_layout(sample).reshape(-1))
    assert sample["metadata"]["routes_layout"].startswith("flat: [tokens - 1, 1, 6]")


def test_the_engine_overrides_and_a_text_config_are_read_as_sglang_reads_them(tmp_path: Path) -> None:
    folder = model_folder(tmp_path)
    info = {"model_path": str(folder), "json_model_override_args": '{"num_experts_per_tok": 1}'}
    layout = engine_layout(info)
    assert layout is not None and (layout.layers, layout.top_k) == (3, 1)
    (folder / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 4, "num_experts_per_tok": 8}}))
    layout = engine_layout({"model_path": str(folder), "json_model_override_args": "{}"})
    assert layout is not None and (layout.layers, layout.top_k) == (4, 8)
    assert engine_layout({"model_path": str(tmp_path / "gone")}) is None and engine_layout({}) is None


def test_real_sglang_names_its_model_folder_and_the_fake_answers_the_same_keys(tmp_path: Path) -> None:
    """The keys tito reads are the real 0.5.23's (its recorded /get_server_info), and the fake answers them alike."""
    real = next(
        e["answer"]["body"]
        for e in json.loads(REAL_ANSWERS.read_text())["exchanges"]
        if e["path"] == "/get_server_info"
    )
    folder = str(model_folder(tmp_path))

    async def fake_info() -> dict[str, Any]:
        options = EngineOptions(tokenizer=None, return_routed_experts=True, moe=SHAPE, model_path=folder)
        server = TestServer(engine_app(ScriptedPolicy(parse_scenario(SCENARIO), load_tokenizer()), options))
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as http, http.get(str(server.make_url("/get_server_info"))) as resp:
                info: dict[str, Any] = await resp.json()
                return info
        finally:
            await server.close()

    fake = asyncio.run(fake_info())
    for key in ("model_path", "json_model_override_args", "enable_return_routed_experts"):
        assert type(fake[key]) is type(real[key]), key
    assert real["json_model_override_args"] == fake["json_model_override_args"] == "{}"
    assert fake["model_path"] == folder
    layout = engine_layout(fake)
    assert layout is not None and (layout.layers, layout.top_k) == (SHAPE.layers, SHAPE.top_k)


def test_the_fake_routes_as_its_model_folder_states_and_refuses_a_moe_that_disagrees(tmp_path: Path) -> None:
    folder = str(model_folder(tmp_path))
    assert config_shape(folder) == SHAPE and model_moe(folder, None) == SHAPE
    assert model_moe(folder, SHAPE) == SHAPE and model_moe(None, None) is None
    with pytest.raises(ValueError, match=r"--moe 2,2,8 disagrees with .*config.json, which states 3,2,8"):
        model_moe(folder, MoeShape(2, 2, 8))


@pytest.mark.parametrize("text", ["2", "a,b", "0,8", "2,2,8", "-1,2"])
def test_a_bad_layout_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(ValueError, match=r"expected LAYERS,TOP_K") as caught:
        parse_routes_layout(text)
    assert "\n" not in str(caught.value)
    assert "expected LAYERS,TOP_K" in (record_args_problem((f"--routes-layout={text}",)) or "")
    assert parse_routes_layout(" 48, 8") == (48, 8)


def test_the_commands_refuse_a_bad_layout_in_one_line(tmp_path: Path) -> None:
    for command in (["serve", "--engine", "http://127.0.0.1:9"], ["record", "--engine", "http://127.0.0.1:9"]):
        args = [*command, "--routes-layout", "8"] + (["--out", str(tmp_path / "x.tito")] if "record" in command else [])
        run = subprocess.run(
            [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ)
        )
        assert run.returncode == 2, run.stderr
        expected = f"tito {command[0]}: --routes-layout '8': expected LAYERS,TOP_K (two positive integers, e.g. 48,8)"
        assert run.stderr.strip() == expected, run.stderr


def test_a_header_with_a_bad_layout_is_unusable_input(tmp_path: Path) -> None:
    header = build_header(AdapterSettings(), None)
    assert settings_problem(header) is None
    header.adapter["engine_routes_layout"] = [3, 0]
    assert (settings_problem(header) or "").startswith("adapter.engine_routes_layout [3, 0]: expected LAYERS,TOP_K")


def test_simulate_tells_titos_adapter_the_shape_it_starts_the_fake_with(tmp_path: Path) -> None:
    """`tito simulate`'s fake names no model folder, so the simulator passes the shape it starts the fake with (its
    flags, else the scenario's `moe:`, else the model folder's config, else the fake's default) to tito's adapter in
    SGLang's dialect; never to another gateway, a vLLM dialect (its routes come shaped), over the user's own flag,
    or for a fake that serves no routes. (`tests/test_target_moe.py` records and replays it end to end.)"""
    from tito_rl.recorder.simulate import with_routes_layout

    scenario = ROOT / "cassettes" / "targets" / "scenarios" / "slime_moe.yaml"
    routed = ("--enable-return-routed-experts",)
    assert with_routes_layout(["--target", "tito"], scenario, MoeShape(2, 2, 8), routed) == [
        "--target",
        "tito",
        "--routes-layout",
        "2,2",
    ]
    assert with_routes_layout([], scenario, MoeShape(2, 2, 8), (*routed, "--moe", "4,8,64")) == [
        "--routes-layout",
        "4,8",
    ]
    assert with_routes_layout([], scenario, None, routed) == ["--routes-layout", "2,2"]  # the fake's default
    folder = str(model_folder(tmp_path))
    assert with_routes_layout([], scenario, None, (*routed, "--model-path", folder)) == ["--routes-layout", "3,2"]
    for unchanged, moe, engine in (
        (["--target", "slime"], SHAPE, routed),
        (["--engine-dialect", "vllm-generate"], SHAPE, routed),
        (["--routes-layout", "6,1"], SHAPE, routed),
        (["--routes-layout=6,1"], SHAPE, routed),
        ([], SHAPE, ()),  # the fake serves no routes: nothing to split
    ):
        assert with_routes_layout(unchanged, scenario, moe, engine) == unchanged
