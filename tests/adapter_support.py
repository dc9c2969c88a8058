"""Helpers for the adapter tests: captured real requests, and the app + engine double on loopback."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp.test_utils import TestServer

from tests.adapter_double import EngineDouble, qwen3_output
from tests.process_helpers import CAPTURES, capture_dir
from tito_rl.trajectory.adapters.app import ADAPTER_KEY, AdapterSettings, create_app
from tito_rl.trajectory.manager import TrajectoryManager

HTTP_SCENARIOS = [
    "claude_baseline",
    "claude_brokenstream",
    "claude_continue",
    "claude_parallel",
    "claude_retry529",
    "claude_sonnet45",
    "claude_thinking",
    "claude_tui2",
    "codex_baseline",
    "codex_parallel_http",
    "codex_reasoning_http",
    "codex_retry_http",
    "opencode",
    "qwen",
]


@dataclass
class Captured:
    seq: int
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    reply: dict[str, Any] | None


def load_capture(scenario: str) -> list[Captured]:
    out = []
    for line in (capture_dir(scenario) / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        raw = (CAPTURES / r["raw_body_file"]).read_bytes() if r.get("raw_body_file") else b""
        out.append(Captured(r["seq"], r["method"], r["path"], r.get("query", ""), r["headers"], raw, r.get("reply")))
    return out


def script_for(reply: dict[str, Any] | None) -> str | None:
    """The Qwen3 model output that makes the adapter send the reply the capture's stub sent."""
    if not reply or reply.get("injected_failure") or reply.get("ws") or "status" in reply:
        return None
    if "blocks" in reply:  # Anthropic
        b = reply["blocks"]
        return qwen3_output(
            "".join(x["text"] for x in b if x["type"] == "text"),
            "".join(x["thinking"] for x in b if x["type"] == "thinking"),
            [(x["name"], x["input"]) for x in b if x["type"] == "tool_use"],
        )
    if "items" in reply:  # Responses
        items = reply["items"]
        text = "".join(c["text"] for i in items if i["type"] == "message" for c in i["content"])
        reasoning = "".join(s["text"] for i in items if i["type"] == "reasoning" for s in i["summary"])
        calls = [(i["name"], json.loads(i["arguments"])) for i in items if i["type"] == "function_call"]
        return qwen3_output(text, reasoning, calls)
    msg = reply["message"]  # chat completions
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in msg.get("tool_calls") or []]
    return qwen3_output(msg.get("content") or "", "", calls)


@dataclass
class Stack:
    url: str
    double: EngineDouble
    manager: TrajectoryManager
    tap: Any
    adapter: Any


class RecordingTap:
    def __init__(self) -> None:
        self.agent: list[tuple[str, str, Any]] = []
        self.engine: list[tuple[str, str, Any]] = []
        self.finished: list[tuple[str, float, list[dict[str, Any]]]] = []
        self.dropped: list[str] = []
        self.order: list[tuple[str, str]] = []  # (what, session): requests must come before their engine calls

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self.order.append(("request", session))

    def agent_exchange(self, session: str, source: str, exchange: Any) -> None:
        self.agent.append((session, source, exchange))
        self.order.append(("agent", session))

    def engine_exchange(self, session: str, source: str, exchange: Any) -> None:
        self.engine.append((session, source, exchange))
        self.order.append(("engine", session))

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self.finished.append((session, reward, samples))

    def session_dropped(self, session: str, source: str) -> None:
        self.dropped.append(session)


@asynccontextmanager
async def running_stack(tokenizer: Any, router: bool = False, **settings: Any) -> AsyncIterator[Stack]:
    double = EngineDouble(tokenizer)
    engine = TestServer(double.app(), host="127.0.0.1")
    await engine.start_server()
    worker = None
    if router:
        worker_double = EngineDouble(tokenizer)
        worker = TestServer(worker_double.app(), host="127.0.0.1")
        await worker.start_server()
        double.router_workers = [str(worker.make_url("")).rstrip("/")]
        double.worker = worker_double  # type: ignore[attr-defined]
    manager, tap = TrajectoryManager(), RecordingTap()
    app = create_app(AdapterSettings(engine_url=str(engine.make_url("")).rstrip("/"), **settings), manager, tap)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Stack(str(server.make_url("")).rstrip("/"), double, manager, tap, app[ADAPTER_KEY])
    finally:
        await server.close()
        await engine.close()
        if worker is not None:
            await worker.close()
