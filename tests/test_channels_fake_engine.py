"""The three parts of issue 46 shown to agree on the real fake engine (`tito_rl.fake_engine`, started as
`--enable-return-routed-experts --moe 2,2,8`), not a double: a session recorded through tito's adapter with top_p < 1
carries the fake's own routes (`fake_engine/channels/moe.routes`), kept sets and versions into its samples, replays
green twice and audits clean; each of the fake's channel faults makes the audit name its rule, and the samples show
what a trainer would get from the adapter in front of such an engine."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from tests.channel_support import BASH
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.fake_engine.app import EngineOptions
from tito_rl.fake_engine.app import create_app as engine_app
from tito_rl.fake_engine.channels.moe import MoeShape, routes
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.recorder.taps.proxy import build_header, fetch_server_args
from tito_rl.replayer.audit.runner import AuditOptions, CassetteAudit, audit_cassette
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.app import create_app as adapter_app
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
SHAPE = MoeShape(2, 2, 8)
SID = "moe-session-token-0001"


def scenario(faults: dict[str, Any] | None = None, turn: int | None = None) -> dict[str, Any]:
    """Two tool calls then an answer; `faults` on every turn (the fake's faults are per turn), or on `turn` only."""
    turns: list[dict[str, Any]] = [
        {"reasoning": "List first.", "tool_calls": [{"name": "Bash", "arguments": {"command": "ls"}}]},
        {"tool_calls": [{"name": "Bash", "arguments": {"command": "ls | wc -l"}}]},
        {"text": "There are 3 files."},
    ]
    if faults:
        turns = [{**t, "faults": faults} if turn in (None, i) else t for i, t in enumerate(turns)]
    return {"name": "moe", "turns": turns}


async def _loop(url: str) -> tuple[list[int], list[dict[str, Any]]]:
    """The agent: three turns echoing the replies; the statuses it got, and the session's samples."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "List the files, then count them."},
    ]
    headers, statuses = {"Authorization": f"Bearer {SID}"}, []
    async with aiohttp.ClientSession() as http:
        for n in range(3):
            body = {"model": "tito", "messages": messages, "tools": [BASH], "top_p": 0.9}
            async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
                statuses.append(resp.status)
                if resp.status != 200:
                    break
                reply = (await resp.json())["choices"][0]["message"]
            messages = [*messages, reply]
            for call in reply.get("tool_calls") or ():
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"out {n}"})
        async with http.post(url + f"/tito/sessions/{SID}/finish", json={"reward": 1.0}) as resp:
            samples: list[dict[str, Any]] = (await resp.json())["samples"]
    return statuses, samples


def record(
    path: Path, faults: dict[str, Any] | None = None, turn: int | None = None
) -> tuple[list[int], list[dict[str, Any]]]:
    """One session through tito's adapter in front of the fake engine, recorded as `tito record` records it (the
    engine's routes flag kept in the header)."""
    tokenizer = load_tokenizer()

    async def main() -> tuple[list[int], list[dict[str, Any]]]:
        policy = ScriptedPolicy(parse_scenario(scenario(faults, turn)), tokenizer)
        options = EngineOptions(tokenizer=tokenizer, return_routed_experts=True, moe=SHAPE)
        engine = TestServer(engine_app(policy, options), host="127.0.0.1")
        await engine.start_server()
        engine_url = str(engine.make_url("")).rstrip("/")
        manager, settings = TrajectoryManager(), AdapterSettings(engine_url=engine_url)
        header = build_header(settings, None, {"client": "test"}, manager=manager)
        header.extra["engine_server_info"] = await fetch_server_args(engine_url)
        writer = CassetteWriter(path, header)
        adapter = TestServer(adapter_app(settings, manager, writer), host="127.0.0.1")
        await adapter.start_server()
        try:
            return await _loop(str(adapter.make_url("")).rstrip("/"))
        finally:
            await adapter.close()
            await engine.close()
            writer.close()

    return asyncio.run(main())


def tito(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ)
    )


def fired(result: CassetteAudit) -> dict[str, int]:
    return {r: res.total for r, res in result.findings.rules.items() if res.fired}


