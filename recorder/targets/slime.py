"""The built-in `slime` target: slime's own AnthropicAdapter and OpenAIAdapter (`slime/agent/adapters`) behind
one listener, imported from the user's slime checkout (`tito_rl.recorder.targets.slime_env`).

The gateway is slime's code unchanged: its translation, chat-template rendering, `/generate` call (with
`X-SMG-Routing-Key: <session>`), parsing, reply framing and `TrajectoryManager`. The driver only builds the
two adapters with tito's tokenizer and parser flags, mounts both adapters' routes on one aiohttp app, and serves
it on a thread of its own with slime's `run_app_in_thread`, so slime's per-turn CPU work (it re-renders the
whole history every turn) does not stall tito's taps. finish and drop run on that thread's loop, where slime's
sessions live. A session is finished by whichever adapter served it; an unknown session finishes with no
samples, as slime's own `finish_session` does.

Replies carry values slime draws from `secrets` and `time.time()`; `VOLATILE` names each (read from slime's
adapters/anthropic.py and adapters/openai.py), so replay compares everything else.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiohttp import web

from tito_rl.recorder.targets.base import ROUTING_HEADER, TargetFinish, TargetInfo, TargetOptions, close_loop
from tito_rl.recorder.targets.slime_env import Slime, import_slime
from tito_rl.recorder.targets.slime_stats import DriftLog, observe, tree_counts
from tito_rl.trajectory.records import Sample
from tito_rl.trajectory.tokens.tokenizer import fingerprint, load_tokenizer

T = TypeVar("T")

VOLATILE = (
    "id",  # Anthropic message `msg_<hex>`, OpenAI completion and chunk `chatcmpl_<hex>` (secrets.token_hex)
    "created",  # OpenAI completion and every chunk: int(time.time())
    "message.id",  # Anthropic SSE message_start
    "content[*].id",  # Anthropic tool_use blocks `toolu_<hex>`
    "content_block.id",  # Anthropic SSE content_block_start of a tool_use block
    "choices[*].message.tool_calls[*].id",  # OpenAI `call_<hex>`
    "choices[*].delta.tool_calls[*].id",  # OpenAI SSE tool-call chunk
)
MAX_BODY = 64 * 1024 * 1024  # slime's adapters' client_max_size
THREAD_NAME = "tito-slime-gateway"
SLIME_LOGGERS = (
    "slime.agent.adapters.anthropic",
    "slime.agent.adapters.openai",
    "slime.agent.adapters.common",
    "slime.agent.parsing",
    "slime.agent.trajectory",
)


class OneLine(logging.Filter):
    """Log records of the gateway in one line: an exception as its type and message, not its traceback (slime
    raises on an engine error, which aiohttp logs as "Error handling request" with the whole stack)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "aiohttp.server" and record.threadName != THREAD_NAME:
            return True  # tito's own servers
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg, record.args = f"{record.getMessage()}: {type(exc).__name__}: {exc}", ()
            record.exc_info, record.exc_text = None, None
        return True


def _one_line_logs() -> None:
    for name in ("aiohttp.server", *SLIME_LOGGERS):
        logger = logging.getLogger(name)
        if not any(isinstance(f, OneLine) for f in logger.filters):
            logger.addFilter(OneLine())


