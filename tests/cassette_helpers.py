"""Shared material for the cassette tests: real capture bodies, realistic engine exchanges, loopback servers."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aiohttp import web

from tests.process_helpers import capture_dir
from tito_rl.cassette.format.records import Header
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange

BEARER = "tito-test-bearer-7f3a9c1e5b2d4f60"
API_KEY = "sk-ant-api03-Zq8XvN2LmK4pR7tY1wE9uI0oP3aS6dF5gH8jK2lL4zX7cV1bN"
PINNED = "2026-01-02T03:04:05Z"
EOS = 151645


def capture_bodies(scenario: str = "claude_baseline") -> list[bytes]:
    return [p.read_bytes() for p in sorted((capture_dir(scenario) / "bodies").glob("*.json"))]


def header(fingerprint: str = "sha256:test", **kw: Any) -> Header:
    return Header(
        tokenizer_fingerprint=fingerprint,
        created=PINNED,
        parsers={"reasoning": "qwen3", "tool_call": "qwen25"},
        adapter={"fork_threshold_tokens": 1024},
        agent={"client": "claude-code", "version": "2.1.330"},
        engine={"model_path": "Qwen/Qwen3-8B"},
        **kw,
    )


def generate_body(output_ids: list[int], rid: str, prompt_tokens: int, cached: int = 0) -> dict[str, Any]:
    lps = [[-0.015625 * (i + 1), t, None] for i, t in enumerate(output_ids)]
    return {
        "text": "",
        "output_ids": output_ids,
        "meta_info": {
            "id": rid,
            "finish_reason": {"type": "stop", "matched": EOS},
            "prompt_tokens": prompt_tokens,
            "output_token_logprobs": lps,
            "completion_tokens": len(output_ids),
            "cached_tokens": cached,
            "e2e_latency": 0.25,
        },
    }


def session_traffic(tokenizer: Any, turns: int = 4, session: str = BEARER) -> list[tuple[str, Any]]:
    """A Claude-like session through the tap's eyes: per turn one engine call, then the agent exchange.

    Prompts grow the way a real agent's do (previous prompt + output + tool result), tokenized for real.
    """
    bodies = capture_bodies()
    events: list[tuple[str, Any]] = []
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "List the files, then read README."}], tokenize=True, add_generation_prompt=True
    )
    # transformers 5 gives a BatchEncoding (a Mapping, not a dict): list() of it would be its keys
    prompt = list(prompt["input_ids"] if isinstance(prompt, Mapping) else prompt)
    for turn in range(turns):
        output = tokenizer.encode(
            f'<tool_call>\n{{"name": "Bash", "arguments": {{"command": "ls {turn}"}}}}\n</tool_call>'
        ) + [EOS]
        rid = f"{turn:032x}"
        request = {
            "rid": rid,
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {
                "max_new_tokens": 8192,
                "temperature": 1.0,
                "skip_special_tokens": False,
                "spaces_between_special_tokens": False,
                "no_stop_trim": True,
            },
        }
        events.append(
            (
                "engine",
                EngineExchange(
                    "POST",
                    "/generate",
                    request,
                    200,
                    generate_body(output, rid, len(prompt), cached=turn * 7),
                    headers={"X-SMG-Routing-Key": session},
                    started_s=turn * 1.5,
                    duration_s=0.25,
                ),
            )
        )
        body = bodies[turn % len(bodies)].replace(b'"stub-model"', f'"stub-model", "echo": "{API_KEY}"'.encode())
        reply = [
            f'event: message_start\ndata: {{"type":"message_start","turn":{turn}}}\n\n',
            'event: message_stop\ndata: {"type":"message_stop"}\n\n',
        ]
        events.append(
            (
                "agent",
                AgentExchange(
                    "POST",
                    "/v1/messages",
                    "beta=true",
                    {
                        "Authorization": f"Bearer {session}",
                        "x-api-key": API_KEY,
                        "Cookie": f"sess={API_KEY}",
                        "User-Agent": "claude-cli/2.1.330 (external, sdk-cli)",
                        "Content-Type": "application/json",
                    },
                    body,
                    200,
                    {"Content-Type": "text/event-stream; charset=utf-8", "Set-Cookie": f"k={API_KEY}"},
                    reply_events=reply,
                    started_s=turn * 1.5,
                    duration_s=0.3,
                    turn_index=turn,
                ),
            )
        )
        tool_result = tokenizer.encode(
            f"<|im_start|>user\n<tool_response>\nfile_{turn}.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )
        prompt = prompt + output + tool_result
    return events


def play(writer: Any, events: list[tuple[str, Any]], session: str = BEARER, source: str = "bearer") -> None:
    for kind, exchange in events:
        if kind == "engine":
            writer.engine_exchange(session, source, exchange)
        else:
            writer.agent_exchange(session, source, exchange)


def final_sample(events: list[tuple[str, Any]]) -> dict[str, Any]:
    last = [e for k, e in events if k == "engine"][-1]
    tokens = last.request["input_ids"] + last.response["output_ids"]
    n = len(last.response["output_ids"])
    return {
        "tokens": tokens,
        "response_length": n,
        "loss_mask": [1] * n,
        "rollout_log_probs": [t[0] for t in last.response["meta_info"]["output_token_logprobs"]],
        "reward": 1.0,
        "metadata": {"truncated": False, "use_tool": True},
    }


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Run an aiohttp app on an ephemeral loopback port; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def dumps(obj: Any) -> bytes:
    return json.dumps(obj).encode()
