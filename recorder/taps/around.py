"""Both taps around a target, for one recording: agent -> agent tap -> target -> engine tap -> engine.

The engine tap listens first (a driver's gateway is started with its URL; a running gateway must already point
at it), then the target starts, then the agent tap forwards to it. A stop finishes the sessions still open
through the target (reward 0), as tito's own recording proxy does, then stops everything in reverse order.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tito_rl.recorder.taps.agent_tap import AgentTap
from tito_rl.recorder.taps.attribution import Decode
from tito_rl.recorder.taps.engine_tap import EngineTap
from tito_rl.recorder.taps.recording import Recording
from tito_rl.recorder.targets.base import TargetDriver, TargetFinish
from tito_rl.trajectory.adapters.session_from import parse_session_from
from tito_rl.trajectory.adapters.tap import TrafficTap


def samples_of(finished: Any) -> list[dict[str, Any]] | None:
    """A driver's finish as plain samples (None: the target offers none)."""
    if finished is None:
        return None
    return list(finished.samples) if isinstance(finished, TargetFinish) else list(finished)


def tokenizer_decoder(tokenizer_dir: str | None) -> Decode:
    """Prompt ids to text with the recording's tokenizer, loaded at the first call that needs it (a session with
    two requests in flight), special tokens kept."""

    def decode(ids: list[int]) -> str:
        from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

        text: str = load_tokenizer(tokenizer_dir).decode(ids, skip_special_tokens=False)
        return text

    return decode


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve `app` with handlers cancelled when their client hangs up (a tap must pass the hang-up on)."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
    return runner, f"http://{host}:{bound[1]}"


@dataclass
class Endpoints:
    agent_url: str  # where agents point
    engine_url: str  # the engine URL the target uses (the engine tap)
    target_url: str


class TapsAround:
    def __init__(
        self,
        tap: TrafficTap,
        target: TargetDriver,
        engine_url: str,
        dialect: str | None = None,
        decode: Decode | None = None,
    ) -> None:
        """`decode`: prompt ids to text, so a session's concurrent requests get their own engine calls
        (`attribution`, rule 1); `tokenizer_decoder` makes one."""
        self.tap, self.target, self.engine_url, self.dialect = tap, target, engine_url, dialect
        self.recording = Recording(tap, target.info.routing_header, decode)
        # where the target keeps its sessions on the agent leg (a bad spec is the driver's bug: ValueError)
        self.session_from = parse_session_from(getattr(target.info, "session_from", "bearer") or "bearer")
        counted = getattr(tap, "without_session", None)  # the live progress line counts them apart
        if callable(counted):
            self.recording.on_sessionless = counted
        self._runners: list[web.AppRunner] = []
        self._started = False

    async def start(
        self,
        listen: tuple[str, int],
        engine_listen: tuple[str, int],
        prepare: Callable[[web.Application], Any] | None = None,
    ) -> Endpoints:
        """`prepare(app)`: called on the agent tap's app before it serves, once the target has loaded (a server
        process freezes its start-up objects there and collects garbage from the loop: `server_process`)."""
        engine_tap = EngineTap(self.recording, self.engine_url, self.dialect)
        runner, engine_tap_url = await serve(engine_tap.app(), *engine_listen)
        self._runners.append(runner)
        target_url = await self.target.start(engine_tap_url)
        self._started = True
        agent = AgentTap(self.recording, target_url, self._finish, self._drop, self.session_from)
        app = agent.app()
        if prepare is not None:
            prepare(app)
        runner, agent_url = await serve(app, *listen)
        self._runners.append(runner)
        return Endpoints(agent_url, engine_tap_url, target_url)

    async def _finish(self, sid: str, reward: float) -> list[dict[str, Any]] | None:
        return samples_of(await self.target.finish(sid, reward))

    async def _drop(self, sid: str) -> bool | None:
        return await self.target.drop(sid)

    async def stop(self) -> None:
        """Finish open sessions with reward 0 through the target, then stop the agent tap, target, engine tap."""
        if self._started:
            for sid in list(self.recording.open):
                try:
                    samples = await self._finish(sid, 0.0)
                except Exception as exc:  # noqa: BLE001 - one session's failure must not lose the others
                    print(f"tito record: finishing session {sid!r} through the target failed: {exc}", file=sys.stderr)
                    continue
                if samples is not None:
                    self.recording.finished(sid, 0.0, samples)
        for runner in reversed(self._runners[1:]):
            await runner.cleanup()
        if self._started:
            await self.target.stop()
        if self._runners:
            await self._runners[0].cleanup()
        self._runners.clear()
