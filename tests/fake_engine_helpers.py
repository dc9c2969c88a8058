"""Shared helpers for the fake engine tests: prompts rendered with the real Qwen3 template, a loopback server."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from tito_rl.fake_engine.app import ENGINE_KEY, EngineOptions, create_app
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

BASH = {
    "type": "function",
    "function": {
        "name": "Bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
            "required": ["command"],
        },
    },
}
EXEC = {
    "type": "function",
    "function": {
        "name": "exec_command",
        "description": "Run a command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    },
}

TOOL_LOOP: dict[str, Any] = {
    "name": "loop",
    "turns": [
        {
            "reasoning": "The user wants a listing.",
            "text": "Let me list the files.",
            "tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}],
        },
        {"text": "There are two files."},
    ],
}


def tokenizer() -> Any:
    return load_tokenizer()  # cached per process


def prompt_ids(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
    return list(
        tokenizer().apply_chat_template(
            messages, tools=tools, tokenize=True, add_generation_prompt=True, return_dict=False
        )
    )


def first_prompt(user: str = "list the files", tools: list[dict[str, Any]] | None = None) -> list[int]:
    return prompt_ids(
        [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": user}],
        tools=[BASH] if tools is None else tools,
    )


def gen_body(ids: list[int], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "rid": extra.pop("rid", "r" * 32),
        "input_ids": ids,
        "sampling_params": {
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "no_stop_trim": True,
            "max_new_tokens": 512,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
        },
        "return_logprob": True,
    }
    body.update(extra)
    return body


@asynccontextmanager
async def serve(scenario: dict[str, Any] | None = None, **options: Any):
    """A fake engine on 127.0.0.1 (ephemeral port) and a client session; yields (base_url, session, app)."""
    policy = ScriptedPolicy(parse_scenario(scenario or TOOL_LOOP), tokenizer())
    app = create_app(policy, EngineOptions(tokenizer=tokenizer(), **options))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession() as session:
            yield str(server.make_url("")).rstrip("/"), session, app
    finally:
        await server.close()


async def sse_events(resp: Any) -> list[Any]:
    import json

    events = []
    async for line in resp.content:
        line = line.decode().strip()
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def until_generating(app: Any, *rids: str, tokens: int = 0) -> None:
    """Wait until the engine runs every request `rids` (out of its queue) and has decoded at least `tokens` of
    each: what a test aborts mid-generation after, rather than after a fixed sleep that a loaded machine outlasts."""
    engine = app[ENGINE_KEY]
    for _ in range(12_000):  # a hang's bound (120 s), not a timing
        found = [engine.tracked.get(rid) for rid in rids]
        if all(t is not None and t.running and t.produced >= tokens for t in found):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine never ran {rids} to {tokens} token(s)")


async def until_queued(app: Any, rid: str) -> None:
    """Wait until the engine holds request `rid` in its queue (tracked, not running)."""
    engine = app[ENGINE_KEY]
    for _ in range(12_000):  # a hang's bound (120 s), not a timing
        if rid in engine.tracked and not engine.tracked[rid].running:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine never queued {rid}")


async def until_in_flight(app: Any, count: int = 1) -> None:
    """Wait until the engine runs `count` requests at once, whatever their rids (an adapter's own)."""
    engine = app[ENGINE_KEY]
    for _ in range(12_000):  # a hang's bound (120 s), not a timing
        if sum(t.running for t in engine.tracked.values()) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the engine never ran {count} request(s) at once")
