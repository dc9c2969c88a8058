"""Plain `tito record`'s engine URL for the trainer: where a trainer's weight updates, pauses and aborts are heard.

Recording around a target, the trainer reaches the engine through the engine tap, which keeps those calls as
engine-wide events (`engine_tap.ENGINE_WIDE_PATHS`). Recording tito's own adapter (no `--target`), the adapter
calls the engine itself, so there is no such tap: this one takes its place. It forwards every request to the
engine as is and keeps a POST to an engine-wide path as an event, placed on the same engine counter as the
adapter's own calls (`EngineClient.order`), so the cassette holds the events exactly as a target recording does.
"""

from __future__ import annotations

from aiohttp import web

from tito_rl.recorder.taps.engine_tap import EngineTap, is_engine_wide
from tito_rl.recorder.taps.recording import Recording
from tito_rl.trajectory.adapters.engine import fast_json
from tito_rl.trajectory.adapters.tap import TrafficTap


class TrainerTap(EngineTap):
    """`tap`: the cassette's (the one the adapter reports to); `next_order` of its `recording` is the engine counter
    the adapter's calls are placed on too."""

    def __init__(self, tap: TrafficTap, engine_url: str, dialect: str | None = None) -> None:
        super().__init__(Recording(tap, None), engine_url, dialect)

    def next_order(self) -> int:
        return self.recording.next_order()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if not is_engine_wide(request.method, request.path):  # health, model info, a trainer's own generations
            return await self._relay(request, body, None)
        try:
            data = fast_json.loads(body) if body else None
        except ValueError:
            data = None
        return await self._engine_wide(request, body, data)


TRAINER_TAP_KEY = web.AppKey("tito_trainer_tap", TrainerTap)  # the recording app's trainer tap (`create_recording_app`)
