"""Shared helpers for the fake engine tests: prompts rendered with the real Qwen3 template, a loopback server."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from tito_rl.fake_engine.app import EngineOptions, create_app
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
