"""A gateway adopted with a profile file (`--target FILE`, `recorder/targets/profiles/format.py`), and the built-in
profiles (`--target agentlightning`).

The driver does what the profile says: starts `start.command` (a free loopback port in `{port}`, tito's engine tap
in `{engine}`) and waits for its readiness check, makes the `setup` calls, and serves agents through a small relay
on loopback that makes a session's `sessions.open` calls before its first request goes on (create the rollout),
taking the session from where `sessions.from` says. At finish it makes the `samples.before` calls, reads
`samples.request`'s JSON body and maps it to samples as `samples.calls`/`rows`/`function` say. Every record and
replay starts the gateway afresh; the cassette's header keeps the profile (`settings.profile`): a replay checks the
user's file against it, and runs it only where the user trusts the cassette (`trust.py`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tito_rl.recorder.targets.base import TargetError, TargetFinish, TargetInfo, TargetOptions, TargetUnavailable
from tito_rl.recorder.targets.own_python.envs import ENVS, gateway_python
from tito_rl.recorder.targets.own_python.process import GatewayProcess, free_port
from tito_rl.recorder.targets.profiles.format import (
    Call,
    Profile,
    ProfileError,
    load_profile,
    parse_profile,
    profile_to_dict,
)
from tito_rl.recorder.targets.rllm_samples import build_samples
from tito_rl.trajectory.adapters.session_from import parse_session_from
from tito_rl.trajectory.records import Sample

BUILTIN_DIR = Path(__file__).resolve().parent  # the profiles tito ships (`--target NAME`)
CALL_TIMEOUT_S = 600.0
HOP = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "accept-encoding",
    }
)
_PLACEHOLDER = re.compile(r"(?<!\{)\{([a-z_][a-z0-9_]*)\}(?!\})")  # `{{name}}` is the literal `{name}`


def fill(value: Any, values: dict[str, Any]) -> Any:
    """`value` with its placeholders filled, recursively; a string that is one placeholder keeps the value's type."""
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value)
        if whole and whole.group(1) in values:
            return values[whole.group(1)]
        text = _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), value)
        return text.replace("{{", "{").replace("}}", "}")
    if isinstance(value, list | tuple):
        return [fill(v, values) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, values) for k, v in value.items()}
    return value


def select(data: Any, path: str) -> list[Any]:
    """Every value at dotted `path` in `data` (`[*]` steps into every item of a list); `""` is `data` itself."""
    found = [data]
    for part in re.findall(r"\[\*\]|[^.\[\]]+", path):
        step: list[Any] = []
        for item in found:
            if part == "[*]":
                step.extend(item if isinstance(item, list) else [])
            elif isinstance(item, dict) and part in item:
                step.append(item[part])
        found = step
    return found


def one(data: Any, path: str) -> Any:
    got = select(data, path)
    return got[0] if got else None