class SlimeTarget:
    """slime's two adapters as a tito target (see the module docstring)."""

    def __init__(self, options: TargetOptions) -> None:
        self.options = options
        self.slime: Slime = import_slime()
        self.observed = observe(self.slime.trajectory)
        _one_line_logs()
        self.tokenizer = load_tokenizer(options.tokenizer_dir)
        self.host = str(options.extra.get("host", "127.0.0.1"))
        self.adapters: list[Any] = []
        self.handle: Any = None
        fork_threshold = options.fork_threshold
        if fork_threshold is None:  # slime's TrajectoryManager default, as built
            fork_threshold = getattr(self.slime.trajectory.TrajectoryManager(), "_fork_threshold", None)
        self.info = TargetInfo(
            name="slime",
            version=self.slime.commit,
            volatile=VOLATILE,
            routing_header=ROUTING_HEADER,
            settings={
                "reasoning_parser": options.reasoning_parser,
                "tool_parser": options.tool_parser,
                "fork_threshold_tokens": fork_threshold,
                "tokenizer_fingerprint": fingerprint(options.tokenizer_dir),
                "sample_stand_in": self.slime.sample_stand_in,
            },
        )

    async def start(self, engine_url: str) -> str:
        if self.handle is not None:
            raise RuntimeError("the slime target is already started")
        kwargs = {
            "tokenizer": self.tokenizer,
            "sglang_url": engine_url,
            "tool_parser": self.options.tool_parser,
            "reasoning_parser": self.options.reasoning_parser,
            "fork_threshold_tokens": self.options.fork_threshold,
        }
        self.adapters = [self.slime.AnthropicAdapter(**kwargs), self.slime.OpenAIAdapter(**kwargs)]
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/healthz", self.slime.health)
        app.router.add_get("/v1/models", self.slime.health)
        for adapter in self.adapters:
            adapter._register_routes(app)  # each adapter's own routes, bound to its own _run_turn
        # As slime's own launcher runs it (examples/coding_agent_rl/generate.py): a client's disconnect cancels the
        # handler, which is what makes slime abort the engine request.
        runner = {"access_log": None, "handler_cancellation": True}
        self.handle = await asyncio.to_thread(
            self.slime.run_app_in_thread, app, host=self.host, port=0, thread_name=THREAD_NAME, runner_kwargs=runner
        )
        return f"http://{self.host}:{self.handle.port}"

    async def finish(self, session: str, reward: float) -> TargetFinish:
        return await self._on_gateway(self._finish(session, reward))

    async def drop(self, session: str) -> None:
        await self._on_gateway(self._drop(session))

    async def stop(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            await asyncio.to_thread(_stop, handle)

    async def _on_gateway(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the gateway's loop, where slime's sessions and their in-flight turns live."""
        if self.handle is None:
            coro.close()
            raise RuntimeError("the slime target is not started")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.handle.loop))

    def _holders(self, session: str) -> list[Any]:
        held = [a for a in self.adapters if a.manager.has_session(session) or session in a.store]
        return held or self.adapters[:1]  # unknown: slime's own finish answers [] (and closes the id)

    async def _finish(self, session: str, reward: float) -> TargetFinish:
        holders = self._holders(session)
        turns = sum(a.manager.turn_count(session) for a in holders)
        counts = [tree_counts(a.manager, session) for a in holders]
        leaf_counts, merge_counts = [c[0] for c in counts], [c[1] for c in counts]
        leaves = None if None in leaf_counts else sum(n for n in leaf_counts if n is not None)
        merges = None if None in merge_counts else sum(n for n in merge_counts if n is not None)
        samples: list[dict[str, Any]] = []
        with DriftLog() as log:
            for adapter in holders:
                finished = await adapter.finish_session(session, base_sample=self.slime.Sample(), reward=reward)
                samples += [tito_sample(s) for s in finished]
        stats = (
            log.stats(turns, samples, leaves, merges) if self.observed else {"turns": turns, "samples": len(samples)}
        )
        return TargetFinish(samples, stats)

    async def _drop(self, session: str) -> None:
        for adapter in self._holders(session):
            await adapter.drop_session(session)


def tito_sample(sample: Any) -> dict[str, Any]:
    """A slime `Sample` in tito's layout (`tito_rl.trajectory.records.Sample.to_dict()`), its invariants checked."""
    reward = sample.reward if isinstance(sample.reward, int | float) else 0.0
    return Sample(
        tokens=[int(t) for t in sample.tokens],
        response_length=int(sample.response_length),
        loss_mask=[int(m) for m in sample.loss_mask or []],
        rollout_log_probs=[float(x) for x in sample.rollout_log_probs or []],
        reward=float(reward),
        metadata=dict(sample.metadata or {}),
    ).to_dict()


def _stop(handle: Any) -> None:
    """slime's AppHandle.stop (cleanup, stop the loop, join), then close the loop so nothing of it is left."""
    handle.stop()
    if handle.thread.is_alive():
        return  # still shutting down after slime's join timeout: its loop cannot be closed from here
    close_loop(handle.loop)


def create(options: TargetOptions) -> SlimeTarget:
    """The `slime` target's factory (entry point `tito.targets: slime`)."""
    return SlimeTarget(options)
