"""Each injected fault, seen by a real HTTP client on loopback."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.fake_engine_helpers import first_prompt, gen_body, serve, sse_events, until_generating
from tito_rl.fake_engine.faults import FaultSchedule, FaultSpec


def with_faults(**faults):
    return {"turns": [{"text": "one two three four five six", "faults": faults}]}


async def test_http_5xx_and_529():
    for status in (503, 529):
        async with serve(with_faults(status=status, message="Overloaded")) as (url, s, _):
            r = await s.post(url + "/generate", json=gen_body(first_prompt()))
            assert r.status == status
            assert await r.json() == {
                "object": "error",
                "message": "Overloaded",
                "type": str(status),
                "param": None,
                "code": status,
            }


async def test_added_latency_delays_the_answer():
    async with serve(with_faults(latency_ms=200)) as (url, s, _):
        t0 = time.monotonic()
        async with s.post(url + "/generate", json=gen_body(first_prompt())) as r:
            assert r.status == 200
        assert time.monotonic() - t0 >= 0.2  # a lower bound only: the delay must be there


async def test_connection_drop():
    async with serve(with_faults(drop_connection=True)) as (url, s, _):
        with pytest.raises(aiohttp.ClientError):
            async with s.post(url + "/generate", json=gen_body(first_prompt())) as r:
                await r.read()


async def test_stream_cut_after_n_chunks():
    async with serve(with_faults(cut_stream_after=2)) as (url, s, _):
        events = []
        with pytest.raises(aiohttp.ClientError):
            async with s.post(url + "/generate", json=gen_body(first_prompt(), stream=True)) as r:
                async for line in r.content:
                    if line.startswith(b"data: "):
                        events.append(line)
    assert len(events) == 2 and b"[DONE]" not in b"".join(events)


async def test_finish_by_length_and_abort_mid_generation():
    async with serve(with_faults(finish_length=3)) as (url, s, _):
        body = await (await s.post(url + "/generate", json=gen_body(first_prompt()))).json()
    assert body["meta_info"]["finish_reason"] == {"type": "length", "length": 3} and len(body["output_ids"]) == 3
    async with serve(with_faults(abort_after=2)) as (url, s, _):
        events = await sse_events(await s.post(url + "/generate", json=gen_body(first_prompt(), stream=True)))
    last = events[-2]
    assert last["meta_info"]["finish_reason"]["type"] == "abort" and len(last["output_ids"]) == 2


async def test_max_new_tokens_caps_output():
    async with serve() as (url, s, _):
        body = gen_body(first_prompt())
        body["sampling_params"]["max_new_tokens"] = 4
        async with s.post(url + "/generate", json=body) as r:
            out = await r.json()
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


async def test_engine_restart_drops_in_flight_and_reports_unhealthy():
    scenario = {
        "sessions": [
            # unhealthy for 2 s: the health check below comes a few requests after the restart, loaded machine or not
            {"match": {"routing_key": "restart"}, "turns": [{"text": "x", "faults": {"restart_s": 2.0}}]},
            {"turns": [{"text": " ".join("abcdefghij" * 4), "faults": {"token_delay_ms": 40}}]},
        ]
    }
    async with serve(scenario) as (url, s, app):
        slow = asyncio.ensure_future(s.post(url + "/generate", json=gen_body(first_prompt(), rid="slow")))
        await until_generating(app, "slow")  # in flight when the restart drops it
        with pytest.raises(aiohttp.ClientError):
            async with s.post(
                url + "/generate", json=gen_body(first_prompt(), rid="boom"), headers={"X-SMG-Routing-Key": "restart"}
            ) as r:
                await r.read()
        with pytest.raises(aiohttp.ClientError):
            await (await slow).read()
        async with s.get(url + "/health") as r:
            assert r.status == 503
        for _ in range(12_000):  # healthy again once the restart is over: a hang's bound (120 s), not a timing
            async with s.get(url + "/health") as r:
                if r.status == 200:
                    break
            await asyncio.sleep(0.01)
        assert r.status == 200
        async with s.post(url + "/generate", json=gen_body(first_prompt())) as r:
            assert r.status == 200


async def test_command_line_schedule_hits_only_the_first_requests():
    schedule = FaultSchedule(spec=FaultSpec(status=529), first=2)
    async with serve(faults=schedule) as (url, s, _):
        statuses = []
        for _ in range(3):
            async with s.post(url + "/generate", json=gen_body(first_prompt())) as r:
                statuses.append(r.status)
    assert statuses == [529, 529, 200]
