"""The built-in `rllm` target: rllm's model gateway (`rllm-model-gateway` on PyPI), imported from the user's
environment and run in tito's process.

The gateway is rllm's code unchanged: `create_app(GatewayConfig(...))`, a FastAPI app served by uvicorn on a thread
of its own (as rllm's `GatewayManager._start_thread` runs it), one worker (tito's engine tap, `/v1` appended as the
gateway expects a vLLM server's API root) and the memory store. Agents call `/sessions/{sid}/v1/...`: the session
id lives in the URL, and the gateway sends no routing header of its own (it forwards the agent's headers,
`Authorization` included), so `routing_header` is None.

finish reads the session's traces from the gateway's store and builds samples as rllm's trainer does
(`tito_rl.recorder.targets.rllm_samples`). The gateway writes traces from fire-and-forget tasks, so a read right
after the last reply can miss the last trace (rllm fixed its own `/admin/flush` for this after 0.1.0). The rule
here, on the gateway's loop: wait until no request of the session is in flight (a streamed reply's trace task is
created when its stream ends), then await every pending trace write (`proxy._pending_traces`, what rllm's fixed
flush awaits), then read. Where that attribute is missing (another version), poll: until the session has as many
traces as it had agent calls (at most `FALLBACK_WAIT_S`: a call the engine failed leaves none), then until the
count is unchanged for `STABLE_READS` reads.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tito_rl.recorder.targets.base import (
    TargetError,
    TargetFinish,
    TargetInfo,
    TargetOptions,
    TargetUnavailable,
    close_loop,
)
from tito_rl.recorder.targets.rllm_samples import build_samples

DISTRIBUTION = "rllm-model-gateway"
HOW = f"pip install {DISTRIBUTION} (tito's driver was written against 0.1.0)"
# The gateway passes the engine's reply through (vLLM fills these from random ids and the wall clock): volatile
# wherever a live engine answers; pinned where the engine reply comes from a cassette.
VOLATILE = (
    "id",  # vLLM `chatcmpl-<hex>` / `cmpl-<hex>`, the same on every chunk of a stream
    "created",  # int(time.time()) on the reply and every chunk
    "choices[*].message.tool_calls[*].id",  # vLLM `chatcmpl-tool-<hex>`
    "choices[*].delta.tool_calls[*].id",  # the same, on the streamed tool-call chunk
)
SESSION_PREFIX = "/sessions/{id}"  # TargetInfo.session_path: agents' base URL is `{gateway}/sessions/<sid>/v1`
SESSION_PATH = re.compile(r"/sessions/([^/]+)(/v1(?:/.*)?)$")  # rllm_model_gateway.middleware._SESSION_PATH_RE
THREAD_NAME = "tito-rllm-gateway"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
FINISH_TIMEOUT_S = 60.0  # the longest finish waits for a session's in-flight calls
STABLE_READS = 3  # the fallback rule: this many equal trace counts, POLL_S apart
FALLBACK_WAIT_S = 2.0  # the fallback rule: the longest it waits for one trace per agent call
POLL_S = 0.02
# rllm's gateway checks `GET {worker}/health` every 10 s (3 failures: the worker is dead). Through tito those
# checks are engine-leg traffic timed by the wall clock, which no replay can reproduce: the driver's default
# interval is a day, so a recording holds none. `extra["health_check_interval"]` sets the gateway's own.
HEALTH_CHECK_INTERVAL_S = 86400.0
# The gateway's own config file (the YAML `rllm-model-gateway --config` reads), for `tito record` and `tito replay`
# alike: e.g. `add_logprobs: false` to replay a recording through a gateway that no longer asks for logprobs.
CONFIG_ENV = "TITO_RLLM_CONFIG"
FLAGS = ("add_logprobs", "add_return_token_ids", "strip_vllm_fields", "sync_traces")
# GatewayConfig fields the driver sets itself: where the gateway listens, its one worker (tito's engine tap), its store.
OWNED = ("host", "port", "workers", "db_path", "store_worker")


@dataclass
class Gateway:
    """What the driver needs of the installed package."""

    version: str
    create_app: Any
    GatewayConfig: Any
    WorkerConfig: Any
    uvicorn: Any


def import_gateway() -> Gateway:
    """rllm's gateway from the user's environment; `TargetUnavailable` (one line) where it is not installed."""
    try:
        import uvicorn
        from rllm_model_gateway import GatewayConfig, WorkerConfig, create_app
    except ImportError as exc:
        raise TargetUnavailable(f"target 'rllm': rllm_model_gateway is not importable ({exc}): {HOW}") from None
    try:
        found = version(DISTRIBUTION)
    except PackageNotFoundError:
        import rllm_model_gateway

        found = str(getattr(rllm_model_gateway, "__version__", "unknown"))
    return Gateway(found, create_app, GatewayConfig, WorkerConfig, uvicorn)


def worker_url(engine_url: str) -> str:
    """The worker URL the gateway wants: a vLLM server's API root, `/v1` (it proxies `/v1/x` to `{worker}/x`)."""
    url = engine_url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