def test_a_session_on_the_moe_fake_engine_carries_its_routes_replays_twice_and_audits_clean(tmp_path: Path) -> None:
    path = tmp_path / "moe.tito"
    statuses, [sample] = record(path)
    assert statuses == [200, 200, 200]
    tokens = sample["tokens"]
    rows = np.asarray(sample["rollout_routed_experts"])
    # the fake's own router over the whole sample, every row but the last token's (never forwarded); flat rows
    # `[n, 1, layers * top_k]`: the adapter splits them by the model's config.json, which the fake has none of
    assert rows.shape == (len(tokens) - 1, 1, SHAPE.layers * SHAPE.top_k)
    assert np.array_equal(rows.reshape(-1), routes(tokens, SHAPE)[:-1].reshape(-1))
    offsets = sample["rollout_top_p_token_offsets"]
    assert len(offsets) == sample["response_length"] + 1 and offsets[-1] == len(sample["rollout_top_p_token_ids"])
    assert len(sample["weight_versions"]) == 3
    for args in (["--update-goldens"], [], []):
        run = tito("replay", str(path), *args)
        assert run.returncode == 0 and "1 ok" in run.stdout and "differs" not in run.stdout, run.stdout + run.stderr
    result = audit_cassette(path, options=AuditOptions(max_staleness=0))
    assert result.findings.channels and fired(result) == {} and result.coverage == 1.0


# What each fault does to a session through tito's adapter (what a trainer gets), and the rule that names it.
FAULTS: list[tuple[dict[str, Any], str, list[int], str]] = [
    # none sent though asked: three turns answered, samples without routes
    ({"routes_missing": True}, "routes-missing", [200, 200, 200], "no routes"),
    # every row from 0 though the adapter asked from its start: the adapter refuses the second turn (502)
    ({"routes_ignore_start": True}, "routes-misaligned", [200, 502], "refused"),
    # the previous turn's last token's row all expert 0: the adapter cannot tell, the sample trains on it
    ({"routes_dummy_row": True}, "routes-invalid", [200, 200, 200], "routes"),
    # a padding row of expert 0 for the never-forwarded token, and rows past the tokens: refused (502)
    ({"routes_zero_padding": True}, "routes-misaligned", [502], "refused"),
    ({"routes_extra_rows": 2}, "routes-misaligned", [502], "refused"),
]


@pytest.mark.parametrize(("faults", "rule", "statuses", "trainer"), FAULTS, ids=[next(iter(f)) for f, *_ in FAULTS])
def test_each_fake_engine_route_fault_is_named_by_its_audit_rule(
    faults: dict[str, Any], rule: str, statuses: list[int], trainer: str, tmp_path: Path
) -> None:
    path = tmp_path / "fault.tito"
    got, samples = record(path, faults)
    assert got == statuses
    result = audit_cassette(path, options=AuditOptions(max_staleness=0))
    assert rule in fired(result) and not fired(result).keys() - {rule, "coverage", "never-trained"}
    if trainer == "refused":  # the turn the engine answered wrongly is an error to the agent, never trained
        assert fired(result)["never-trained"] > 0
    elif trainer == "no routes":
        [sample] = samples
        assert "rollout_routed_experts" not in sample and "rollout_top_p_token_ids" in sample
    else:
        [sample] = samples
        flat = np.asarray(sample["rollout_routed_experts"]).reshape(len(sample["tokens"]) - 1, -1)
        # a first turn's row of its last prompt token, and each later turn's of the turn before's last token
        assert (flat == 0).all(axis=1).sum() == 3


def test_a_turn_answered_with_an_older_weight_version_is_stale_tokens(tmp_path: Path) -> None:
    """`stale_weight_version` on the second turn: the sample spans the current version and an older one, which the
    audit names under `--max-staleness 0`; the sample's versions say so too."""
    path = tmp_path / "stale.tito"
    statuses, [sample] = record(path, {"stale_weight_version": True}, turn=1)
    assert statuses == [200, 200, 200]
    assert sample["weight_versions"] == ["default", "default-stale", "default"]
    assert fired(audit_cassette(path, options=AuditOptions(max_staleness=0))) == {"stale-tokens": 1}
    assert fired(audit_cassette(path, options=AuditOptions(max_staleness=1))) == {}


def test_a_gateway_that_stops_asking_for_routes_fails_replay_naming_the_field(tmp_path: Path) -> None:
    """The same recording replayed by an adapter set not to ask for routes (`engine_routes: false`, as a gateway
    that dropped `return_routed_experts`): the replay compares the channels as it compares logprobs, so it fails,
    naming the engine request's field at its first call."""
    from tito_rl.cassette.reader import CassetteReader

    path, stopped = tmp_path / "moe.tito", tmp_path / "stopped.tito"
    record(path)
    with CassetteReader(path) as reader:
        header = reader.header
        header.adapter = {**header.adapter, "engine_routes": False}
        with CassetteWriter(stopped, header) as writer:
            for item in reader.records():
                writer.append_redacted(item)
    run = tito("replay", str(stopped))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "engine request differs: return_routed_experts" in run.stdout
    assert "return_routed_experts: recorded True, replayed False" in run.stdout
