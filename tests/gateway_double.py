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

Its engine leg speaks any of tito's four engine dialects (`docs/engine-dialects.md`), always with the ids it
rendered itself, so one scenario can be recorded through each (issue #31): `sglang` (the default: `/generate`),
`sglang-openai` (`/v1/chat/completions` with `input_ids` and the messages, unstreamed, as miles calls it: SGLang
refuses ids on a stream), `vllm-openai` (`/v1/completions` with `prompt: [ids]`, streamed) and `vllm-generate`
(`/inference/v1/generate` with `token_ids` and `sampling_params`, streamed). It trains on the ids and logprobs it
reads from each dialect's own fields, not on tito's view of them.

Two ways to run it: as a driver (`--target tests.gateway_double:create`, or `create_sglang_openai`,
`create_vllm_completions`, `create_vllm_generate` for the other dialects; `TargetOptions.extra`, also read as a
JSON object from $GATEWAY_DOUBLE_EXTRA so a `tito replay` can be given a gateway whose engine request changed:
`routing_key: false` for a gateway that sends no routing key, `dialect`, `sampling` (extra sampling parameters on
every engine call), `system_suffix` (appended to the system prompt before rendering), `threaded: true` (or the
factory `create_threaded`) for a gateway served from a thread and event loop of its own, so that it calls the engine
from that thread, as slime's gateway does (`slime.agent.aiohttp_threaded.run_app_in_thread`), `overtake: TEXT` for
a gateway whose engine calls overtake one another: the first request whose messages hold TEXT waits, and the next
request of its session calls the engine first (a recording's knob only: it waits for that next request, which a
replay sends only once the first reached the engine)), or as a process for the `http://` target:

    python -m tests.gateway_double --engine http://127.0.0.1:30000 --listen 127.0.0.1:8500 [--no-routing-key] \
        [--dialect vllm-generate] [--sessions-in header:x-session-id|cookie:sid|path:/proxy/rollout/{sid}] \
        [--no-session-api]

By default it takes the session from the bearer token; `--sessions-in` makes it a gateway that keeps its sessions
in a header, a cookie or the URL (its own reading, aiohttp's: the path form is a route prefix with `{sid}`), and
`--no-session-api` one without tito's session API (no samples: a 404 there, as most gateways).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from tito_rl.recorder.targets.base import ROUTING_HEADER, TargetError, TargetInfo, TargetOptions
from tito_rl.trajectory.dialects.view import DIALECTS, SGLANG, SGLANG_OPENAI, VLLM_GENERATE, VLLM_OPENAI
from tito_rl.trajectory.records import Sample
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

VOLATILE = (
    "id",
    "created",
    "message.id",
    "content[*].id",
    "content_block.id",
    "choices[*].message.tool_calls[*].id",
    "choices[*].delta.tool_calls[*].id",
)
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
        extends = [c for c in self.chains if len(c.tokens) <= len(prompt) and prompt[: len(c.tokens)] == c.tokens]
        if extends:
            chain = max(extends, key=lambda c: len(c.tokens))
            new = prompt[len(chain.tokens) :]
            chain.tokens += new + output
            chain.loss_mask += [0] * len(new) + [1] * len(output)
            chain.logprobs += [0.0] * len(new) + list(logprobs)
            chain.turns += 1
        else:
            self.chains.append(
                Chain(
                    len(prompt),
                    prompt + output,
                    [0] * len(prompt) + [1] * len(output),
                    [0.0] * len(prompt) + list(logprobs),
                )
            )

    def samples(self, reward: float) -> list[dict[str, Any]]:
        out = []
        for chain in self.chains:
            start = chain.prompt_length
            out.append(
                Sample(
                    tokens=list(chain.tokens),
                    response_length=len(chain.tokens) - start,
                    loss_mask=chain.loss_mask[start:],
                    rollout_log_probs=chain.logprobs[start:],
                    reward=reward,
                    metadata={"turns": chain.turns},
                ).to_dict()
            )
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
            message: dict[str, Any] = {
                "role": "assistant",
                "content": _text([b for b in blocks if b.get("type") == "text"]),
            }
            thinking = "".join(b.get("thinking", "") for b in blocks if b.get("type") == "thinking")
            if thinking:
                message["reasoning_content"] = thinking
            calls = [_call(b["name"], b.get("input")) for b in blocks if b.get("type") == "tool_use"]
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
    tools = [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description", ""),
                "parameters": t.get("input_schema") or {},
            },
        }
        for t in body.get("tools") or []
    ]
    return messages, tools


