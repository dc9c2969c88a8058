"""What the pytest plugin's fixtures hand to users' own tests: a scripted fake engine, an in-process adapter
app, a replay function and an audit. Usable without pytest too.

Servers run on loopback in a thread with its own event loop, so a test may talk to them from plain
synchronous code or from its own event loop alike; each is stopped when its fixture ends.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web


class ThreadedServer:
    """An aiohttp app built and served inside a thread's own event loop, on 127.0.0.1 and a free port."""

    def __init__(self, make_app: Callable[[], web.Application]) -> None:
        self._make_app = make_app
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tito-test-server", daemon=True)
        self._runner: web.AppRunner | None = None
        self.app: web.Application | None = None
        self.url = ""

    def start(self) -> str:
        self._thread.start()
        self.url = self.call(self._start())
        return self.url

    async def _start(self) -> str:
        self.app = self._make_app()
        self._runner = web.AppRunner(self.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    def call(self, coro: Any, timeout_s: float = 120.0) -> Any:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def stop(self) -> None:
        if self._thread.is_alive():
            if self._runner is not None:
                self.call(self._runner.cleanup())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()


def start_fake_engine(scenario: Any, **options: Any) -> ThreadedServer:
    """A fake engine playing `scenario` (a scenario file's path, its parsed dict, or a `Scenario`), or answering
    with any policy object (`RandomPolicy(tokenizer, seed=N)`: sampling like a model)."""
    from tito_rl.fake_engine.app import EngineOptions, create_app
    from tito_rl.fake_engine.policies.scripted import Scenario, ScriptedPolicy, load_scenario, parse_scenario
    from tito_rl.fake_engine.policy import Policy
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    policy: Policy
    if isinstance(scenario, Policy):
        policy = scenario
    else:
        if isinstance(scenario, str | Path):
            scenario = load_scenario(scenario)
        elif isinstance(scenario, dict):
            scenario = parse_scenario(scenario)
        if not isinstance(scenario, Scenario):
            raise TypeError(f"a scenario is a path, a dict, a Scenario or a policy, not {type(scenario).__name__}")
        policy = ScriptedPolicy(scenario, tokenizer)
    server = ThreadedServer(lambda: create_app(policy, EngineOptions(tokenizer=tokenizer, **options)))
    server.start()
    return server


@dataclass
class AdapterHandle:
    """A running adapter app: its URL, and the adapter (its manager holds the sessions' trees)."""

    url: str
    server: ThreadedServer

    @property
    def adapter(self) -> Any:
        from tito_rl.trajectory.adapters.app import ADAPTER_KEY

        assert self.server.app is not None
        return self.server.app[ADAPTER_KEY]

    @property
    def manager(self) -> Any:
        return self.adapter.manager

    def finish(self, session: str, reward: float = 0.0) -> list[dict[str, Any]]:
        """Finish a session through the session API; its samples, as the API returns them."""
        import urllib.request

        request = urllib.request.Request(
            f"{self.url}/tito/sessions/{session}/finish",
            method="POST",
            data=json.dumps({"reward": reward}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            samples: list[dict[str, Any]] = json.loads(resp.read())["samples"]
        return samples


def start_adapter(engine_url: str, manager: Any = None, tap: Any = None, **settings: Any) -> AdapterHandle:
    """The adapter app in front of `engine_url`; `settings` are `AdapterSettings` fields."""
    from tito_rl.trajectory.adapters.app import AdapterSettings, create_app

    server = ThreadedServer(lambda: create_app(AdapterSettings(engine_url=engine_url, **settings), manager, tap))
    return AdapterHandle(server.start(), server)


def replay(
    path: str | Path,
    sessions: list[str] | None = None,
    *,
    goldens: bool = True,
    update_goldens: bool = False,
    **options: Any,
) -> Any:
    """Replay a cassette (and check its golden): a `CassetteResult`, per session `.ok`, `.differences`,
    `.finishes`. `options` are `ReplayOptions` fields. Safe to call from inside a running event loop."""
    from tito_rl.replayer.goldens import files as golden_files
    from tito_rl.replayer.replay.cassette_replay import replay_cassette
    from tito_rl.replayer.replay.options import ReplayOptions
    from tito_rl.trajectory.golden import TokenizerNames
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    options.setdefault("strict", not update_goldens)
    opts = ReplayOptions(**options)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # asyncio.run needs a thread without a loop
        result = pool.submit(replay_cassette, path, sessions, opts).result()
    if goldens and result.sessions and result.goldens_apply:
        golden_files.check(
            result, result.all_sessions, TokenizerNames(load_tokenizer(result.tokenizer_dir)), update=update_goldens
        )
    return result


def audit(path: str | Path, expect: str = "", session: str | None = None) -> Any:
    """Audit a cassette as `tito audit` does (its allowlist applied): a `CassetteAudit`. `expect` pins rules
    ("coverage>=1.0, trained-twice, logprob-mismatch": none may fire, coverage at least 1.0), for the cassette
    or one `session`; an AssertionError says each that broke."""
    from tito_rl.replayer.audit.runner import audit_cassette, parse_expectations

    result = audit_cassette(path)
    if expect:
        rules, least = parse_expectations(expect)
        problems = result.problems(rules, least, session)
        assert not problems, (
            f"tito audit of {path}" + (f" session {session}" if session else "") + ": " + "; ".join(problems)
        )
    return result
