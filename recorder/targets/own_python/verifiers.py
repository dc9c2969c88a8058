"""The built-in `verifiers` target: verifiers' interception server (`verifiers/v1/interception/server.py`, PyPI
`verifiers` 0.4.0, prime-rl's environments), run in a Python of its own (`TITO_VERIFIERS_PYTHON`, else the cached
environment of `tito_rl.recorder.targets.own_python.envs`).

Why a process of its own: verifiers pins its own stack (pydantic-config, `renderers`, transformers, aiohttp, openai,
mcp, ...), none of which tito's environment should have to agree with; prime-rl, too, runs it apart from its trainer.

The gateway is verifiers' code unchanged: one `InterceptionServer` for every rollout, each rollout a
`RolloutSession` registered with `register(session)`, which answers the rollout's own API key; its model client is
verifiers' `TrainClient` (a `TrainClientConfig` whose `base_url` is tito's engine tap), which renders the prompt with
`renderers` and calls vLLM's `/inference/v1/generate` with `X-Session-ID: <trace id>`. `SERVE` (run with
`python -c`) adds what verifiers' own rollout does around it, through its public objects:
- sessions: a request carrying tito's session as its API key (the bearer, or `x-api-key`) registers a rollout for
  it at its first call (the trace's id is tito's session id, so the engine leg's `X-Session-ID` names it), and the
  request goes on to the interception server with the rollout's own key in its place;
- finish: the trace's branches (`Trace.branches`: one training sample per root-to-leaf path of the message graph,
  `trainable` ones only), each as `token_ids`, `sampled_mask` and `logprobs`, as prime-rl trains them; then the
  rollout is unregistered (`unregister`), as verifiers' `acquire` does when a rollout ends. The reward is tito's;
- reset (`reset()`, between cassettes of a replay run that keeps the gateway started): every rollout still
  registered is unregistered, so nothing of one cassette's sessions reaches the next's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from tito_rl.recorder.targets.base import TargetError, TargetFinish, TargetInfo, TargetOptions
from tito_rl.recorder.targets.own_python.envs import gateway_python
from tito_rl.recorder.targets.own_python.process import GatewayProcess
from tito_rl.trajectory.records import Sample
from tito_rl.trajectory.tokens.tokenizer import fingerprint, resolve_dir

ROUTING_HEADER = "X-Session-ID"  # verifiers.v1.clients.client.SESSION_ID_HEADER: the rollout's trace id
# verifiers serialises its own reply (`verifiers/v1/clients/train.py` `serialize_completion`): `id` is the engine's
# `request_id` (absent: "vf-intercept"), `created` 0, tool-call ids the renderer's. Nothing random but the engine's.
VOLATILE = ("id",)
START_TIMEOUT_S = 180.0  # the import of verifiers, renderers and transformers on a cold disk
FINISH_TIMEOUT_S = 600.0
# The rollout's settings (`TITO_VERIFIERS_CONFIG`, a YAML mapping), for `tito record` and `tito replay` alike:
# `sampling` (verifiers' SamplingConfig: what goes to the engine's `sampling_params`), `renderer` (a
# `renderers.RendererConfig`, default `{name: qwen3}`), `model`.
CONFIG_ENV = "TITO_VERIFIERS_CONFIG"
CONFIG_KEYS = ("sampling", "renderer", "model")
MODEL = "tito-model"

SERVE = r'''
"""tito's launcher of verifiers' interception server (tito_rl.recorder.targets.own_python.verifiers)."""
import asyncio, json, os, signal, socket, sys

import aiohttp
from aiohttp import web
from pydantic import TypeAdapter
from renderers import RendererConfig
from verifiers.v1.clients import ModelContext
from verifiers.v1.configs.client import TrainClientConfig
from verifiers.v1.interception import InterceptionServer
from verifiers.v1.session import RolloutSession
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import SamplingConfig

config = json.loads(sys.argv[1])
HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade"}
client = TrainClientConfig(base_url=config["engine_url"] + "/v1", api_key_var="TITO_VERIFIERS_ENGINE_KEY",
                           renderer=TypeAdapter(RendererConfig).validate_python(config["renderer"]),
                           renderer_model_name=config["tokenizer"])
sampling = SamplingConfig(**config["sampling"])
server = InterceptionServer()
rollouts = {}  # tito's session id -> (RolloutSession, model secret, state secret)
calls = {}  # tito's session id -> model calls answered 200
http = None


def rollout(sid):
    if sid not in rollouts:
        trace = Trace(id=sid, task=TraceTask(type="tito", data={"session": sid}), agent=AgentInfo(config={}))
        session = RolloutSession(ctx=ModelContext(model=config["model"], client=client, sampling=sampling),
                                 trace=trace)
        rollouts[sid] = (session, *server.register(session))
    return rollouts[sid]


def samples_of(trace, covered):
    out = []
    index = {id(node): i for i, node in enumerate(trace.nodes)}
    for branch in trace.branches:
        if not branch.trainable:
            continue
        tokens, mask, logprobs = branch.token_ids, branch.sampled_mask, branch.logprobs
        if True not in mask:
            continue
        first = mask.index(True)
        covered.update(index[id(n)] for n in branch.nodes if n.sampled)
        out.append({"tokens": [int(t) for t in tokens], "response_length": len(tokens) - first,
                    "loss_mask": [int(bool(m)) for m in mask[first:]],
                    "rollout_log_probs": [float(x) for x in logprobs[first:]],
                    "nodes": len(branch.nodes), "sampled_nodes": sum(1 for n in branch.nodes if n.sampled)})
    return out


async def finish(request):
    sid = request.match_info["sid"]
    got = rollouts.pop(sid, None)
    if got is None:
        return web.json_response({"samples": [], "known": False})
    session, model_secret, state_secret = got
    trace = session.trace
    covered = set()
    samples = samples_of(trace, covered)
    stats = {"turns": trace.num_turns, "trained_turns": len(covered), "branches": len(trace.branches),
             "calls": calls.pop(sid, 0),
             "failed_calls": sum(1 for c in trace.calls if c.error is not None),
             "request_rewrites": len(trace.request_rewrites), "response_rewrites": len(trace.response_rewrites)}
    server.unregister(model_secret, state_secret)
    return web.json_response({"samples": samples, "stats": stats, "known": True})


async def drop(request):
    sid = request.match_info["sid"]
    got = rollouts.pop(sid, None)
    calls.pop(sid, None)
    if got is not None:
        server.unregister(got[1], got[2])
    return web.json_response({"known": got is not None})


async def reset(request):  # replay's pool, between cassettes: every rollout left registered unregistered
    dropped = list(rollouts)
    for sid in dropped:
        _, model_secret, state_secret = rollouts.pop(sid)
        server.unregister(model_secret, state_secret)
    calls.clear()
    return web.json_response({"dropped": len(dropped), "registered": server.load})


def tito_session(headers):
    auth = headers.get("Authorization", "")
    if auth.startswith("Bearer ") and auth[7:]:
        return auth[7:]
    return headers.get("x-api-key") or None


async def forward(request):
    sid = tito_session(request.headers)
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    if sid is not None:
        _, secret, _ = rollout(sid)
        if "Authorization" in headers or "authorization" in headers:
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            headers["Authorization"] = f"Bearer {secret}"
        if any(k.lower() == "x-api-key" for k in headers):
            headers = {k: v for k, v in headers.items() if k.lower() != "x-api-key"}
            headers["x-api-key"] = secret
    body = await request.read()
    async with http.request(request.method, server.base_url + request.path_qs, data=body or None,
                            headers=headers) as upstream:
        if sid is not None and upstream.status == 200 and request.method == "POST":
            calls[sid] = calls.get(sid, 0) + 1
        reply = web.StreamResponse(status=upstream.status, headers={
            k: v for k, v in upstream.headers.items() if k.lower() not in HOP | {"content-encoding", "date", "server"}})
        await reply.prepare(request)
        async for chunk in upstream.content.iter_any():
            await reply.write(chunk)
        await reply.write_eof()
        return reply


async def main():
    global http
    await server.start()
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
    app = web.Application(client_max_size=1024 ** 3)
    app.router.add_get("/tito/health", lambda request: web.json_response({"ok": True}))
    app.router.add_post("/tito/sessions/{sid}/finish", finish)
    app.router.add_post("/tito/sessions/{sid}/drop", drop)
    app.router.add_post("/tito/reset", reset)
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((config["host"], 0))
    site = web.SockSite(runner, sock)
    await site.start()
    print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    parent = os.getppid()

    async def orphaned():  # tito's process killed outright: no SIGTERM comes, so leave with it
        while os.getppid() == parent:
            await asyncio.sleep(1.0)
        stop.set()

    watch = asyncio.ensure_future(orphaned())
    await stop.wait()
    watch.cancel()
    await runner.cleanup()
    await http.close()
    await server.stop()


asyncio.run(main())
'''


def config_file(path: str | None) -> dict[str, Any]:
    """`TITO_VERIFIERS_CONFIG`'s rollout settings; `TargetError` (one line) for a file that cannot be used."""
    if not path:
        return {}
    where = f"target 'verifiers': {CONFIG_ENV}={path}"
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"{where}: cannot read it: {exc}") from None
    if not isinstance(data, dict):
        raise TargetError(f"{where}: a mapping with {', '.join(CONFIG_KEYS)} is expected")
    unknown = sorted(str(k) for k in data if k not in CONFIG_KEYS)
    if unknown:
        raise TargetError(f"{where}: unknown field(s) {', '.join(unknown)}; supported: {', '.join(CONFIG_KEYS)}")
    for key in ("sampling", "renderer"):
        if key in data and not isinstance(data[key], dict):
            raise TargetError(f"{where}: {key} must be a mapping")
    return data