@dataclass
class SessionCalls:
    """Agent calls per session, counted around the gateway app on its own loop (one thread: no lock)."""

    in_flight: Counter[str] = field(default_factory=Counter)
    done: Counter[str] = field(default_factory=Counter)

    def wrap(self, app: Any) -> Any:
        async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
            match = SESSION_PATH.search(scope.get("path", "")) if scope.get("type") == "http" else None
            if match is None:
                await app(scope, receive, send)
                return
            sid = match.group(1)
            self.in_flight[sid] += 1
            try:
                await app(scope, receive, send)  # returns once a streamed reply's generator has ended
            finally:
                self.in_flight[sid] -= 1
                self.done[sid] += 1

        return counted


def config_file(path: str | None) -> dict[str, Any]:
    """The knobs of a gateway config file (`TITO_RLLM_CONFIG`, rllm's own `--config` YAML) the driver applies:
    `add_logprobs`, `add_return_token_ids`, `strip_vllm_fields`, `sync_traces`, `health_check_interval`. A field the
    driver owns (listener, worker, store), an unknown field or a non-boolean flag is one line (`TargetError`): a
    replay must not silently run another gateway than the file says."""
    if not path:
        return {}
    import yaml

    where = f"target 'rllm': {CONFIG_ENV}={path}"
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"{where}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise TargetError(f"{where}: a mapping of GatewayConfig fields is expected")
    owned = sorted(k for k in data if k in OWNED)
    if owned:
        raise TargetError(f"{where}: {', '.join(owned)} set by tito's driver (listener, worker, store), not the file")
    unknown = sorted(k for k in data if k not in (*FLAGS, "health_check_interval"))
    if unknown:
        raise TargetError(
            f"{where}: unknown or unsupported field(s) {', '.join(unknown)}; supported: "
            f"{', '.join((*FLAGS, 'health_check_interval'))}"
        )
    wrong = sorted(k for k in FLAGS if k in data and not isinstance(data[k], bool))
    if wrong:
        raise TargetError(f"{where}: {', '.join(wrong)} must be true or false")
    return data