class ProfileTarget:
    """A gateway run as its profile says (see the module docstring)."""

    def __init__(self, profile: Profile, options: TargetOptions, source: str) -> None:
        self.profile, self.options, self.source = profile, options, source
        self.python = self._python()
        self.process = GatewayProcess(profile.name)
        self.values: dict[str, Any] = dict(profile.vars)
        self.gateway_url = ""
        self.http: aiohttp.ClientSession | None = None
        self.relay: web.AppRunner | None = None
        self.opened: set[str] = set()
        self.session_from = parse_session_from(profile.sessions.session_from)
        self.info = TargetInfo(
            name=profile.name,
            version=self._version(),
            volatile=tuple(profile.volatile),
            routing_header=profile.sessions.routing_header,
            settings={"profile": profile_to_dict(profile), "profile_source": source},
            session_path=profile.sessions.base_path,
            session_from=self.session_from.spec,
        )

    def _python(self) -> str | None:
        spec = self.profile.python
        if spec is None:
            return None
        if spec.env and os.environ.get(spec.env, "").strip():
            python = os.environ[spec.env].strip()
            if not os.access(python, os.X_OK):
                raise TargetError(f"target {self.profile.name!r}: {spec.env}={python} is not an executable")
            return python
        if spec.gateway_env in ENVS:
            try:
                return gateway_python(spec.gateway_env)
            except TargetUnavailable:
                if not spec.default:
                    raise
        if spec.default:
            return spec.default
        raise TargetUnavailable(f"target {self.profile.name!r}: no Python for it: set {spec.env or 'python.env'}")

    def _version(self) -> str | None:
        version = self.profile.version
        if version is None or isinstance(version, str):
            return version
        argv = [str(fill(x, {"python": self.python})) for x in version]
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TargetError(f"target {self.profile.name!r}: version: cannot run {argv[0]}: {exc}") from None
        if run.returncode != 0:
            lines = [x for x in run.stderr.splitlines() if x.strip()]
            raise TargetUnavailable(
                f"target {self.profile.name!r}: its version command failed: {lines[-1] if lines else run.returncode}"
            )
        return run.stdout.strip() or None

    async def start(self, engine_url: str) -> str:
        host = "127.0.0.1"
        port = free_port(host)
        self.values |= {
            "host": host,
            "port": port,
            "url": f"http://{host}:{port}",
            "engine": engine_url.rstrip("/"),
            "python": self.python or "",
        }
        start = self.profile.start
        argv = [str(fill(x, self.values)) for x in start.command]
        env = {k: str(fill(v, self.values)) for k, v in start.env.items()}
        await self.process.start(argv, env=env, cwd=fill(start.cwd, self.values) if start.cwd else None)
        self.gateway_url = f"http://{host}:{port}"
        await self.process.wait_ready(
            self.gateway_url + str(fill(start.ready.path, self.values)), start.ready.status, start.ready.timeout_s
        )
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT_S), auto_decompress=False)
        try:
            for call in self.profile.setup:
                await self.call(call, self.values, "setup")
            app = web.Application(client_max_size=1024**3)
            app.router.add_route("*", "/{tail:.*}", self._relay)
            self.relay = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await self.relay.setup()
            site = web.TCPSite(self.relay, host, 0)
            await site.start()
        except Exception:
            await self.stop()
            raise
        return f"http://{host}:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def call(self, call: Call, values: dict[str, Any], what: str) -> Any:
        """One of the profile's calls; its JSON answer (None for none); a status it does not expect raises."""
        assert self.http is not None
        path = str(fill(call.path, values))
        body = fill(call.json, values) if call.json is not None else None
        async with self.http.request(call.method, self.gateway_url + path, json=body) as response:
            text = await response.text()
            ok = response.status in call.expect if call.expect else 200 <= response.status < 300
            if not ok:
                raise TargetError(
                    f"target {self.profile.name!r}: {what} call {call.method} {path} answered "
                    f"{response.status}: {' '.join(text.split())[:200]}"
                )
        with contextlib.suppress(ValueError):
            return json.loads(text) if text else None
        return None

    async def open(self, session: str) -> None:
        """The session's `sessions.open` calls, once, before its first request."""
        if session in self.opened:
            return
        self.opened.add(session)
        for call in self.profile.sessions.open:
            await self.call(call, self.values | {"session": session}, f"session {session!r} open")

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        assert self.http is not None
        body = await request.read()
        ref = self.session_from.resolve(request.path, request.headers, request.query, body)
        if ref is not None:
            try:
                await self.open(ref.sid)
            except TargetError as exc:
                return web.json_response({"error": {"message": f"tito: {exc}"}}, status=502)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with self.http.request(
            request.method,
            self.gateway_url + request.path_qs,
            data=body or None,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None),
        ) as upstream:
            reply = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP | {"date", "server"}},
            )
            await reply.prepare(request)
            async for chunk in upstream.content.iter_any():
                await reply.write(chunk)
            await reply.write_eof()
            return reply

    async def finish(self, session: str, reward: float) -> TargetFinish | None:
        spec = self.profile.samples
        if spec is None:
            return None  # the gateway offers no samples: replies and engine calls are still compared
        values = self.values | {"session": session, "reward": float(reward)}
        for call in spec.before:
            await self.call(call, values, "finish")
        body = await self.call(spec.request, values, "samples") if spec.request is not None else None
        self.opened.discard(session)
        if spec.function is not None:
            module, _, name = spec.function.partition(":")
            got = getattr(importlib.import_module(module), name)(body, float(reward))
            return got if isinstance(got, TargetFinish) else TargetFinish(list(got), {"samples": len(got)})
        if spec.rows is not None:
            rows = spec.rows
            samples = [
                Sample(
                    tokens=[int(t) for t in one(r, rows.tokens)],
                    response_length=int(one(r, rows.response_length)),
                    loss_mask=[int(m) for m in one(r, rows.loss_mask)],
                    rollout_log_probs=[float(x) for x in one(r, rows.logprobs)],
                    reward=float(reward),
                    metadata={},
                ).to_dict()
                for r in select(body, rows.items)
            ]
            return TargetFinish(samples, {"samples": len(samples)})
        assert spec.calls is not None
        mapping = spec.calls
        entries = [e for e in select(body, mapping.items) if all(one(e, k) == v for k, v in mapping.where.items())]
        traces = [
            {
                "prompt_token_ids": one(e, mapping.prompt_ids),
                "completion_token_ids": one(e, mapping.output_ids),
                "logprobs": one(e, mapping.logprobs) if mapping.logprobs else None,
            }
            for e in entries
        ]
        if spec.merge == "prefix":
            built = build_samples(traces, reward)
            return TargetFinish(built.samples, built.stats)
        merged = [build_samples([t], reward) for t in traces]
        samples = [s for b in merged for s in b.samples]
        untrained = sum(b.stats["untrained_turns"] for b in merged)
        return TargetFinish(
            samples,
            {
                "turns": len(samples),
                "samples": len(samples),
                "forks": {},
                "merges": 0,
                "realigns": 0,
                "untrained_turns": untrained,
            },
        )

    async def drop(self, session: str) -> bool:
        known = session in self.opened
        self.opened.discard(session)
        for call in self.profile.sessions.drop:
            await self.call(call, self.values | {"session": session}, "drop")
        return known

    async def stop(self) -> None:
        if self.relay is not None:
            await self.relay.cleanup()
            self.relay = None
        if self.http is not None:
            await self.http.close()
            self.http = None
        await self.process.stop()


