"""The built-in `rllm` target around rllm's real gateway (`rllm-model-gateway`, a test dependency), against a stub
vLLM engine on loopback: sessions in the URL, samples built as rllm's trainer builds them (one row per prefix-chain
of traces, masks on completions), the last trace kept on an immediate finish, and the gateway missing.

The stub renders a chat as tokens that grow by appending (each message: role id, its text's ids, END), so a
2-turn session is one prefix-chain and rllm merges it into one sample.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.process_helpers import free_port, proc_output, wait_http
from tests.target_support import (
    TURNS,
    Generation,
    check_samples,
    mask_paths,
    reply_payloads,
    start_logged_engine,
    system_prompt,
)
from tito_rl.recorder.processes import stop as stop_process
from tito_rl.recorder.targets import rllm
from tito_rl.recorder.targets.base import TargetFinish, TargetOptions, TargetUnavailable
from tito_rl.recorder.targets.http import HttpTarget
from tito_rl.recorder.targets.registry import BUILTIN, available, create_driver
from tito_rl.recorder.targets.rllm_samples import build_samples
from tito_rl.trajectory.records import Sample

ROLE = {"system": 1, "user": 2, "assistant": 3, "tool": 4}
END = 0
AUTH = "Bearer sk-session-token"
REPLIES = ["Let me look.", "It is a calculator."]


def text_ids(text: str) -> list[int]:
    return [100 + ord(c) for c in text]


def assistant_text(message: dict[str, Any]) -> str:
    calls = [c["function"]["name"] + c["function"]["arguments"] for c in message.get("tool_calls") or []]
    return (message.get("content") or "") + "".join(calls)


def render(messages: list[dict[str, Any]]) -> list[int]:
    """The stub's chat template: appending a message appends its tokens, and the generation prompt is the
    assistant role id, so an assistant turn rendered in the next prompt equals role id + its completion ids."""
    ids: list[int] = []
    for m in messages:
        text = assistant_text(m) if m["role"] == "assistant" else str(m.get("content") or "")
        ids += [ROLE[m["role"]], *text_ids(text), END]
    return ids + [ROLE["assistant"]]


def logprob(i: int) -> float:
    return -0.01 * (i + 1)


@dataclass
class StubEngine:
    """A vLLM-shaped `/v1/chat/completions` (prompt_token_ids at the root, choices[0].token_ids, logprobs
    content), JSON and SSE, that logs what the gateway sends it."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    runner: web.AppRunner | None = None
    url: str = ""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.calls.append({"path": request.path, "headers": dict(request.headers), "body": body})
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        message: dict[str, Any] = {"role": "assistant", "content": REPLIES[turn % len(REPLIES)]}
        if turn == 0:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"chatcmpl-tool-{secrets.token_hex(8)}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": json.dumps({"path": "README.md"})},
                    }
                ],
            }
        prompt, output = render(body["messages"]), [*text_ids(assistant_text(message)), END]
        base = {"id": f"chatcmpl-{secrets.token_hex(8)}", "created": int(time.time()), "model": body["model"]}
        lps = [
            {"token": f"token_id:{t}", "logprob": logprob(i), "bytes": [], "top_logprobs": []}
            for i, t in enumerate(output)
        ]
        if not body.get("stream"):
            choice = {
                "index": 0,
                "message": message,
                "logprobs": {"content": lps},
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": output,
            }
            return web.json_response(
                {
                    **base,
                    "object": "chat.completion",
                    "choices": [choice],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(output)},
                    "prompt_logprobs": None,
                    "prompt_token_ids": prompt,
                    "kv_transfer_params": None,
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {**base, "object": "chat.completion.chunk"}

        async def send(data: dict[str, Any]) -> None:
            await resp.write(f"data: {json.dumps(data)}\n\n".encode())

        await send(
            {
                **chunk,
                "prompt_token_ids": prompt,
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                ],
            }
        )
        if message.get("tool_calls"):  # the whole call in one delta, as vLLM's parsers often send it
            deltas = [{"tool_calls": [{"index": 0, **message["tool_calls"][0]}]}, {}]
            spans = [output[:-1], output[-1:]]
        else:
            deltas = [{"content": message["content"][:5]}, {"content": message["content"][5:]}, {}]
            spans = [output[:5], output[5:-1], output[-1:]]
        at = 0
        for n, (delta, span) in enumerate(zip(deltas, spans, strict=True)):
            last = n == len(deltas) - 1
            lp = {"content": lps[at : at + len(span)]}
            await send(
                {
                    **chunk,
                    "choices": [
                        {
                            "index": 0,
                            "delta": delta,
                            "logprobs": lp,
                            "finish_reason": "stop" if last else None,
                            "token_ids": span,
                        }
                    ],
                }
            )
            at += len(span)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/health", self.health)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self.url


