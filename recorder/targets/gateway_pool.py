"""Gateways kept started between cassettes: a replay run, or a pytest process of the plugin, starts a gateway once.

Starting a gateway in a Python of its own costs seconds (verifiers imports its renderers and transformers): once per
cassette or, in the plugin, once per session item, that was most of such a replay's time. Inside `pooled()` a
`TargetHarness` borrows a started gateway and gives it back at its end instead of stopping it:

- the gateway's engine URL is an engine-leg server of the pool's, which hands each call to the harness holding
  the gateway now (a call while none holds it is answered 503);
- a driver with `reset()` (verifiers: every rollout unregistered, nothing of a session left) serves any cassette
  with the same target, options and settings; any other driver serves only the cassette it was started for (its
  sessions, as a run of `tito replay` always replayed them through one gateway), and is stopped when another
  cassette's harness borrows from the pool;
- a gateway is given back only quiet: no agent request and no engine call in flight (a late abort, say), and its
  reset done; otherwise it is stopped, and the next harness starts a fresh one. Replays stay independent: what one
  session left in the gateway cannot reach the next.

Outside `pooled()` a harness starts its own gateway and stops it at its end, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from tito_rl.recorder.taps.around import serve

QUIET_WAIT_S = 5.0  # how long a returned gateway may take to finish its engine calls before it counts as busy
EngineCall = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Lease:
    """A started gateway and its engine leg; `holder` is the engine-call handler of the harness using it."""

    key: tuple[str, ...]
    driver: Any
    url: str  # where the agent leg goes
    runner: web.AppRunner  # the engine leg the gateway was started with
    holder: EngineCall | None = None
    engine_calls: int = 0  # in flight now
    quiet: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def shared(self) -> bool:
        """Whether the gateway can serve another cassette: its driver says how to clear it between them."""
        return callable(getattr(self.driver, "reset", None))

    async def engine_call(self, request: web.Request) -> web.StreamResponse:
        holder = self.holder
        if holder is None:
            return web.json_response({"error": {"message": "replay: no cassette is being replayed now"}}, status=503)
        self.engine_calls += 1
        self.quiet.clear()
        try:
            return await holder(request)
        finally:
            self.engine_calls -= 1
            if not self.engine_calls:
                self.quiet.set()

    async def stop(self) -> None:
        self.holder = None
        try:
            with contextlib.suppress(Exception):
                await self.driver.stop()
        finally:
            await self.runner.cleanup()


def pool_key(target: str, options: Any, info: Any, cassette: str | None) -> tuple[str, ...]:
    """What must be equal for a gateway to serve a cassette: the target, the options it was started with, what
    its driver says of itself (version, settings: an environment variable's settings file included), tito's
    `TITO_*` environment; and the cassette, for a driver that cannot be cleared between cassettes."""
    settings = {k: v for k, v in sorted(os.environ.items()) if k.startswith("TITO_")}
    return (
        target,
        json.dumps(asdict(options), sort_keys=True, default=str),
        json.dumps(info.to_dict(), sort_keys=True, default=str),
        json.dumps(settings),
        cassette or "",
    )


class GatewayPool:
    """The gateways given back and not stopped, by key (see the module docstring)."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, ...], Lease] = {}
        self.started: Counter[str] = Counter()  # gateways started by this pool, by target (tests read it)

    async def borrow(
        self, target: str, options: Any, driver: Any, cassette: str, holder: EngineCall, host: str = "127.0.0.1"
    ) -> Lease:
        """A started gateway for `driver`'s target and settings (`driver` itself, started now, where none is
        idle), its engine calls going to `holder`."""
        shared = callable(getattr(driver, "reset", None))
        key = pool_key(target, options, driver.info, None if shared else cassette)
        for other in [k for k, lease in self.idle.items() if k != key and not lease.shared]:
            await self.idle.pop(other).stop()  # another cassette's gateway: it cannot serve this one
        lease = self.idle.pop(key, None)
        if lease is None:
            lease = await start_lease(key, driver, host)
            self.started[target] += 1
        lease.holder = holder
        return lease

    async def give_back(self, lease: Lease, quiet: bool) -> None:
        """Keep `lease` for the next cassette if it is `quiet` (no agent request in flight) and clears; else stop it."""
        lease.holder = None
        if quiet and lease.engine_calls:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lease.quiet.wait(), QUIET_WAIT_S)
        if not quiet or lease.engine_calls:
            await lease.stop()
            return
        if lease.shared:
            try:
                await lease.driver.reset()
            except Exception:  # noqa: BLE001 - a gateway that cannot be cleared (or died) is started afresh
                await lease.stop()
                return
        old = self.idle.pop(lease.key, None)
        if old is not None:
            await old.stop()
        self.idle[lease.key] = lease

    async def stop_unshared(self) -> None:
        """Stop the idle gateways that serve one cassette only (its sessions are done)."""
        for key in [k for k, lease in self.idle.items() if not lease.shared]:
            await self.idle.pop(key).stop()

    async def close(self) -> None:
        while self.idle:
            await self.idle.popitem()[1].stop()


async def start_lease(key: tuple[str, ...], driver: Any, host: str = "127.0.0.1", port: int = 0) -> Lease:
    """Start `driver`'s gateway against a new engine-leg server on `host`:`port` (0: a free one)."""
    app = web.Application(client_max_size=1024 * 1024 * 1024)
    lease: Lease | None = None

    async def route(request: web.Request) -> web.StreamResponse:
        assert lease is not None
        return await lease.engine_call(request)

    app.router.add_route("*", "/{tail:.*}", route)
    runner, engine_url = await serve(app, host, port)
    lease = Lease(key, driver, "", runner)
    lease.quiet.set()
    try:
        lease.url = (await driver.start(engine_url)).rstrip("/")
    except BaseException:
        await runner.cleanup()  # a driver whose start failed has stopped what it started
        raise
    return lease


_ACTIVE: list[GatewayPool] = []


def active() -> GatewayPool | None:
    """The pool harnesses borrow from now, if any."""
    return _ACTIVE[-1] if _ACTIVE else None


@contextlib.asynccontextmanager
async def pooled(pool: GatewayPool | None = None) -> AsyncIterator[GatewayPool]:
    """Harnesses created inside borrow from `pool` (a new one, closed at the end, where none is given; a given
    pool is left open for its owner to close)."""
    own = pool is None
    pool = pool or GatewayPool()
    _ACTIVE.append(pool)
    try:
        yield pool
    finally:
        _ACTIVE.remove(pool)
        if own:
            await pool.close()