def from_file(path: str, options: TargetOptions) -> ProfileTarget:
    """`--target FILE`: the profile in the file, or the one a replay chose for it (`TargetOptions.extra["profile"]`:
    the user's file as read when checked against the cassette's copy, or that copy where the user trusts the
    cassette; `trust.resolve` decides, and nothing else sets it)."""
    if isinstance(options.extra.get("profile"), dict):
        try:
            return ProfileTarget(parse_profile(options.extra["profile"], where=f"{path}: "), options, path)
        except ProfileError as exc:
            raise TargetError(str(exc)) from None
    try:
        return ProfileTarget(load_profile(path), options, path)
    except ProfileError as exc:
        raise TargetError(f"target {path}: {exc}") from None


def builtin(name: str, options: TargetOptions) -> ProfileTarget:
    """A profile tito ships, by name (`recorder/targets/profiles/NAME.yaml`)."""
    try:
        return ProfileTarget(load_profile(BUILTIN_DIR / f"{name}.yaml"), options, name)
    except ProfileError as exc:
        raise TargetError(str(exc)) from None


def agentlightning(options: TargetOptions) -> ProfileTarget:
    """The `agentlightning` target: Agent Lightning's LLM proxy through its profile (`profiles/agentlightning.yaml`)."""
    return builtin("agentlightning", options)