class RllmTarget:
    """rllm's model gateway as a tito target (see the module docstring)."""

    def __init__(self, options: TargetOptions) -> None:
        self.options = options
        self.gateway = import_gateway()
        extra = {**config_file(os.environ.get(CONFIG_ENV)), **options.extra}
        self.host = str(extra.get("host", "127.0.0.1"))
        self.health_check_interval = float(extra.get("health_check_interval", HEALTH_CHECK_INTERVAL_S))
        self.finish_timeout = float(extra.get("finish_timeout_s", FINISH_TIMEOUT_S))
        # GatewayConfig's own knobs, as rllm's GatewayManager passes them (their defaults unless set)
        self.flags = {k: bool(extra[k]) for k in FLAGS if k in extra}
        self.calls = SessionCalls()
        self.app: Any = None
        self.server: Any = None
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.info = TargetInfo(
            name="rllm",
            version=self.gateway.version,
            volatile=VOLATILE,
            routing_header=None,
            settings={"store": "memory", "health_check_interval": self.health_check_interval, **self.flags},
            session_path=SESSION_PREFIX,
        )

    async def start(self, engine_url: str) -> str:
        if self.server is not None:
            raise RuntimeError("the rllm target is already started")
        g = self.gateway
        worker = worker_url(engine_url)
        config = g.GatewayConfig(
            host=self.host,
            port=0,
            store_worker="memory",
            workers=[g.WorkerConfig(url=worker, worker_id="0")],
            health_check_interval=self.health_check_interval,
            **self.flags,
        )
        self.app = g.create_app(config)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))  # bound here, so the port is ours before uvicorn starts (no free-port race)
        port = sock.getsockname()[1]
        # log_config None: uvicorn leaves tito's logging alone; no access log (every agent call would be a line)
        server = self.server = g.uvicorn.Server(
            g.uvicorn.Config(
                self.calls.wrap(self.app), log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5
            )
        )
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            ready.set()
            try:
                loop.run_until_complete(server.serve(sockets=[sock]))
            except BaseException as exc:  # noqa: BLE001 - reported by start, in one line
                failure.append(exc)
            finally:
                sock.close()
                close_loop(loop)

        self.thread = threading.Thread(target=serve, name=THREAD_NAME, daemon=True)
        self.thread.start()
        await asyncio.to_thread(ready.wait, START_TIMEOUT_S)
        deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
        while not server.started:
            if failure or not self.thread.is_alive() or asyncio.get_running_loop().time() > deadline:
                why = f"{type(failure[0]).__name__}: {failure[0]}" if failure else "it did not start"
                await self.stop()
                raise TargetError(f"target 'rllm': the gateway did not start on {self.host}:{port}: {why}")
            await asyncio.sleep(POLL_S)
        return f"http://{self.host}:{port}"

    async def finish(self, session: str, reward: float) -> TargetFinish:
        traces, calls = await self._on_gateway(self._traces(session))
        built = build_samples(traces, reward)
        built.stats["calls"] = calls
        return TargetFinish(built.samples, built.stats)

    async def drop(self, session: str) -> None:
        await self._on_gateway(self._traces(session))

    async def stop(self) -> None:
        server, thread = self.server, self.thread
        if server is not None:
            server.should_exit = True  # uvicorn's own stop; its lifespan drains pending trace writes
        if thread is not None:
            await asyncio.to_thread(thread.join, STOP_TIMEOUT_S)
            if thread.is_alive() and server is not None:
                server.force_exit = True
                await asyncio.to_thread(thread.join, STOP_TIMEOUT_S)
        self.server = self.thread = self.loop = self.app = None

    async def _on_gateway(self, coro: Any) -> Any:
        """Run `coro` on the gateway's loop, where its store and pending trace writes live."""
        loop = self.loop
        if self.server is None or loop is None or loop.is_closed():
            coro.close()
            raise RuntimeError("the rllm target is not started")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    async def _traces(self, session: str) -> tuple[list[dict[str, Any]], int]:
        """The session's traces once every write of its calls has landed (the rule in the module docstring), and
        its agent calls; then the session is forgotten, as rllm's engine deletes its sessions once read."""
        state = self.app.state
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.finish_timeout
        while self.calls.in_flight[session] > 0 and loop.time() < deadline:
            await asyncio.sleep(POLL_S / 4)
        pending = getattr(state.proxy, "_pending_traces", None)
        if isinstance(pending, set):
            while pending and loop.time() < deadline:
                await asyncio.gather(*list(pending), return_exceptions=True)
        else:
            await _settled(state.store, session, self.calls.done[session], deadline)
        await state.store.flush()
        traces = list(await state.store.get_session_traces(session))
        self.calls.in_flight.pop(session, None)
        calls = self.calls.done.pop(session, 0)
        await state.sessions.delete_session(session)
        return traces, calls


async def _settled(store: Any, session: str, calls: int, deadline: float) -> None:
    """The fallback rule: one trace per agent call (waited for at most FALLBACK_WAIT_S), then the session's trace
    count unchanged for STABLE_READS reads, POLL_S apart."""
    loop = asyncio.get_running_loop()
    enough = min(deadline, loop.time() + FALLBACK_WAIT_S)
    while loop.time() < enough and len(await store.get_session_traces(session)) < calls:
        await asyncio.sleep(POLL_S)
    counts: list[int] = []
    while loop.time() < deadline:
        counts = [*counts[-(STABLE_READS - 1) :], len(await store.get_session_traces(session))]
        if len(counts) == STABLE_READS and len(set(counts)) == 1:
            return
        await asyncio.sleep(POLL_S)


def create(options: TargetOptions) -> RllmTarget:
    """The `rllm` target's factory (entry point `tito.targets: rllm`)."""
    return RllmTarget(options)
