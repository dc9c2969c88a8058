"""A scripted agent client: plays a client script (`recorder/scripted/script.py`) against an adapter over HTTP.

It stands in for a real agent CLI where a deterministic one is needed (the committed cassette corpus):
same wire shapes, same echo habits (`recorder/scripted/wires.py`), the session id as the bearer token,
canned tool results instead of executing anything. Per session it runs the steps in order: a user prompt
and its tool loop, a compaction, a sub-agent (a second conversation with its own system prompt on the
same token, run when the main thread calls the tool whose result names it), finish or drop through the
session API (tito's own `/tito/sessions/<id>/...`, even where a session's `path_prefix` puts its model requests
in a gateway's URL space, `/sessions/<id>/v1/...`). Retryable statuses are answered by re-sending the
byte-identical body (as Claude Code does after a 529); a scripted disconnect closes the connection
mid-generation, then re-sends. All sessions run concurrently.

    results = await run_script(load_client_script("cassettes/scenarios/tool_loop.yaml"), "http://127.0.0.1:8400")
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tito_rl.recorder.scripted.script import (
    RETRY_STATUSES,
    AgentSpec,
    CannedResult,
    ClientScript,
    ClientSession,
    Disconnect,
    Step,
)
from tito_rl.recorder.scripted.wires import WIRE_CODECS, AssistantReply, ToolCallOut, Wire
from tito_rl.trajectory.adapters.signed_cookie import sign_session

# Words of generated tool output (`{lines: N}` results): code-ish, so a line costs about as many tokens as a
# line of real output.
OUTPUT_WORDS = (
    "def",
    "return",
    "self",
    "value",
    "request",
    "context",
    "handler",
    "module",
    "config",
    "path",
    "error",
    "result",
    "items",
    "index",
    "parse",
    "build",
    "cache",
    "token",
    "session",
    "state",
    "import",
    "class",
    "async",
    "await",
    "None",
    "True",
    "False",
    "list",
    "dict",
    "str",
    "int",
    "update",
    "check",
    "write",
    "read",
    "open",
    "close",
    "data",
    "name",
    "key",
    "=",
    "(",
    ")",
    ":",
    "[",
    "]",
    "{",
    "}",
    ",",
    ".",
    "+",
    "-",
    "#",
    "0",
    "1",
    "2",
    "16",
    "42",
    "256",
    "src/",
    "tests/",
    "_test",
    ".py",
    "assert",
    "raise",
    "yield",
    "lambda",
    "for",
    "in",
    "if",
    "else",
    "while",
    "with",
)
COMPACTION_PREFIX = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The conversation is summarized below:\n"
)
USER_AGENT = "tito-scripted-client/1"


class ScriptError(Exception):
    """The adapter answered something the script cannot go on from."""


@dataclass
class SessionResult:
    session_id: str
    requests: int = 0  # model requests with distinct bodies
    sent: int = 0  # HTTP requests to the agent routes, re-sends and abandoned ones included
    retries: int = 0  # re-sends after a retryable status
    disconnects: int = 0  # requests the client walked away from
    finishes: dict[str, int] = field(default_factory=dict)  # replies by finish: stop, tool_calls, length
    samples: int | None = None  # from the finish reply
    finished_without_samples: bool = False  # finished where the target offers no samples
    dropped: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def line(self) -> str:
        end = (
            f"{self.samples} sample(s)"
            if self.samples is not None
            else "dropped"
            if self.dropped
            else "finished, the target offers no samples"
            if self.finished_without_samples
            else "left open"
        )
        what = ", ".join(f"{n} {k}" for k, n in sorted(self.finishes.items()))
        status = "ok" if self.ok else f"FAILED: {self.error}"
        return (
            f"session {self.session_id}: {status}; {self.requests} request(s) ({what}), "
            f"{self.retries} retried, {self.disconnects} disconnected; {end}"
        )


@dataclass
class Conversation:
    agent: AgentSpec
    history: list[dict[str, Any]] = field(default_factory=list)
    used: dict[str, int] = field(default_factory=dict)  # tool name -> canned results handed out


def _compact(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def no_samples(data: Any) -> bool:
    """A finish answered by tito's agent tap for a target that offers no samples (`taps.agent_tap`)."""
    error = data.get("error") if isinstance(data, dict) else None
    return isinstance(error, dict) and error.get("type") == "no_samples"