@pytest.fixture
async def engine() -> AsyncIterator[StubEngine]:
    stub = StubEngine()
    await stub.start()
    yield stub
    assert stub.runner is not None
    await stub.runner.cleanup()


@pytest.fixture
async def gateway(engine: StubEngine) -> AsyncIterator[tuple[rllm.RllmTarget, str]]:
    driver = create_driver("rllm", TargetOptions())
    assert isinstance(driver, rllm.RllmTarget)
    url = await driver.start(engine.url)  # the engine's root: the driver appends /v1 as the gateway expects
    yield driver, url
    await driver.stop()
    assert driver.thread is None and not any(t.name == rllm.THREAD_NAME for t in threading.enumerate())


async def chat(
    http: aiohttp.ClientSession, url: str, messages: list[dict[str, Any]], stream: bool
) -> tuple[dict[str, Any], list[Any]]:
    """One agent call; the assistant message as the agent assembles it, and the reply's payloads."""
    body = {"model": "stub", "messages": messages, "stream": stream}
    async with http.post(f"{url}/chat/completions", json=body, headers={"Authorization": AUTH}) as resp:
        assert resp.status == 200, await resp.text()
        payloads = reply_payloads(await resp.read(), resp.content_type)
    if not stream:
        return payloads[0]["choices"][0]["message"], payloads
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for p in payloads:
        delta = p["choices"][0]["delta"] if p.get("choices") else {}
        if delta.get("content"):
            message["content"] = (message["content"] or "") + delta["content"]
        if delta.get("tool_calls"):
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in delta["tool_calls"]]
    return message, payloads


