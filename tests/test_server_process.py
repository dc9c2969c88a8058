"""Server-process settings: garbage collection from the event loop, the event loop itself, engine-leg JSON."""

from __future__ import annotations

import asyncio
import gc
import json
import math
import weakref
from collections.abc import Iterator

import pytest

from tito_rl.trajectory.adapters.engine import fast_json
from tito_rl.trajectory.runtime.server_process import EVENT_LOOP_ENV, LoopCollector, event_loop_name, new_event_loop


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def _cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture
def small_thresholds() -> Iterator[None]:
    saved, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.set_threshold(50, 2, 2)
    try:
        yield
    finally:
        gc.set_threshold(*saved)
        gc.enable() if enabled else gc.disable()


async def test_cyclic_garbage_is_collected_by_the_loop_not_by_allocations(small_thresholds: None) -> None:
    collector = LoopCollector(interval_s=0.01)
    collector.start()
    try:
        assert not gc.isenabled()
        garbage = _cycle()
        keep = [Node() for _ in range(500)]  # far past gen0's threshold: an automatic pass would run here
        assert garbage() is not None  # ... but none did
        for _ in range(3_000):  # a hang's bound (30 s), not a timing
            await asyncio.sleep(0.01)
            if garbage() is None:
                break
        assert garbage() is None
        assert collector.collections[0] + collector.collections[1] >= 1
        del keep
    finally:
        collector.stop()
    assert gc.isenabled()


async def test_generations_follow_cpythons_counts_and_full_passes_are_spaced(small_thresholds: None) -> None:
    collector = LoopCollector(interval_s=3600, full_every_s=3600)
    collector.start()
    try:
        gc.collect()
        assert collector.collect_due() is None  # nothing allocated: nothing due
        generations = []
        for _ in range(12):
            keep = [Node() for _ in range(60)]  # not lists: reused from a free list, they are not counted
            generations.append(collector.collect_due())
            del keep
        assert 0 in generations and 1 in generations
        assert 2 not in generations  # gen1 counts reached gen2's threshold, but the last full pass is recent
        collector.full_every_s = 0.0
        for _ in range(12):
            keep = [Node() for _ in range(60)]  # not lists: reused from a free list, they are not counted
            generations.append(collector.collect_due())
            del keep
        assert 2 in generations
    finally:
        collector.stop()


def test_servers_run_on_uvloop_unless_told_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop

    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    loop = new_event_loop()
    try:
        assert event_loop_name() == "uvloop" and isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    loop = new_event_loop()
    try:
        assert event_loop_name() == "asyncio" and not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"meta_info": {"output_token_logprobs": [[-0.015625, 151645, null]], "e2e_latency": 1e-05}}',
        b'{"a": NaN, "b": -Infinity}',  # the stdlib accepts these; orjson does not
        b'"\\ud800 lone surrogate"',
        b'{"k": 1, "k": 2}',
    ],
)
def test_engine_replies_read_exactly_as_the_stdlib_reads_them(raw: bytes) -> None:
    ours, stdlib = fast_json.loads(raw), json.loads(raw)
    assert json.dumps(ours) == json.dumps(stdlib)
    if isinstance(stdlib, dict) and isinstance(stdlib.get("a"), float):
        assert math.isnan(ours["a"]) and ours["b"] == -math.inf


def test_bad_engine_json_is_still_a_value_error() -> None:
    with pytest.raises(ValueError):
        fast_json.loads(b"<html>502 Bad Gateway</html>")


@pytest.mark.parametrize(
    "value",
    [
        {"rid": "r", "input_ids": list(range(3000)), "sampling_params": {"temperature": 0.7, "stop": ["\u2028"]}},
        {"rid": "r", "sampling_params": {"top_k": 2**70}},  # orjson refuses: the stdlib writes it
    ],
)
def test_engine_requests_encode_to_the_same_json_value(value: dict) -> None:
    assert json.loads(fast_json.dumps(value)) == value


async def test_a_servers_young_threshold_makes_gen0_passes_rarer(small_thresholds: None) -> None:
    from tito_rl.trajectory.runtime.server_process import SERVER_YOUNG_THRESHOLD

    collector = LoopCollector(interval_s=3600, young_threshold=SERVER_YOUNG_THRESHOLD)
    collector.start()
    try:
        assert collector.thresholds == (SERVER_YOUNG_THRESHOLD, 2, 2)  # gen1 and gen2 stay CPython's
        gc.collect()
        keep = [Node() for _ in range(500)]  # ten times CPython's gen0 threshold here (50)
        assert collector.collect_due() is None
        keep += [Node() for _ in range(SERVER_YOUNG_THRESHOLD)]
        assert collector.collect_due() == 0
        del keep
    finally:
        collector.stop()


def test_free_ports_are_below_the_ephemeral_range_where_clients_take_theirs() -> None:
    """A port from bind(0) is one an outgoing connection may take before the server binds it; these are not."""
    import socket
    from pathlib import Path

    from tito_rl.recorder.processes import free_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(20)]
    assert all(10_000 <= p < low for p in ports) and len(set(ports)) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[0]))  # free when handed out