class SessionRunner:
    def __init__(self, http: aiohttp.ClientSession, base_url: str, session: ClientSession) -> None:
        self.http = http
        self.base_url = base_url.rstrip("/")
        self.session = session
        self.wire: Wire = WIRE_CODECS[session.wire]
        self.result = SessionResult(session.id)
        self.headers = {
            "Authorization": f"Bearer {session.api_key or session.id}",
            "Content-Type": "application/json",
            "Accept": self.wire.accept,
            "User-Agent": USER_AGENT,
            **session.extra_headers,
        }
        if session.wire == "anthropic":
            self.headers.update({"anthropic-version": "2023-06-01", "X-Stainless-Retry-Count": "0"})
        self.disconnects: dict[int, Disconnect] = {d.request: d for d in session.disconnects}
        # a signed session cookie (`session_cookie`): minted for the first request, then what the gateway last set
        self.cookie = (
            sign_session(session.id, session.session_cookie, int(time.time())) if session.session_cookie else None
        )

    async def run(self) -> SessionResult:
        if self.session.start_after_ms:
            await asyncio.sleep(self.session.start_after_ms / 1000)
        main = Conversation(self.session.agent)
        try:
            for step in self.session.steps:
                await self.step(main, step)
        except (ScriptError, aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
            self.result.error = f"{type(exc).__name__}: {exc}"
        return self.result

    async def step(self, conv: Conversation, step: Step) -> None:
        if step.kind == "prompt":
            await self.prompt(conv, step.text, step.max_turns)
        elif step.kind == "compact":
            summary = await self.prompt(conv, step.text, 1)
            conv.history = [self.wire.user(COMPACTION_PREFIX + summary)]
        elif step.kind == "finish":
            async with self.http.post(
                f"{self.base_url}/tito/sessions/{self.session.id}/finish", json={"reward": step.reward}
            ) as resp:
                data = await resp.json(content_type=None)
                if resp.status == 404 and no_samples(data):  # a gateway without a session API: finished, no
                    self.result.finished_without_samples = True  # samples (its replies and calls are recorded)
                    return
                if resp.status != 200:
                    raise ScriptError(f"finish answered {resp.status}: {data}")
            self.result.samples = len(data.get("samples", []))
        elif step.kind == "drop":
            async with self.http.delete(f"{self.base_url}/tito/sessions/{self.session.id}") as resp:
                if resp.status != 200:
                    raise ScriptError(f"drop answered {resp.status}: {await resp.text()}")
            self.result.dropped = True

    async def prompt(self, conv: Conversation, text: str, max_turns: int) -> str:
        """A user message, then model turns while the model calls tools; returns the last reply's text."""
        conv.history.append(self.wire.user(text))
        reply = AssistantReply([])
        for _ in range(max_turns):
            reply = await self.model_turn(conv)
            conv.history += reply.echo
            if not reply.calls:
                break
            outputs = await self.tool_results(conv, reply.calls)
            conv.history += self.wire.tool_results(reply.calls, outputs)
        return reply.text

    async def tool_results(self, conv: Conversation, calls: list[ToolCallOut]) -> list[str]:
        """Each call's result, in order; the sub-agents that calls of one reply start run at once (Claude Code runs
        parallel Agent calls concurrently), so two requests of one session are in flight together."""
        results: list[str | asyncio.Task[str]] = []
        for call in calls:
            canned = conv.agent.results.get(call.name)
            if isinstance(canned, CannedResult) and canned.subagent is not None:
                kind = call.arguments.get("subagent_type")  # the call names its sub-agent, as Claude Code's do
                sub = self.session.subagents[kind if kind in self.session.subagents else canned.subagent]
                task = call.arguments.get("prompt") or sub.prompt or "Do the task."
                results.append(asyncio.ensure_future(self.prompt(Conversation(sub), str(task), 12)))
            else:
                results.append(self.tool_result(conv, call))
        try:
            return [r if isinstance(r, str) else await r for r in results]
        finally:
            for r in results:
                if not isinstance(r, str):
                    r.cancel()

    def tool_result(self, conv: Conversation, call: ToolCallOut) -> str:
        """A canned (or generated) tool result; a sub-agent's is its run's last text (`tool_results`)."""
        canned = conv.agent.results.get(call.name)
        if isinstance(canned, list | CannedResult):
            n = conv.used.get(call.name, 0)
            conv.used[call.name] = n + 1
            if isinstance(canned, CannedResult):
                return generated_output(f"{self.session.id}/{call.name}/{n}", canned.lines or 0)
            return str(canned[min(n, len(canned) - 1)]) if canned else ""
        return "(no output)" if canned is None else str(canned)

    async def model_turn(self, conv: Conversation) -> AssistantReply:
        s = self.session
        body = _compact(
            {
                **self.wire.body(
                    s.model, conv.agent.system, conv.agent.specs, conv.history, s.max_tokens, s.stream, s.id
                ),
                **s.extra_body,
            }
        )
        index = self.result.requests
        self.result.requests += 1
        if index in self.disconnects:
            await self.walk_away(body, self.disconnects[index])
        reply = self.wire.parse(await self.send(body), s.stream)
        self.result.finishes[reply.finish] = self.result.finishes.get(reply.finish, 0) + 1
        return reply

    async def send(self, body: bytes) -> bytes:
        """POST the body; after a retryable status, the identical bytes again (Claude Code's retry)."""
        url = self.base_url + self.session.prefix + self.wire.path
        for attempt in range(self.session.retries + 1):
            self.result.sent += 1
            async with self.http.post(url, data=body, headers=self.with_cookie()) as resp:
                raw, status = await resp.read(), resp.status
                self.keep_cookie(resp)
            if status == 200:
                return raw
            if status not in RETRY_STATUSES or attempt == self.session.retries:
                raise ScriptError(f"{self.wire.path} answered {status}: {raw[:300]!r}")
            self.result.retries += 1
            await asyncio.sleep(self.session.retry_delay_ms / 1000)
        raise AssertionError("unreachable")

    def with_cookie(self) -> dict[str, str]:
        if self.session.session_cookie is None or self.cookie is None:
            return self.headers
        return {**self.headers, "Cookie": f"{self.session.session_cookie}={self.cookie}"}

    def keep_cookie(self, resp: aiohttp.ClientResponse) -> None:
        """The session cookie's new value where the gateway set one (it signs it again at every response)."""
        if self.session.session_cookie is not None:
            morsel = resp.cookies.get(self.session.session_cookie)
            if morsel is not None and morsel.value:
                self.cookie = morsel.value

    async def walk_away(self, body: bytes, plan: Disconnect) -> None:
        """Send the request on a connection of its own and close it after `after_ms`, mid-generation."""
        self.result.sent += 1
        connector = aiohttp.TCPConnector(force_close=True)
        url = self.base_url + self.session.prefix + self.wire.path
        async with aiohttp.ClientSession(connector=connector) as own:
            try:
                async with (
                    asyncio.timeout(plan.after_ms / 1000),
                    own.post(url, data=body, headers=self.with_cookie()) as resp,
                ):
                    await resp.read()
            except TimeoutError:
                self.result.disconnects += 1
            else:
                raise ScriptError(
                    f"request {plan.request} was answered ({resp.status}) before the scripted "
                    f"disconnect at {plan.after_ms} ms: slow the engine (token_delay_ms)"
                )
        await asyncio.sleep(plan.resend_after_ms / 1000)


def generated_output(seed: str, lines: int) -> str:
    """`lines` lines of code-ish words, the same for the same seed in every run and process."""
    rng = random.Random(seed)
    return "\n".join(f"{i}: " + " ".join(rng.choice(OUTPUT_WORDS) for _ in range(10)) for i in range(lines))


async def run_script(script: ClientScript, base_url: str, timeout_s: float = 300.0) -> list[SessionResult]:
    """Every session of the script, `script.concurrency` at once (default all); results in script order (a
    failed session does not stop others). `timeout_s` bounds each request."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    gate = asyncio.Semaphore(script.concurrency or max(1, len(script.sessions)))

    async def run(http: aiohttp.ClientSession, session: ClientSession) -> SessionResult:
        async with gate:
            return await SessionRunner(http, base_url, session).run()

    # no shared cookie jar: each session keeps its own cookie (`session_cookie`), never another session's
    async with aiohttp.ClientSession(timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()) as http:
        return list(await asyncio.gather(*(run(http, s) for s in script.sessions)))