async def two_turns(base: str, sid: str, stream: bool) -> tuple[list[dict[str, Any]], list[list[Any]]]:
    """The agent's side of a 2-turn session: a question, a tool call, its result, an answer."""
    url = f"{base}/sessions/{sid}/v1"
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is this?"},
    ]
    replies = []
    async with aiohttp.ClientSession() as http:
        first, payloads = await chat(http, url, messages, stream)
        replies.append(payloads)
        messages += [first, {"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "# calc"}]
        second, payloads = await chat(http, url, messages, stream)
        replies.append(payloads)
    return [*messages, second], replies


def expected_sample(engine: StubEngine) -> tuple[list[int], list[int], list[float], int]:
    """rllm's row for the stub's two calls: prompt 1, completion 1, the new prompt tokens of call 2 (masked,
    logprob 0.0), completion 2 (rllm/trainer/verl/transform.py _process_trajectory)."""
    (p1, o1), (p2, o2) = [
        (render(c["body"]["messages"]), [*text_ids(assistant_text(_reply_message(c))), END]) for c in engine.calls
    ]
    assert p2[: len(p1) + len(o1)] == p1 + o1, "the stub's template must grow by appending"
    obs = p2[len(p1) + len(o1) :]
    tokens = p1 + o1 + obs + o2
    mask = [1] * len(o1) + [0] * len(obs) + [1] * len(o2)
    logprobs = [logprob(i) for i in range(len(o1))] + [0.0] * len(obs) + [logprob(i) for i in range(len(o2))]
    return tokens, mask, logprobs, len(p1)


def _reply_message(call: dict[str, Any]) -> dict[str, Any]:
    turn = sum(1 for m in call["body"]["messages"] if m["role"] == "assistant")
    if turn == 0:
        return {
            "content": None,
            "tool_calls": [{"function": {"name": "read_file", "arguments": json.dumps({"path": "README.md"})}}],
        }
    return {"content": REPLIES[turn % len(REPLIES)]}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_two_turn_session_becomes_rllms_merged_sample(engine: StubEngine, gateway: Any, stream: bool) -> None:
    driver, base = gateway
    assert driver.info.name == "rllm" and driver.info.routing_header is None
    assert driver.info.version == "0.1.0"
    history, replies = await two_turns(base, "s-1", stream)
    # the gateway forwards to {worker}/chat/completions with the agent's Authorization and asks for ids, logprobs
    assert [c["path"] for c in engine.calls] == ["/v1/chat/completions"] * 2
    for call in engine.calls:
        assert call["headers"]["Authorization"] == AUTH
        assert call["body"]["logprobs"] is True and call["body"]["return_token_ids"] is True
        assert call["body"]["extra_body"] == {"return_token_ids": True}
    assert engine.calls[1]["body"]["messages"] == history[:-1]
    # replies: vLLM's extra fields stripped; every volatile path names a field the reply has
    hits: set[str] = set()
    for payloads in replies:
        for p in payloads:
            assert "prompt_token_ids" not in p and all("token_ids" not in c for c in p["choices"])
            hits |= mask_paths(p, rllm.VOLATILE)[1]
    assert hits == {
        "id",
        "created",
        "choices[*].message.tool_calls[*].id" if not stream else "choices[*].delta.tool_calls[*].id",
    }

    finished = await driver.finish("s-1", 1.5)
    assert isinstance(finished, TargetFinish)
    tokens, mask, logprobs, prompt_length = expected_sample(engine)
    [sample] = finished.samples
    assert sample["tokens"] == tokens and sample["loss_mask"] == mask
    assert sample["rollout_log_probs"] == pytest.approx(logprobs)
    assert sample["reward"] == 1.5 and sample["metadata"] == {"turns": [0, 1]}
    assert Sample.from_dict(sample).prompt_length == prompt_length
    assert finished.stats["turns"] == 2 and finished.stats["forks"] == {} and finished.stats["calls"] == 2
    # the session is gone once finished, as rllm's engine deletes its sessions: a second finish has nothing
    assert (await driver.finish("s-1", 0.0)).samples == []


async def test_sessions_are_apart_and_drop_forgets(engine: StubEngine, gateway: Any) -> None:
    driver, base = gateway
    await asyncio.gather(two_turns(base, "a", False), two_turns(base, "b", True))
    await driver.drop("a")
    assert (await driver.finish("a", 1.0)).samples == []
    assert len((await driver.finish("b", 1.0)).samples) == 1
    assert (await driver.finish("never-seen", 1.0)).samples == []


class Bag:
    """A stand-in for the proxy's set of pending writes that is not a set: the driver falls back to polling."""

    def __init__(self) -> None:
        self.items: set[Any] = set()

    def add(self, item: Any) -> None:
        self.items.add(item)

    def discard(self, item: Any) -> None:
        self.items.discard(item)


@pytest.mark.parametrize("rule", ["drain", "poll"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_an_immediate_finish_keeps_the_last_trace(
    engine: StubEngine, gateway: Any, stream: bool, rule: str
) -> None:
    """Trace writes are fire-and-forget tasks; held back here (as a sqlite store's are slow) until a read right after
    the last reply has missed them, they are still missed by that read, and not by the driver's finish."""
    driver, base = gateway
    state = driver.app.state
    write = state.store.store_trace
    naive_read_done = asyncio.Event()  # not a fixed delay: a loaded machine's read may come late

    async def slow_write(trace_id: str, session_id: str, data: dict[str, Any]) -> None:
        await naive_read_done.wait()
        await write(trace_id, session_id, data)

    state.store.store_trace = slow_write
    if rule == "poll":
        state.proxy._pending_traces = Bag()
    await two_turns(base, "slow", stream)
    async with aiohttp.ClientSession() as http, http.get(f"{base}/sessions/slow/traces") as resp:
        assert len(await resp.json()) < 2  # what a naive read gets
    naive_read_done.set()
    finished = await driver.finish("slow", 1.0)
    assert finished.stats["turns"] == 2 and finished.samples[0]["metadata"]["turns"] == [0, 1]


async def test_start_stop_leaves_nothing_and_the_port_is_free(engine: StubEngine) -> None:
    driver = rllm.create(TargetOptions())
    url = await driver.start(engine.url + "/v1")  # a URL already ending in /v1 is taken as it is
    async with aiohttp.ClientSession() as http, http.get(f"{url}/health") as resp:
        assert resp.status == 200
    await driver.stop()
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/health"):
            pass
    await driver.stop()  # twice is harmless


def test_worker_url() -> None:
    assert rllm.worker_url("http://127.0.0.1:9/") == "http://127.0.0.1:9/v1"
    assert rllm.worker_url("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1"


def test_registered_as_built_in() -> None:
    assert BUILTIN["rllm"] == "tito_rl.recorder.targets.rllm:create" and "rllm" in available()
    text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert 'rllm = "tito_rl.recorder.targets.rllm:create"' in text


def test_missing_gateway_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rllm_model_gateway", None)  # `import rllm_model_gateway` raises ImportError
    with pytest.raises(TargetUnavailable) as caught:
        create_driver("rllm", TargetOptions())
    assert "\n" not in str(caught.value) and "pip install rllm-model-gateway" in str(caught.value)


def trace(prompt: list[int], completion: list[int], logprobs: list[float] | None = None) -> dict[str, Any]:
    return {
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "logprobs": [-0.5] * len(completion) if logprobs is None else logprobs,
    }


def test_rows_follow_rllms_prefix_merge() -> None:
    """A chain merges; a prompt that leaves it opens a row (`prompt`, or `earlier-response` where it rewrote an
    earlier completion); a trace without ids trains nothing; short logprobs are padded with 0.0 as rllm pads."""
    traces = [
        trace([1, 2], [3, 4]),
        trace([1, 2, 3, 4, 5], [6]),  # one row: obs [5]
        {"prompt_token_ids": [], "completion_token_ids": [], "logprobs": None},  # GET /v1/models' empty trace
        trace([1, 2, 3, 9], [7], logprobs=[]),  # leaves the row inside completion 1
        trace([8], [9]),
        trace([1], [2]),
    ]  # leaves it in the context, twice
    built = build_samples(traces, 2.0)
    first = built.samples[0]
    assert first["tokens"] == [1, 2, 3, 4, 5, 6] and first["loss_mask"] == [1, 1, 0, 1]
    assert first["rollout_log_probs"] == [-0.5, -0.5, 0.0, -0.5] and first["metadata"] == {"turns": [0, 1]}
    assert built.samples[1]["rollout_log_probs"] == [0.0]
    assert [s["metadata"]["turns"] for s in built.samples] == [[0, 1], [3], [4], [5]]
    assert all(s["reward"] == 2.0 for s in built.samples)
    assert built.stats["forks"] == {"earlier-response": 1, "prompt": 2}
    assert built.stats["malformed_traces"] == 1 and built.stats["padded_logprobs"] == 1
    assert built.stats["turns"] == 5 and built.stats["untrained_turns"] == 0


async def test_http_kind_around_the_gateway_as_a_process(engine: StubEngine) -> None:
    """`--target http://...` around `rllm-model-gateway` started on its own: agents' session URLs pass through,
    the engine calls reach the worker URL (tito's --engine-listen), and the http kind has no samples to ask for
    (the gateway serves no /tito/sessions API)."""
    port = free_port()
    exe = Path(sys.executable).with_name("rllm-model-gateway")
    proc = subprocess.Popen(
        [
            str(exe),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker",
            f"{engine.url}/v1",
            "--store",
            "memory",
            "--log-level",
            "warning",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        await asyncio.to_thread(wait_http, f"http://127.0.0.1:{port}/health", proc, 60.0)
        target = HttpTarget(f"http://127.0.0.1:{port}", volatile=rllm.VOLATILE, routing_header=None)
        base = await target.start(engine.url)
        await two_turns(base, "proc", False)
        assert len(engine.calls) == 2 and engine.calls[0]["headers"]["Authorization"] == AUTH
        assert await target.finish("proc", 1.0) is None  # no samples over http: the gateway has no finish
        async with aiohttp.ClientSession() as http, http.get(f"{base}/sessions/proc/traces") as resp:
            assert len(await resp.json()) == 2
        await target.stop()
    finally:
        stop_process(proc)
        if proc.poll() is None:
            pytest.fail(proc_output(proc))


FAKE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {"type": "object", "properties": {key: {"type": "string"} for key in keys}},
        },
    }
    for name, keys in (("shell", ("command", "description")), ("read", ("file_path",)))
]


async def test_against_the_fake_engine_in_vllm_dialect() -> None:
    """The same through tito's fake engine where it speaks vLLM's `/v1/chat/completions` (the scripted 3-turn
    tool loop of tests/target_support.py): every engine output trained once, token for token."""
    sid = "rllm-fake"
    engine = await asyncio.to_thread(start_logged_engine, [sid])
    generations: list[Generation] = []
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{engine.url}/v1/chat/completions", json={"model": "x", "messages": []}) as probe,
        ):
            if probe.status in (404, 405):
                pytest.skip("the fake engine does not serve POST /v1/chat/completions yet")
        driver = create_driver("rllm", TargetOptions())
        assert isinstance(driver, rllm.RllmTarget)
        base = await driver.start(engine.url)
        store = driver.app.state.store
        write = store.store_trace

        async def noted(trace_id: str, session_id: str, data: dict[str, Any]) -> None:  # what rllm trains on
            generations.append(
                Generation(None, data["prompt_token_ids"], data["completion_token_ids"], data["logprobs"] or [])
            )
            await write(trace_id, session_id, data)

        store.store_trace = noted
        try:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": system_prompt(sid)},
                {"role": "user", "content": "What is this project?"},
            ]
            async with aiohttp.ClientSession() as http:
                for _ in range(len(TURNS)):
                    body = {"model": "x", "messages": messages, "tools": FAKE_TOOLS}
                    async with http.post(f"{base}/sessions/{sid}/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                        message = (await resp.json())["choices"][0]["message"]
                    messages.append(message)
                    if not message.get("tool_calls"):
                        break
                    messages += [
                        {"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in message["tool_calls"]
                    ]
            finished = await driver.finish(sid, 1.0)
        finally:
            await driver.stop()
    finally:
        engine.server.stop()
    assert len(generations) == len(TURNS)
    check_samples(finished.samples, generations, every_output=True)
