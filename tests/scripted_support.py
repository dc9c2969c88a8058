"""Recording a scenario in-process: the fake engine and the recording proxy app on loopback, the scripted
client against the proxy, the cassette written by an in-process writer, then read back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from tests.cassette_helpers import serve
from tito_rl.cassette.format.records import AgentRecord, EngineRecord
from tito_rl.cassette.reader import Cassette, SessionLog, read_cassette
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.fake_engine.app import EngineOptions
from tito_rl.fake_engine.app import create_app as create_engine
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, load_scenario, parse_scenario
from tito_rl.recorder.scripted.client import SessionResult, run_script
from tito_rl.recorder.scripted.script import load_client_script, parse_client_script
from tito_rl.recorder.taps.proxy import build_header, create_recording_app
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.serve import learn_served_model
from tito_rl.trajectory.adapters.session import session_digest
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "cassettes" / "scenarios"


async def record_scenario(
    scenario: Path | dict[str, Any], out: Path, engine: EngineOptions | None = None, **settings: Any
) -> tuple[Cassette, list[SessionResult]]:
    """A corpus scenario file or an inline one (both sides); `client.record_args` only knows
    --no-preserve-reasoning here. `settings`: more `AdapterSettings` (`engine_dialect`...); `engine`: the fake
    engine's options (its tokenizer is set here). The served model is asked of the engine first, as `tito record`
    does for a vLLM dialect."""
    if isinstance(scenario, Path):
        engine_script, client = load_scenario(scenario), load_client_script(scenario)
    else:
        engine_script, client = parse_scenario(scenario), parse_client_script(scenario["client"])
    tokenizer = load_tokenizer()
    adapter = AdapterSettings(preserve_reasoning="--no-preserve-reasoning" not in client.record_args, **settings)
    options = dataclasses.replace(engine or EngineOptions(), tokenizer=tokenizer)
    async with serve(create_engine(ScriptedPolicy(engine_script, tokenizer), options)) as engine_url:
        learned = dataclasses.replace(adapter, engine_url=engine_url)
        assert await learn_served_model(learned) is None
        adapter.engine_model, adapter.context_length = learned.engine_model, learned.context_length
        # as `tito record` writes it (with the default engine URL: a header that does not change from run to run)
        writer = CassetteWriter(out, build_header(adapter, None, {"client": "scripted"}))
        adapter.engine_url = engine_url
        async with serve(create_recording_app(adapter, writer)) as url:
            results = await run_script(client, url)
    return read_cassette(out), results


def session_log(cassette: Cassette, session_id: str) -> SessionLog:
    return cassette.sessions[session_digest(session_id)]


def generations(log: SessionLog) -> list[EngineRecord]:
    return [e for e in log.engine if e.path.endswith("/generate")]


def bodies(log: SessionLog) -> list[dict[str, Any]]:
    return [json.loads(a.body) for a in log.agent]


def statuses(log: SessionLog) -> list[int]:
    return [a.status for a in log.agent]


def trained_tokens(log: SessionLog) -> int:
    return sum(sum(s["loss_mask"]) for s in log.samples)


def output_tokens(records: list[EngineRecord]) -> int:
    return sum(len(e.response["output_ids"]) for e in records)


def side_flags(log: SessionLog) -> list[bool]:
    return [a.side for a in log.agent]


def agent(log: SessionLog, status: int) -> list[AgentRecord]:
    return [a for a in log.agent if a.status == status]
