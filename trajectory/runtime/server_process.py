"""Settings for a long-running server process (`tito serve`, `tito record`, `tito fake-engine`).

Everything loaded at startup (the tokenizer, the chat template, sglang's parsers and the modules they
import: about 460k Python objects) lives as long as the process, yet each full garbage collection walks
all of it: a pause of about 300 ms that lands on whichever agent request is in flight. Freezing the
startup objects leaves the collector only what the traffic creates.

The servers run on uvloop where it is installed (it is a dependency), the usual event loop for aiohttp
servers. On the 2-core CI VM it did not change the recording proxy's CPU per request (see benchmarks/README.md,
"What the proxy costs"); `TITO_EVENT_LOOP=asyncio` selects the stdlib loop for comparison.
"""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

from aiohttp import web

from tito_rl.trajectory.runtime.allocator import Trimmer

# gen0's threshold in a server: a pass walks every request in flight (about 6k objects at 64 sessions, 1.5 ms
# on the CI VM), however few objects the traffic has added since the last one, so passes are made rarer.
SERVER_YOUNG_THRESHOLD = 10_000
TRIMMER = web.AppKey("tito_trimmer", Trimmer)  # a served app's trimmer
EVENT_LOOP_ENV = "TITO_EVENT_LOOP"  # "asyncio" forces the stdlib loop (comparisons, debugging)


def start_up_without_gc() -> None:
    """Call first in a server process: automatic collection stays off while it loads what it serves with.

    Loading the tokenizer, transformers and sglang's parsers creates those ~460k objects, and CPython's
    automatic passes walk them again and again as they grow, though almost none is garbage: about 0.5 s of a
    4 s start on the CI VM. `prepare_to_serve` collects once, freezes what is left, and collection runs from
    the event loop while the server serves."""
    gc.disable()


def freeze_startup_objects() -> None:
    """Call once everything long-lived is loaded, just before serving."""
    gc.collect()
    gc.freeze()


def event_loop_name() -> str:
    """The loop `new_event_loop` makes: "uvloop" or "asyncio"."""
    if os.environ.get(EVENT_LOOP_ENV, "").strip().lower() == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The event loop a tito server runs on (`asyncio.Runner(loop_factory=...)`, `web.run_app(loop=...)`)."""
    if event_loop_name() == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


class LoopCollector:
    """CPython's cyclic garbage collector, run from an event-loop timer instead of inside allocations.

    An automatic collection runs in the middle of the allocation that crossed a threshold: on a server,
    always some request's parse or reply. With 64 requests waiting on the engine, a gen1 pass walks their
    coroutines, closures and buffers (about 6-8k objects, 1.5-5 ms on a small VM), and the whole pause
    was added to that one request: the p99 of `bench_recorder`. From a timer, a pass runs between callbacks,
    and delays only a request that happens to become ready during it. Generations and thresholds stay
    CPython's, except gen0's when `young_threshold` is given; a full collection (all long-lived session state)
    runs at most every `full_every_s`.
    """

    def __init__(
        self, interval_s: float = 0.02, full_every_s: float = 60.0, young_threshold: int | None = None
    ) -> None:
        self.interval_s = interval_s
        self.full_every_s = full_every_s
        t0, t1, t2 = gc.get_threshold()
        self.thresholds = (t0 if young_threshold is None else young_threshold, t1, t2)
        self.collections = [0, 0, 0]
        self._handle: asyncio.TimerHandle | None = None
        self._last_full = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """In the running loop: automatic collection off, the timer on."""
        self._loop = asyncio.get_running_loop()
        self._last_full = self._loop.time()
        gc.disable()
        self._handle = self._loop.call_later(self.interval_s, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        gc.enable()

    def collect_due(self) -> int | None:
        """Collects the generation CPython would have collected by now (None when none is due)."""
        count0, count1, count2 = gc.get_count()
        t0, t1, t2 = self.thresholds
        if count0 < t0:
            return None
        generation = 0
        if count1 >= t1:
            generation = 1
            now = self._loop.time() if self._loop else 0.0
            if count2 >= t2 and now - self._last_full >= self.full_every_s:
                generation, self._last_full = 2, now
        gc.collect(generation)
        self.collections[generation] += 1
        return generation

    def _tick(self) -> None:
        try:
            self.collect_due()
        finally:
            if self._handle is not None and self._loop is not None and not self._loop.is_closed():
                self._handle = self._loop.call_later(self.interval_s, self._tick)


def prepare_to_serve(app: Any) -> LoopCollector:
    """Call once everything long-lived is loaded, just before serving `app` (an aiohttp app) in a server
    process: freezes the startup objects and runs garbage collection from the app's loop while it serves
    (automatic collection is off until the app stops), and trims malloc's free memory periodically."""
    collector = LoopCollector(young_threshold=SERVER_YOUNG_THRESHOLD)
    trimmer = app[TRIMMER] = Trimmer()  # freed memory back to the system (`allocator`): a recorder runs for days

    async def start(_app: Any) -> None:
        collector.start()
        trimmer.start()

    async def stop(_app: Any) -> None:
        collector.stop()
        await trimmer.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    freeze_startup_objects()
    return collector