def chat_messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    messages = []
    for m in body.get("messages") or []:
        message: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"))}
        if m.get("reasoning_content"):
            message["reasoning_content"] = m["reasoning_content"]
        if m.get("tool_calls"):
            message["tool_calls"] = [
                _call(c["function"]["name"], c["function"].get("arguments")) for c in m["tool_calls"]
            ]
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
        reasoning, text = thought.group(1).strip(), text[thought.end() :]
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
    message = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": blocks,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }
    if not body.get("stream"):
        return json.dumps(message, ensure_ascii=False).encode(), "application/json"
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        ("message_start", {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}})
    ]
    for i, block in enumerate(blocks):
        if block["type"] == "tool_use":
            start = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        elif block["type"] == "thinking":
            start = {"type": "thinking", "thinking": ""}
            delta = {"type": "thinking_delta", "thinking": block["thinking"]}
        else:
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        events += [
            ("content_block_start", {"type": "content_block_start", "index": i, "content_block": start}),
            ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": i}),
        ]
    events += [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": usage[1]},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return _sse(events), "text/event-stream"


def chat_reply(body: dict[str, Any], parsed: Parsed, usage: tuple[int, int]) -> tuple[bytes, str]:
    calls = [
        {
            "id": f"call_{uuid.uuid4().hex}",
            "type": "function",
            "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)},
        }
        for n, a in parsed.calls
    ]
    finish = "tool_calls" if calls else parsed.finish
    base = {"id": f"chatcmpl-{uuid.uuid4()}", "created": int(time.time()), "model": body.get("model")}
    counts = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    message: dict[str, Any] = {"role": "assistant", "content": parsed.text or None}
    if parsed.reasoning:
        message["reasoning_content"] = parsed.reasoning
    if calls:
        message["tool_calls"] = calls
    if not body.get("stream"):
        reply = {
            **base,
            "object": "chat.completion",
            "usage": counts,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        }
        return json.dumps(reply, ensure_ascii=False).encode(), "application/json"
    chunk = {**base, "object": "chat.completion.chunk"}
    deltas: list[dict[str, Any]] = [{"role": "assistant"}]
    if parsed.reasoning:
        deltas.append({"reasoning_content": parsed.reasoning})
    if parsed.text:
        deltas.append({"content": parsed.text})
    deltas += [{"tool_calls": [{**c, "index": i}]} for i, c in enumerate(calls)]
    events: list[tuple[str | None, dict[str, Any] | str]] = [
        (None, {**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in deltas
    ]
    events.append((None, {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}))
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append((None, {**chunk, "choices": [], "usage": counts}))
    events.append((None, "[DONE]"))
    return _sse(events), "text/event-stream"


WIRES = {"/v1/messages": (anthropic_messages, anthropic_reply), "/v1/chat/completions": (chat_messages, chat_reply)}


# --- the engine leg, in each dialect ---------------------------------------------------------------------------

EXTRA_ENV = "GATEWAY_DOUBLE_EXTRA"  # JSON object: settings beside TargetOptions.extra (`settings_of`)
GENERATE_PATHS = {
    SGLANG: "/generate",
    SGLANG_OPENAI: "/v1/chat/completions",
    VLLM_OPENAI: "/v1/completions",
    VLLM_GENERATE: "/inference/v1/generate",
}


class EngineAnswerError(Exception):
    """The engine's answer lacks what the gateway trains on; the gateway answers its agent 502."""


@dataclass(frozen=True)
class EngineCall:
    """One generation request in a dialect: where it goes, its JSON body, and whether the answer is streamed."""

    path: str
    body: dict[str, Any]
    stream: bool


@dataclass
class Generated:
    """What the gateway keeps of an answer, whatever the dialect: output ids, their logprobs, stop or length."""

    output: list[int]
    logprobs: list[float]
    finish: str


def engine_call(
    dialect: str,
    prompt: list[int],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    max_new: int,
    sampling: dict[str, Any],
) -> EngineCall:
    """The request each dialect's gateways send for rendered ids (`sampling` lands where the dialect's sampling
    parameters live: `sampling_params`, or the root of an OpenAI-style body)."""
    if dialect == SGLANG:
        return EngineCall(
            GENERATE_PATHS[SGLANG],
            {
                "input_ids": prompt,
                "return_logprob": True,
                "sampling_params": {
                    "max_new_tokens": max_new,
                    "skip_special_tokens": False,
                    "no_stop_trim": True,
                    **sampling,
                },
            },
            False,
        )
    if dialect == SGLANG_OPENAI:  # miles' shape; SGLang answers ids and meta_info only unstreamed (400 otherwise)
        body = {
            "messages": messages,
            "input_ids": prompt,
            "max_tokens": max_new,
            "logprobs": True,
            "return_meta_info": True,
            "return_prompt_token_ids": True,
            "return_token_ids": True,
            "no_stop_trim": True,
            "skip_special_tokens": False,
            **sampling,
        }
        return EngineCall(GENERATE_PATHS[SGLANG_OPENAI], body | ({"tools": tools} if tools else {}), False)
    if dialect == VLLM_OPENAI:  # token-id prompt on vLLM's completions, streamed: ids and logprobs per chunk
        return EngineCall(
            GENERATE_PATHS[VLLM_OPENAI],
            {
                "prompt": prompt,
                "max_tokens": max_new,
                "logprobs": 0,
                "return_token_ids": True,
                "skip_special_tokens": False,
                "stream": True,
                **sampling,
            },
            True,
        )
    if dialect == VLLM_GENERATE:
        return EngineCall(
            GENERATE_PATHS[VLLM_GENERATE],
            {
                "token_ids": prompt,
                "stream": True,
                "sampling_params": {"max_tokens": max_new, "logprobs": 0, "skip_special_tokens": False, **sampling},
            },
            True,
        )
    raise ValueError(f"unknown engine dialect {dialect!r}")


def _finish(reason: Any) -> str:
    return "length" if reason == "length" else "stop"


def generated(dialect: str, answer: Any) -> Generated:
    """The output ids, logprobs and finish of an answer (a body, or a stream's chunks) from the dialect's own
    fields: `/generate`'s meta_info triples, SGLang chat's `response_token_ids` and meta_info, vLLM's per-chunk
    `token_ids` with `token_logprobs` (completions) or `logprobs.content` (generate)."""
    if dialect == SGLANG:
        meta = answer.get("meta_info") or {}
        pairs = meta.get("output_token_logprobs") or []
        return Generated(
            [int(p[1]) for p in pairs],
            [float(p[0]) for p in pairs],
            _finish((meta.get("finish_reason") or {}).get("type")),
        )
    if dialect == SGLANG_OPENAI:
        choice = (answer.get("choices") or [{}])[0]
        meta = choice.get("meta_info") or {}
        ids = choice.get("response_token_ids")
        if ids is None:
            ids = choice.get("token_ids") or []  # SGLang 0.5.17's name for the same list
        found = Generated(
            [int(t) for t in ids],
            [float(p[0]) for p in meta.get("output_token_logprobs") or []],
            _finish(choice.get("finish_reason")),
        )
    else:
        found, reason = Generated([], [], "stop"), None
        for chunk in answer:
            for choice in chunk.get("choices") or []:
                found.output += [int(t) for t in choice.get("token_ids") or []]
                logprobs = choice.get("logprobs") or {}
                found.logprobs += (
                    [float(v) for v in logprobs["token_logprobs"]]
                    if "token_logprobs" in logprobs
                    else [float(e["logprob"]) for e in logprobs.get("content") or []]
                )
                reason = choice.get("finish_reason") or reason
        found.finish = _finish(reason)
    if len(found.logprobs) != len(found.output):
        raise EngineAnswerError(f"{len(found.output)} output ids but {len(found.logprobs)} logprobs")
    return found


async def stream_chunks(resp: aiohttp.ClientResponse) -> list[dict[str, Any]]:
    """A streamed answer's `data:` JSON chunks, up to `[DONE]`."""
    chunks = []
    async for raw in resp.content:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunks.append(json.loads(data))
    return chunks


def settings_of(options: TargetOptions) -> dict[str, Any]:
    """The driver's settings: $GATEWAY_DOUBLE_EXTRA (a JSON object; how a `tito record`/`tito replay` process, which
    passes no `extra`, is given a changed gateway) under `options.extra`."""
    settings: dict[str, Any] = {}
    if os.environ.get(EXTRA_ENV):
        try:
            settings = json.loads(os.environ[EXTRA_ENV])
        except json.JSONDecodeError as exc:
            raise TargetError(f"${EXTRA_ENV} is not JSON: {exc}") from None
        if not isinstance(settings, dict):
            raise TargetError(f"${EXTRA_ENV} must be a JSON object, got {settings!r}")
    settings = {**settings, **options.extra}
    if not isinstance(settings.get("sampling") or {}, dict):
        raise TargetError(f"the gateway double's sampling must be an object, got {settings['sampling']!r}")
    if settings.get("dialect", SGLANG) not in DIALECTS:
        raise TargetError(
            f"the gateway double speaks no engine dialect {settings['dialect']!r} (one of {', '.join(DIALECTS)})"
        )
    return settings


# --- the gateway -----------------------------------------------------------------------------------------------


class Gateway:
    def __init__(
        self,
        engine_url: str,
        tokenizer: Any,
        routing_key: bool = True,
        dialect: str = SGLANG,
        sampling: dict[str, Any] | None = None,
        system_suffix: str = "",
        sessions_in: str = "bearer",
        session_api: bool = True,
        overtake: str = "",
    ) -> None:
        self.engine_url = engine_url.rstrip("/")
        self.overtake = overtake  # the first request holding this text lets the session's next one call first
        self.held: dict[str, asyncio.Future[None]] = {}  # session -> the waiting request's go-ahead
        self.overtaken: set[str] = set()
        self.tokenizer = tokenizer
        self.routing_key = routing_key
        self.dialect = dialect
        self.sampling = dict(sampling or {})  # extra sampling parameters on every engine call
        self.system_suffix = system_suffix  # appended to the system prompt: a gateway whose rendering changed
        self.sessions_in, _, self.sessions_name = sessions_in.partition(":")  # bearer, header, cookie or path
        self.session_api = session_api
        self.sessions: dict[str, GatewaySession] = {}
        self.http: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        prefix = self.sessions_name if self.sessions_in == "path" else ""
        for path in WIRES:
            app.router.add_post(prefix + path, self.turn)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        if self.session_api:
            app.router.add_post("/tito/sessions/{sid}/finish", self.finish_route)
            app.router.add_delete("/tito/sessions/{sid}", self.drop_route)
        app.on_cleanup.append(self.close)
        return app

    def session_of(self, request: web.Request) -> str:
        """Where this gateway keeps its session: the bearer token, a header, a cookie or the URL."""
        if self.sessions_in == "header":
            return request.headers.get(self.sessions_name, "") or "default"
        if self.sessions_in == "cookie":
            return request.cookies.get(self.sessions_name, "") or "default"
        if self.sessions_in == "path":
            return request.match_info["sid"]
        return request.headers.get("Authorization", "").removeprefix("Bearer ").strip() or "default"

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "double", "object": "model"}]})

    async def close(self, app: web.Application | None = None) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=True, add_generation_prompt=True
        )
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)

    async def turn(self, request: web.Request) -> web.Response:
        sid = self.session_of(request)
        body = await request.json()
        translate, reply = WIRES["/v1/" + request.path.split("/v1/", 1)[1]]
        messages, tools = translate(body)
        if self.system_suffix and messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": messages[0]["content"] + self.system_suffix}
        prompt = self.render(messages, tools)
        max_new = min(int(body.get("max_tokens") or MAX_NEW_TOKENS), MAX_NEW_TOKENS)
        call = engine_call(self.dialect, prompt, messages, tools, max_new, self.sampling)
        headers = {ROUTING_HEADER: sid} if self.routing_key else {}
        if self.http is None:
            self.http = aiohttp.ClientSession()
        overtaken = self.held.pop(sid, None)
        if overtaken is None and self.overtake and sid not in self.overtaken and self.overtake in json.dumps(messages):
            self.overtaken.add(sid)
            go = self.held[sid] = asyncio.get_running_loop().create_future()
            await go  # the session's next request calls the engine first
        try:
            async with self.http.post(f"{self.engine_url}{call.path}", json=call.body, headers=headers) as resp:
                if resp.status != 200:
                    return web.json_response({"error": {"message": f"engine answered {resp.status}"}}, status=502)
                data = await stream_chunks(resp) if call.stream else await resp.json(content_type=None)
        finally:
            if overtaken is not None:
                overtaken.set_result(None)
        try:
            answer = generated(self.dialect, data)
        except (EngineAnswerError, KeyError, TypeError, ValueError, IndexError) as exc:
            return web.json_response({"error": {"message": f"engine answer unusable: {exc}"}}, status=502)
        output, logprobs, finish = answer.output, answer.logprobs, answer.finish
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
        settings = settings_of(options)
        self.routing_key = bool(settings.get("routing_key", True))
        self.dialect = str(settings.get("dialect", SGLANG))
        self.sampling: dict[str, Any] = dict(settings.get("sampling") or {})
        self.system_suffix = str(settings.get("system_suffix") or "")
        self.threaded = bool(settings.get("threaded", False))
        self.overtake = str(settings.get("overtake") or "")
        self.info = TargetInfo(
            name="gateway-double",
            volatile=VOLATILE,
            routing_header=ROUTING_HEADER if self.routing_key else None,
            settings={"routing_key": self.routing_key, "dialect": self.dialect}
            | ({"sampling": self.sampling} if self.sampling else {})
            | ({"system_suffix": self.system_suffix} if self.system_suffix else {})
            | ({"threaded": True} if self.threaded else {}),
        )
        self.gateway: Gateway | None = None
        self.runner: web.AppRunner | None = None
        self.thread: AppThread | None = None

    async def start(self, engine_url: str) -> str:
        self.gateway = Gateway(
            engine_url,
            load_tokenizer(self.options.tokenizer_dir),
            self.routing_key,
            self.dialect,
            self.sampling,
            self.system_suffix,
            overtake=self.overtake,
        )
        if self.threaded:
            self.thread = AppThread(self.gateway.app())
            return f"http://127.0.0.1:{await asyncio.to_thread(self.thread.start)}"
        self.runner = web.AppRunner(self.gateway.app(), access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def finish(self, session: str, reward: float) -> list[dict[str, Any]]:
        gateway = self.gateway
        assert gateway is not None, "not started"
        if self.thread is not None:  # the sessions live on the gateway's own thread: read them there
            return await self.thread.call(lambda: gateway.finish(session, reward))
        return gateway.finish(session, reward)

    async def drop(self, session: str) -> None:
        gateway = self.gateway
        assert gateway is not None, "not started"
        if self.thread is not None:
            await self.thread.call(lambda: gateway.drop(session))
        else:
            gateway.drop(session)

    async def stop(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            await runner.cleanup()
        thread, self.thread = self.thread, None
        if thread is not None:
            await asyncio.to_thread(thread.stop)


class AppThread:
    """An aiohttp app served from a daemon thread running an event loop of its own, as slime serves its gateway
    (`run_app_in_thread`): every handler, and every engine call it makes, runs on that thread, beside tito's loop."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(app, access_log=None)
        self.thread = threading.Thread(target=self.loop.run_forever, name="gateway-double", daemon=True)

    def start(self) -> int:
        """Serve on a free loopback port (blocks until it listens); the port."""
        self.thread.start()

        async def listen() -> int:
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return int(site._server.sockets[0].getsockname()[1])

        return asyncio.run_coroutine_threadsafe(listen(), self.loop).result()

    async def call(self, work: Any) -> Any:
        """`work()` run on the gateway's thread, between its handlers; its result."""

        async def run() -> Any:
            return work()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.loop))

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def create(options: TargetOptions) -> GatewayDoubleTarget:
    return GatewayDoubleTarget(options)