def gateway_version(python: str) -> str:
    """The installed verifiers' version, read in its own Python (one short run)."""
    import subprocess

    try:
        run = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(m.version('verifiers'))"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TargetError(f"target 'verifiers': cannot run {python}: {exc}") from None
    if run.returncode != 0:
        lines = [x for x in run.stderr.splitlines() if x.strip()]
        raise TargetError(f"target 'verifiers': {python} has no verifiers: {lines[-1] if lines else run.returncode}")
    return run.stdout.strip()


class VerifiersTarget:
    """verifiers' interception server as a tito target (see the module docstring)."""

    def __init__(self, options: TargetOptions) -> None:
        self.python = gateway_python("verifiers")
        extra = {**config_file(os.environ.get(CONFIG_ENV)), **options.extra}
        self.host = str(extra.get("host", "127.0.0.1"))
        self.tokenizer = str(resolve_dir(options.tokenizer_dir).resolve())
        self.sampling = dict(extra.get("sampling") or {})
        self.renderer = dict(extra.get("renderer") or {"name": "qwen3"})
        self.model = str(extra.get("model", MODEL))
        self.process = GatewayProcess("verifiers")
        self.http: aiohttp.ClientSession | None = None
        self.url = ""
        self.info = TargetInfo(
            name="verifiers",
            version=gateway_version(self.python),
            volatile=VOLATILE,
            routing_header=ROUTING_HEADER,
            settings={
                "client": "train (renderers, /inference/v1/generate)",
                "renderer": self.renderer,
                "sampling": self.sampling,
                "model": self.model,
                "tokenizer_fingerprint": fingerprint(options.tokenizer_dir),
            },
            # its generate client (renderers 0.1.12) reads logprob entries as vLLM 0.31 writes them
            # (`token: "token_id:N"`); vLLM 0.32 writes `token_id: N` and every call fails (docs/conformance.md,
            # verifiers' findings)
            fake_engine_args=("--vllm-version", "0.31.0"),
        )

    async def start(self, engine_url: str) -> str:
        config = {
            "engine_url": engine_url.rstrip("/"),
            "host": self.host,
            "tokenizer": self.tokenizer,
            "renderer": self.renderer,
            "sampling": self.sampling,
            "model": self.model,
        }
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TITO_VERIFIERS_ENGINE_KEY": "EMPTY",
            "PRIME_API_KEY": "",
            "PYTHONUNBUFFERED": "1",
        }
        port = await self.process.start(
            [self.python, "-c", SERVE, json.dumps(config)], env=env, port_line=True, timeout_s=START_TIMEOUT_S
        )
        self.url = f"http://{self.host}:{port}"
        await self.process.wait_ready(f"{self.url}/tito/health", timeout_s=START_TIMEOUT_S)
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FINISH_TIMEOUT_S))
        return self.url

    async def finish(self, session: str, reward: float) -> TargetFinish:
        got = await self._tito(session, "finish")
        samples = [
            Sample(
                tokens=s["tokens"],
                response_length=s["response_length"],
                loss_mask=s["loss_mask"],
                rollout_log_probs=s["rollout_log_probs"],
                reward=float(reward),
                metadata={"nodes": s["nodes"], "sampled_nodes": s["sampled_nodes"]},
            ).to_dict()
            for s in got.get("samples", [])
        ]
        stats = dict(got.get("stats") or {})
        merged = sum(s["sampled_nodes"] for s in got.get("samples", []))
        trained = sum(sum(s["loss_mask"]) for s in samples)
        # A branch is one sample; every branch after the first leaves the graph's path somewhere (a fork). A
        # branch holding k sampled turns merges them into one sample.
        stats.update(
            {
                "samples": len(samples),
                "forks": {"branch": len(samples) - 1} if len(samples) > 1 else {},
                "realigns": 0,
                "merges": max(0, merged - len(samples)),
                "untrained_turns": max(0, int(stats.get("turns", 0)) - int(stats.pop("trained_turns", 0))),
                "trained_tokens": trained,
                "masked_tokens": sum(s["response_length"] for s in samples) - trained,
            }
        )
        return TargetFinish(samples, stats)

    async def drop(self, session: str) -> bool:
        return bool((await self._tito(session, "drop")).get("known"))

    async def reset(self) -> None:
        """Clear the gateway for the next cassette of a replay run (`recorder/targets/gateway_pool.py`): every
        rollout still registered (a session that never finished or dropped) unregistered, as verifiers' `acquire`
        does at a rollout's end, and the launcher's call counts cleared. Raises where that is not what follows."""
        got = await self._tito("", "reset")
        if got.get("registered") != 0:
            raise RuntimeError(f"verifiers still holds {got.get('registered')} rollout(s) after a reset")

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.close()
            self.http = None
        await self.process.stop()

    async def _tito(self, session: str, op: str) -> dict[str, Any]:
        if self.http is None:
            raise RuntimeError("the verifiers target is not started")
        url = f"{self.url}/tito/sessions/{session}/{op}" if session else f"{self.url}/tito/{op}"
        async with self.http.post(url) as response:
            if response.status != 200:
                raise RuntimeError(
                    f"verifiers' launcher answered {response.status} to {op}: {(await response.text())[:300]}"
                )
            data = await response.json()
        return data if isinstance(data, dict) else {}


def create(options: TargetOptions) -> VerifiersTarget:
    """The `verifiers` target's factory (entry point `tito.targets: verifiers`)."""
    return VerifiersTarget(options)
