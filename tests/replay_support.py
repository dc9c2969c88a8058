"""Recording small cassettes in-process for replay tests: adapter app + scripted fake engine + cassette writer
on loopback, and an Anthropic-wire conversation that echoes replies back the way Claude Code does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.cassette_helpers import serve
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.fake_engine.app import EngineOptions
from tito_rl.fake_engine.app import create_app as create_engine
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.recorder.scripted.script import ToolSpec
from tito_rl.recorder.scripted.wires import AnthropicWire, AssistantReply
from tito_rl.recorder.taps.proxy import build_header
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.app import create_app as create_adapter
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

SYSTEM = "You are a coding agent. Use the shell tool to inspect the repository."
SHELL = ToolSpec(
    "Bash",
    "Run a shell command",
    {
        "type": "object",
        "properties": {"description": {"type": "string"}, "command": {"type": "string"}},
        "required": ["command"],
    },
)
WIRE = AnthropicWire()


@dataclass
class Conversation:
    """One agent thread on the Anthropic wire, as Claude Code sends it (the scripted client's wire): its
    history grows with each echoed reply and tool result."""

    http: aiohttp.ClientSession
    url: str
    sid: str
    system: str = SYSTEM
    tools: tuple[ToolSpec, ...] = (SHELL,)
    messages: list[dict[str, Any]] = field(default_factory=list)
    stream: bool = False

    def body(self) -> bytes:
        data = WIRE.body("tito-test", self.system, self.tools, self.messages, 512, self.stream, self.sid)
        return json.dumps(data, separators=(",", ":")).encode()

    async def post(self, body: bytes | None = None, timeout_s: float | None = None) -> tuple[int, Any]:
        headers = {
            "Authorization": f"Bearer {self.sid}",
            "Content-Type": "application/json",
            "anthropic-version": "2023-06-01",
        }
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with self.http.post(
            self.url + WIRE.path, data=body or self.body(), headers=headers, timeout=timeout
        ) as resp:
            raw = await resp.read()
            return resp.status, (WIRE.parse(raw, self.stream) if resp.status == 200 else raw)

    async def turn(self, user: str | None = None) -> AssistantReply:
        """Send the next request (after a user message, or after tool results) and echo the reply."""
        if user is not None:
            self.messages.append(WIRE.user(user))
        status, reply = await self.post()
        assert status == 200, reply
        self.messages += reply.echo
        return reply

    def tool_results(self, reply: AssistantReply, output: str = "README.md\nsrc") -> bool:
        if reply.calls:
            self.messages += WIRE.tool_results(reply.calls, [output] * len(reply.calls))
        return bool(reply.calls)


@dataclass
class Live:
    """What the live run saw: per session, the samples its finish returned."""

    url: str
    http: aiohttp.ClientSession
    engine: web.Application  # the fake engine's app: a test waits on its requests (tests/fake_engine_helpers.py)
    manager: TrajectoryManager  # the adapter's: a test waits on its sessions' turns
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def conversation(self, sid: str, **kw: Any) -> Conversation:
        return Conversation(self.http, self.url, sid, **kw)

    async def finish(self, sid: str, reward: float) -> list[dict[str, Any]]:
        async with self.http.post(f"{self.url}/tito/sessions/{sid}/finish", json={"reward": reward}) as resp:
            assert resp.status == 200
            self.samples[sid] = (await resp.json())["samples"]
        return self.samples[sid]

    async def drop(self, sid: str) -> None:
        async with self.http.delete(f"{self.url}/tito/sessions/{sid}") as resp:
            assert resp.status == 200


@asynccontextmanager
async def recording(
    path: Path,
    scenario: dict[str, Any],
    engine_options: dict[str, Any] | None = None,
    manager: TrajectoryManager | None = None,
    **settings: Any,
) -> AsyncIterator[Live]:
    """A live stack that writes `path`: scripted fake engine, adapter app with the cassette writer's tap."""
    tokenizer = load_tokenizer()
    policy = ScriptedPolicy(parse_scenario(scenario), tokenizer)
    engine_app = create_engine(policy, EngineOptions(tokenizer=tokenizer, **(engine_options or {})))
    manager = manager or TrajectoryManager()
    async with serve(engine_app) as engine_url:
        adapter_settings = AdapterSettings(engine_url=engine_url, **settings)
        writer = CassetteWriter(path, build_header(adapter_settings, None, {"client": "test"}, manager=manager))
        try:
            async with serve(create_adapter(adapter_settings, manager, writer)) as url, aiohttp.ClientSession() as http:
                yield Live(url, http, engine_app, manager)
        finally:
            writer.close()


def record(
    path: Path, scenario: dict[str, Any], drive: Callable[[Live], Awaitable[None]], **kw: Any
) -> dict[str, list[dict[str, Any]]]:
    """Record `drive`'s traffic into `path`; returns the samples each finished session got live."""

    async def main() -> dict[str, list[dict[str, Any]]]:
        async with recording(path, scenario, **kw) as live:
            await drive(live)
            return live.samples

    return asyncio.run(main())


def tool_loop_scenario(turns: int = 3, **turn_faults: Any) -> dict[str, Any]:
    """`turns - 1` shell calls, then an answer; `turn_faults` maps a turn index (as str) to its faults."""
    script: list[dict[str, Any]] = []
    for t in range(turns - 1):
        script.append(
            {
                "reasoning": f"Step {t}: I should look around.",
                "text": f"Checking step {t}.",
                "tool_calls": [
                    {"name": "shell", "arguments": {"description": f"List dir{t}", "command": f"ls dir{t}"}}
                ],
            }
        )
    script.append({"reasoning": "I have what I need.", "text": "The repository holds README.md and src."})
    for key, faults in turn_faults.items():
        script[int(key.removeprefix("t"))]["faults"] = faults
    return {"name": "replay_test", "turns": script}


async def tool_loop(conversation: Conversation, task: str = "What is in this repository?") -> int:
    """Drive a conversation until the model stops calling tools; returns the number of turns."""
    reply = await conversation.turn(task)
    turns = 1
    while conversation.tool_results(reply):
        reply = await conversation.turn()
        turns += 1
    return turns


SAMPLE_FIELDS = ("tokens", "response_length", "loss_mask", "rollout_log_probs")


def replayed_twice(
    run_tito: Callable[..., Any], cassettes: list[Path], tmp_path: Path
) -> dict[str, list[dict[str, Any]]]:
    """`tito replay --export-samples` of `cassettes` twice through their recorded target: both exit 0 with no
    failure and export identical bytes; the exported samples' training fields, by session."""
    outs = []
    for n in (1, 2):
        out = tmp_path / f"samples{n}.jsonl"
        run = run_tito("replay", *map(str, cassettes), "--export-samples", str(out))
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
        assert "0 failed" in run.stdout
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    replayed: dict[str, list[dict[str, Any]]] = {}
    for line in outs[0].decode().splitlines():
        row = json.loads(line)
        replayed.setdefault(row["session"], []).append({k: row[k] for k in SAMPLE_FIELDS})
    return replayed


def live_samples(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The samples the live run's finishes returned, by session (sessions whose finish offered some)."""
    from tito_rl.cassette.format.records import SamplesRecord
    from tito_rl.cassette.reader import CassetteReader

    with CassetteReader(path) as reader:
        return {
            r.session: [{k: s[k] for k in SAMPLE_FIELDS} for s in r.samples]
            for r in reader.records()
            if isinstance(r, SamplesRecord) and r.samples
        }