def _in_dialect(options: TargetOptions, dialect: str) -> GatewayDoubleTarget:
    """`--target module:attribute` passes no `extra`: a factory per dialect picks it (the factory's name wins)."""
    return GatewayDoubleTarget(dataclasses.replace(options, extra={**options.extra, "dialect": dialect}))


def create_threaded(options: TargetOptions) -> GatewayDoubleTarget:
    """The gateway served from a thread of its own (`AppThread`), calling the engine from there."""
    return GatewayDoubleTarget(dataclasses.replace(options, extra={**options.extra, "threaded": True}))


def create_sglang_openai(options: TargetOptions) -> GatewayDoubleTarget:
    return _in_dialect(options, SGLANG_OPENAI)


def create_vllm_completions(options: TargetOptions) -> GatewayDoubleTarget:
    return _in_dialect(options, VLLM_OPENAI)


def create_vllm_generate(options: TargetOptions) -> GatewayDoubleTarget:
    return _in_dialect(options, VLLM_GENERATE)


# --- as a process ----------------------------------------------------------------------------------------------


async def serve(
    engine: str,
    host: str,
    port: int,
    routing_key: bool,
    tokenizer: str | None,
    dialect: str = SGLANG,
    sessions_in: str = "bearer",
    session_api: bool = True,
) -> None:
    settings = settings_of(TargetOptions())
    gateway = Gateway(
        engine,
        load_tokenizer(tokenizer),
        routing_key,
        dialect,
        settings.get("sampling"),
        str(settings.get("system_suffix") or ""),
        sessions_in,
        session_api,
    )
    runner = web.AppRunner(gateway.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    print(f"gateway double listening on http://{host}:{bound} (engine {engine}, {dialect})", flush=True)
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
    parser.add_argument("--dialect", choices=DIALECTS, default=SGLANG, help="the engine API to call")
    parser.add_argument(
        "--sessions-in",
        default="bearer",
        help="where it keeps its sessions: bearer, header:NAME, cookie:NAME, path:/prefix/{sid}",
    )
    parser.add_argument("--no-session-api", action="store_true", help="no /tito/sessions/... routes: no samples")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        parser.error(f"--listen: HOST:PORT, got {args.listen!r}")
    asyncio.run(
        serve(
            args.engine,
            host,
            int(port),
            not args.no_routing_key,
            args.tokenizer,
            args.dialect,
            args.sessions_in,
            not args.no_session_api,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
