"""A minimal scripted SGLang `/generate` double for the adapter tests (the full fake engine lives elsewhere).

It answers with scripted Qwen3-format output, tokenized with the real tokenizer, with logprobs; validates
each request with sglang's own request contract; records what it received; and fails on demand.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from aiohttp import web

from tito_rl.trajectory.adapters.parsing.sglang_loader import sglang_module

EOS = 151645


@cache
def _contract() -> Any:
    return sglang_module("api.v1.api_types").GenerateRequest


def qwen3_output(text: str = "", reasoning: str = "", calls: list[tuple[str, dict[str, Any]]] | None = None) -> str:
    """Model output text in the Qwen3 format (what the template would render for this reply)."""
    out = f"<think>\n{reasoning}\n</think>\n\n" if reasoning else ""
    out += text
    for name, args in calls or []:
        out += (
            "\n" if out and not out.endswith("\n\n") else ""
        ) + f"<tool_call>\n{json.dumps({'name': name, 'arguments': args}, ensure_ascii=False)}\n</tool_call>"
    return out


def logprob(k: int) -> float:
    return -((k % 7) + 1) / 100


@dataclass
class EngineDouble:
    tokenizer: Any
    script: list[str] = field(default_factory=list)
    failures: list[tuple[str, Any]] = field(default_factory=list)  # ("status", 500) ("malformed", None) ...
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    aborts: list[str] = field(default_factory=list)
    router_workers: list[str] | None = None  # router mode: /abort_request 404, /workers lists these
    _aborted: dict[str, asyncio.Event] = field(default_factory=dict)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        app.router.add_get("/workers", self.workers)
        return app

    def output_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) + [EOS]

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        try:
            _contract().from_json_value(body)
        except Exception as exc:  # sglang's 400 for contract violations
            return web.json_response({"error": str(exc)}, status=400)
        failure = self.failures.pop(0) if self.failures else None
        if failure and failure[0] == "status":
            return web.json_response({"error": {"message": f"injected failure {failure[1]}"}}, status=failure[1])
        if failure and failure[0] == "malformed":
            return web.Response(text='{"text": "oops", "meta_info": ', content_type="application/json")
        if failure and failure[0] == "drop":
            request.transport.close()
            return web.Response()
        text = self.script.pop(0) if self.script else "done"
        ids = self.output_ids(text)
        finish: dict[str, Any] = {"type": "stop", "matched": EOS}
        if failure and failure[0] == "slow":
            event = self._aborted.setdefault(body["rid"], asyncio.Event())
            try:
                await asyncio.wait_for(event.wait(), failure[1])
                ids, finish = ids[:3], {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
            except TimeoutError:
                pass
        limit = body["sampling_params"].get("max_new_tokens", 128)
        if len(ids) > limit:
            ids, finish = ids[:limit], {"type": "length", "length": limit}
        triples = [[logprob(k), t, None] for k, t in enumerate(ids)]
        return web.json_response(
            {
                "text": self.tokenizer.decode(ids),
                "output_ids": ids,
                "meta_info": {
                    "id": body["rid"],
                    "finish_reason": finish,
                    "prompt_tokens": len(body["input_ids"]),
                    "output_token_logprobs": triples,
                    "completion_tokens": len(ids),
                    "cached_tokens": 0,
                },
            }
        )

    async def abort(self, request: web.Request) -> web.Response:
        if self.router_workers is not None:
            return web.Response(status=404, text="Not Found")
        rid = (await request.json())["rid"]
        self.aborts.append(rid)
        self._aborted.setdefault(rid, asyncio.Event()).set()
        return web.Response(status=200)

    async def workers(self, request: web.Request) -> web.Response:
        if self.router_workers is None:
            return web.Response(status=404)
        return web.json_response(
            {"workers": [{"url": u, "model_id": "m"} for u in self.router_workers], "total": len(self.router_workers)}
        )
