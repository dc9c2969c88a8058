"""One shared tick notices closed transports, costs nothing while idle, and survives a new event loop."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tito_rl.trajectory.adapters.disconnects import DisconnectWatcher


@dataclass
class Transport:
    closing: bool = False

    def is_closing(self) -> bool:
        return self.closing


@dataclass
class Request:
    transport: Transport | None


async def test_only_gone_clients_complete_and_the_timer_stops_when_nothing_waits() -> None:
    watcher = DisconnectWatcher(0.01)
    staying, leaving, vanished = Request(Transport()), Request(Transport()), Request(Transport())
    futures = [watcher.watch(r) for r in (staying, leaving, vanished)]
    leaving.transport.closing = True
    vanished.transport = None
    await asyncio.wait_for(asyncio.gather(futures[1], futures[2]), 60)
    assert not futures[0].done()
    watcher.unwatch(futures[0])
    assert futures[0].cancelled()
    for _ in range(6_000):  # the next tick finds nothing to watch (10 ms away): a hang's bound (60 s), not a timing
        if watcher._timer is None:
            break
        await asyncio.sleep(0.01)
    assert watcher._timer is None  # idle: no tick scheduled


def test_a_watcher_kept_across_event_loops_still_ticks() -> None:
    watcher = DisconnectWatcher(0.01)

    async def one_run() -> None:
        request = Request(Transport())
        gone = watcher.watch(request)
        request.transport.closing = True
        await asyncio.wait_for(gone, 60)  # a hang's bound; a tick is 10 ms

    async def leave_a_timer_behind() -> None:
        watcher.watch(Request(Transport()))  # the loop ends with this request still watched

    asyncio.run(leave_a_timer_behind())
    asyncio.run(one_run())
