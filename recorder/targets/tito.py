"""tito's own adapter app as a driver: the first target, started in-process on a loopback port.

`tito record` and `tito replay` use tito's adapter directly by default (`--target tito`), with its own taps
and exact attribution; this driver runs the same app behind the generic taps, which is how the taps around
any gateway are tested against a known system.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tito_rl.recorder.targets.base import TargetFinish, TargetInfo, TargetOptions

VOLATILE = ("created", "created_at", "response.created_at")


class TitoDriver:
    def __init__(self, options: TargetOptions) -> None:
        from tito_rl.cassette.format.records import tito_version

        self.options = options
        # `created` fields carry the engine's answer time: tito's own replay serves it from the recording, a
        # replay through the generic taps cannot.
        self.info = TargetInfo(
            "tito",
            tito_version(),
            VOLATILE,
            "X-SMG-Routing-Key",
            {
                "reasoning_parser": options.reasoning_parser,
                "tool_parser": options.tool_parser,
                "fork_threshold": options.fork_threshold,
            },
        )
        self._runner: web.AppRunner | None = None
        self._adapter: Any = None

    async def start(self, engine_url: str) -> str:
        from tito_rl.trajectory.adapters.app import ADAPTER_KEY, AdapterSettings, create_app
        from tito_rl.trajectory.manager import TrajectoryManager

        settings = AdapterSettings(
            engine_url=engine_url,
            tokenizer_dir=self.options.tokenizer_dir,
            reasoning_parser=self.options.reasoning_parser,
            tool_parser=self.options.tool_parser,
        )
        threshold = self.options.fork_threshold
        manager = TrajectoryManager() if threshold is None else TrajectoryManager(fork_threshold_tokens=threshold)
        app = create_app(settings, manager)
        self._adapter = app[ADAPTER_KEY]
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def finish(self, session: str, reward: float) -> TargetFinish:
        adapter = self._adapter
        result = adapter.manager.linearize(session, reward)
        adapter.manager.drop(session)
        adapter.sessions.pop(session, None)
        stats = result.stats
        trained = {s.turn_index for spans in result.spans for s in spans if s.trained}
        return TargetFinish(
            [s.to_dict() for s in result.samples],
            {
                "turns": stats.turns,
                "forks": dict(stats.forks),
                "realigns": stats.realigns,
                "untrained_turns": max(0, stats.turns - len(trained)),
            },
        )

    async def drop(self, session: str) -> bool:
        adapter = self._adapter
        known = session in adapter.sessions or session in adapter.manager.sessions()
        adapter.manager.drop(session)
        adapter.sessions.pop(session, None)
        return known

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def create(options: TargetOptions) -> TitoDriver:
    return TitoDriver(options)
