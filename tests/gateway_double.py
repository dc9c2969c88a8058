"""A small gateway of a different design from tito's adapter, for testing targets without slime.

tito's adapter keeps each session's canonical ids and renders only what is new; this gateway does what most
gateways do: every turn it re-renders the whole history with the tokenizer's own
`apply_chat_template(..., tokenize=True)`. It speaks OpenAI Chat Completions and Anthropic Messages (JSON and
SSE, the shapes the scripted client sends), calls `/generate` with input_ids and `return_logprob` (and
`X-SMG-Routing-Key: <session>` unless told not to), reads tool calls with a regex over Qwen's `<tool_call>`
JSON, and puts uuid4 ids and the wall-clock `created` into replies, so a replay must mask them.

Its linearization is its own and simple: a session is a list of chains; a turn whose prompt extends a chain's
tokens continues the longest such chain (the prompt's new tokens masked, the output trained), any other turn
starts a chain of its own (a fork). One sample per chain. Its session API is tito's:
`POST /tito/sessions/{sid}/finish {"reward"}` -> `{"samples": [...]}`, `DELETE /tito/sessions/{sid}`.

Two ways to run it: as a driver (`--target tests.gateway_double:create`; `TargetOptions.extra`:
`routing_key: false` for a gateway that sends no routing key), or as a process for the `http://` target:

    python -m tests.gateway_double --engine http://127.0.0.1:30000 --listen 127.0.0.1:8500 [--no-routing-key]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tito_rl.recorder.targets.base import ROUTING_HEADER, TargetInfo, TargetOptions
from tito_rl.trajectory.records import Sample
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

VOLATILE = ("id", "created", "message.id", "content[*].id", "content_block.id",
            "choices[*].message.tool_calls[*].id", "choices[*].delta.tool_calls[*].id")
MAX_NEW_TOKENS = 4096
THINK = re.compile(r"^\s*(?:<think>)?(.*?)</think>\s*", re.DOTALL)
TOOL_CALL = re.compile(r"\s*<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
END_TOKENS = ("<|im_end|>", "<|endoftext|>")


# --- sessions and their chains --------------------------------------------------------------------------------


@dataclass
class Chain:
    prompt_length: int  # the first turn's prompt: not part of the sample's response region
    tokens: list[int]
    loss_mask: list[int]  # over all tokens; the sample keeps the part after prompt_length
    logprobs: list[float]
    turns: int = 1


@dataclass
class GatewaySession:
    chains: list[Chain] = field(default_factory=list)
    turns: int = 0

    def record(self, prompt: list[int], output: list[int], logprobs: list[float]) -> None:
        self.turns += 1
        extends = [c for c in self.chains if len(c.tokens) <= len(prompt) and prompt[:len(c.tokens)] == c.tokens]
        if extends:
            chain = max(extends, key=lambda c: len(c.tokens))
            new = prompt[len(chain.tokens):]
            chain.tokens += new + output
            chain.loss_mask += [0] * len(new) + [1] * len(output)
            chain.logprobs += [0.0] * len(new) + list(logprobs)
            chain.turns += 1
        else:
            self.chains.append(Chain(len(prompt), prompt + output, [0] * len(prompt) + [1] * len(output),
                                     [0.0] * len(prompt) + list(logprobs)))

    def samples(self, reward: float) -> list[dict[str, Any]]:
        out = []
        for chain in self.chains:
            start = chain.prompt_length
            out.append(Sample(tokens=list(chain.tokens), response_length=len(chain.tokens) - start,
                              loss_mask=chain.loss_mask[start:], rollout_log_probs=chain.logprobs[start:],
                              reward=reward, metadata={"turns": chain.turns}).to_dict())
        return out


# --- wire translation ---------------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") in ("text", None))


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {"raw": raw}
    return value if isinstance(value, dict) else {"raw": raw}


def _call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": _arguments(arguments)}}


def anthropic_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"])})
    for m in body.get("messages") or []:
        blocks = m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}]
        if m["role"] == "user":
            for b in blocks:
                if b.get("type") == "tool_result":
                    messages.append({"role": "tool", "content": _text(b.get("content"))})
            text = _text([b for b in blocks if b.get("type") == "text"])
            if text:
                messages.append({"role": "user", "content": text})
        else:
            message: dict[str, Any] = {"role": "assistant",
                                       "content": _text([b for b in blocks if b.get("type") == "text"])}
            thinking = "".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking")
            if thinking:
                message["reasoning_content"] = thinking
            calls = [_call(b["name"], b.get("input")) for b in blocks if b.get("type") == "tool_use"]
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
    tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t.get("input_schema") or {}}}
             for t in body.get("tools") or []]
    return messages, tools


def chat_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    messages = []
    for m in body.get("messages") or []:
        message: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
        if m.get("reasoning_content"):
            message["reasoning_content"] = m["reasoning_content"]
        if m.get("tool_calls"):
            message["tool_calls"] = [_call(c["function"]["name"], c["function"].get("arguments"))
                                     for c in m["tool_calls"]]
        messages.append(message)
    return messages, list(body.get("tools") or [])


@dataclass
class Parsed:
    reasoning: str
    text: str
    calls: list[tuple[str, dict[str, Any]]]
    finish: str  # stop | length


def parse_output(text: str, finish: str) -> Parsed:
    for end in END_TOKENS:
        text = text.removesuffix(end)
    reasoning = ""
    thought = THINK.match(text)
    if thought:
        reasoning, text = thought.group(1).strip(), text[thought.end():]
    calls = []
    for found in TOOL_CALL.finditer(text):
        try:
            payload = json.loads(found.group(1))
            calls.append((str(payload["name"]), _arguments(payload.get("arguments"))))
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
    return Parsed(reasoning, TOOL_CALL.sub("", text).strip(), calls, finish)


# --- replies ---------------------------------------------------------------------------------------------------


def _sse(events: list[tuple[str | None, dict[str, Any] | str]]) -> bytes:
    out = []
    for name, data in events:
        payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        out.append((f"event: {name}\n" if name else "") + f"data: {payload}\n\n")
    return "".join(out).encode()


def anthropic_reply(body: dict[str, Any], parsed: Parsed, usage: tuple[int, int]) -> tuple[bytes, str]:
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": ""})
    if parsed.text:
        blocks.append({"type": "text", "text": parsed.text})
    blocks += [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex}", "name": n, "input": a} for n, a in parsed.calls]
    stop = "tool_use" if parsed.calls else ("max_tokens" if parsed.finish == "length" else "end_turn")
    message = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": body.get("model"),
               "content": blocks, "stop_reason": stop, "stop_sequence": None,
               "usage": {"input_tokens": usage[0], "output_tokens": usage[1]}}
    if not body.get("stream"):
        return json.dumps(message, ensure_ascii=False).encode(), "application/json"
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        ("message_start", {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}})]
    for i, block in enumerate(blocks):
        if block["type"] == "tool_use":
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        events += [("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}),
                   ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
                   ("content_block_stop", {"type": "content_block_stop", "index": i})]
    events += [("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                  "usage": {"output_tokens": usage[1]}}),
               ("message_stop", {"type": "message_stop"})]
    return _sse(events), "text/event-stream"


def chat_reply(body: dict[str, Any], parsed: Parsed, usage: tuple[int, int]) -> tuple[bytes, str]:
    calls = [{"id": f"call_{uuid.uuid4().hex}", "type": "function",
              "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}} for n, a in parsed.calls]
    finish = "tool_calls" if calls else parsed.finish
    base = {"id": f"chatcmpl-{uuid.uuid4()}", "created": int(time.time()), "model": body.get("model")}
    counts = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    message: dict[str, Any] = {"role": "assistant", "content": parsed.text or None}
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    if calls:
        message["tool_calls"] = calls
    if not body.get("stream"):
        reply = {**base, "object": "chat.completion", "usage": counts,
                 "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        return json.dumps(reply, ensure_ascii=False).encode(), "application/json"
    chunk = {**base, "object": "chat.completion.chunk"}
    deltas = [{"role": "assistant"}]
    if parsed.reasoning:
        deltas.append({"reasoning_content": parsed.reasoning})
    if parsed.text:
        deltas.append({"content": parsed.text})
    deltas += [{"tool_calls": [{**c, "index": i}]} for i, c in enumerate(calls)]
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        (None, {**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas]
    events.append((None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {**chunk, "choices": [], "usage": counts}))
    events.append((None, "[DONE]"))
    return _sse(events), "text/event-stream"


WIRES = {"/v1/messages": (anthropic_messages, anthropic_reply), "/v1/chat/completions": (chat_messages, chat_reply)}


# --- the gateway -----------------------------------------------------------------------------------------------


class Gateway:
    def __init__(self, engine_url: str, tokenizer: Any, routing_key: bool = True) -> None:
        self.engine_url = engine_url.rstrip("/")
        self.tokenizer = tokenizer
        self.routing_key = routing_key
        self.sessions: dict[str, GatewaySession] = {}
        self.http: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for path in WIRES:
            app.router.add_post(path, self.turn)
        app.router.add_get("/health", self.health)
        app.router.add_post("/tito/sessions/{sid}/finish", self.finish_route)
        app.router.add_delete("/tito/sessions/{sid}", self.drop_route)
        app.on_cleanup.append(self.close)
        return app

    async def close(self, app: web.Application | None = None) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=True,
                                                     add_generation_prompt=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    async def turn(self, request: web.Request) -> web.Response:
        sid = request.headers.get("Authorization", "").removeprefix("Bearer ").strip() or "default"
        body = await request.json()
        translate, reply = WIRES[request.path]
        prompt = self.render(*translate(body))
        max_new = min(int(body.get("max_tokens") or MAX_NEW_TOKENS), MAX_NEW_TOKENS)
        generate = {"input_ids": prompt, "return_logprob": True,
                    "sampling_params": {"max_new_tokens": max_new, "skip_special_tokens": False,
                                        "no_stop_trim": True}}
        headers = {ROUTING_HEADER: sid} if self.routing_key else {}
        if self.http is None:
            self.http = aiohttp.ClientSession()
        async with self.http.post(f"{self.engine_url}/generate", json=generate, headers=headers) as resp:
            if resp.status != 200:
                return web.json_response({"error": {"message": f"engine answered {resp.status}"}}, status=502)
            data = await resp.json(content_type=None)
        meta = data.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs") or []
        output, logprobs = [int(p[1]) for p in pairs], [float(p[0]) for p in pairs]
        finish = "length" if (meta.get("finish_reason") or {}).get("type") == "length" else "stop"
        parsed = parse_output(self.tokenizer.decode(output, skip_special_tokens=False), finish)
        raw, content_type = reply(body, parsed, (len(prompt), len(output)))
        self.sessions.setdefault(sid, GatewaySession()).record(prompt, output, logprobs)
        return web.Response(body=raw, content_type=content_type)

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "sessions": len(self.sessions)})

    def finish(self, sid: str, reward: float) -> list[dict[str, Any]]:
        session = self.sessions.pop(sid, None)
        return session.samples(reward) if session else []

    def drop(self, sid: str) -> None:
        self.sessions.pop(sid, None)

    async def finish_route(self, request: web.Request) -> web.Response:
        data = await request.json() if await request.read() else {}
        return web.json_response({"samples": self.finish(request.match_info["sid"], float(data.get("reward", 0)))})

    async def drop_route(self, request: web.Request) -> web.Response:
        self.drop(request.match_info["sid"])
        return web.json_response({"dropped": request.match_info["sid"]})


# --- as a driver -----------------------------------------------------------------------------------------------


class GatewayDoubleTarget:
    """The gateway as a tito target, served on tito's own loop."""

    def __init__(self, options: TargetOptions) -> None:
        self.options = options
        self.routing_key = bool(options.extra.get("routing_key", True))
        self.info = TargetInfo(name="gateway-double", volatile=VOLATILE,
                               routing_header=ROUTING_HEADER if self.routing_key else None,
                               settings={"routing_key": self.routing_key})
        self.gateway: Gateway | None = None
        self.runner: web.AppRunner | None = None

    async def start(self, engine_url: str) -> str:
        self.gateway = Gateway(engine_url, load_tokenizer(self.options.tokenizer_dir), self.routing_key)
        self.runner = web.AppRunner(self.gateway.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def finish(self, session: str, reward: float) -> list[dict[str, Any]]:
        assert self.gateway is not None, "not started"
        return self.gateway.finish(session, reward)

    async def drop(self, session: str) -> None:
        assert self.gateway is not None, "not started"
        self.gateway.drop(session)

    async def stop(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            await runner.cleanup()


def create(options: TargetOptions) -> GatewayDoubleTarget:
    return GatewayDoubleTarget(options)


# --- as a process ----------------------------------------------------------------------------------------------


async def serve(engine: str, host: str, port: int, routing_key: bool, tokenizer: str | None) -> None:
    gateway = Gateway(engine, load_tokenizer(tokenizer), routing_key)
    runner = web.AppRunner(gateway.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"gateway double listening on http://{host}:{bound} (engine {engine})", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gateway_double", description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True, help="the engine's URL (tito's --engine-listen when recording)")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to serve on (port 0: any free port)")
    parser.add_argument("--no-routing-key", action="store_true", help=f"send no {ROUTING_HEADER} to the engine")
    parser.add_argument("--tokenizer", default=None, help="a Hugging Face tokenizer folder (default: Qwen3's)")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen: HOST:PORT, got {args.listen!r}")
    asyncio.run(serve(args.engine, host, int(port), not args.no_routing_key, args.tokenizer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
