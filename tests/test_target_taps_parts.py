"""The parts of the taps around a target, without servers: attribution of engine calls, volatile reply fields,
SSE splitting, the registry's answers."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tito_rl.recorder.taps.agent_tap import split_events
from tito_rl.recorder.taps.around import TapsAround, serve
from tito_rl.recorder.taps.attribution import Attribution, Owner
from tito_rl.recorder.targets.base import TargetError, TargetInfo, TargetOptions
from tito_rl.recorder.targets.registry import create_driver, load_factory, parse_target
from tito_rl.replayer.comparison.differences import reply_difference
from tito_rl.replayer.comparison.volatile import MASK, mask, parse_path

KEY = {"X-SMG-Routing-Key": "s1"}


def test_the_routing_key_names_the_session_and_the_oldest_request_waiting_for_a_generation() -> None:
    a = Attribution("X-SMG-Routing-Key")
    first, second = a.begin("s1", "bearer"), a.begin("s1", "bearer")
    other = a.begin("s2", "bearer")
    owner = a.owner("/generate", KEY, {"rid": "r1", "input_ids": [1, 2]})
    assert owner is not None and owner.flight is first
    a.generate_started(owner, {"rid": "r1"})
    assert a.owner("/generate", KEY, {"input_ids": [1]}).flight is second  # the next one waiting
    a.generate_started(Owner("s1", "bearer", second), {"rid": "r2"})
    assert a.owner("/generate", KEY, {"input_ids": [1]}).flight is second  # all had one: the newest (a retry)
    assert a.owner("/generate", {"X-SMG-Routing-Key": "s2"}, {}).flight is other
    # an abort carries only the rid: it goes where that generation went
    assert a.owner("/abort_request", {}, {"rid": "r1"}).flight is first
    a.end(first)
    a.end(second)
    lone = a.owner("/generate", KEY, {"input_ids": [1]})  # no request of s1 in flight: the session alone
    assert lone is not None and lone.session == "s1" and lone.flight is None


def test_without_a_routing_key_a_prompt_goes_to_the_session_whose_context_it_extends() -> None:
    a = Attribution(None)
    s1, s2 = a.begin("s1", "bearer"), a.begin("s2", "bearer")
    o1 = a.owner("/generate", KEY, {"input_ids": [5, 6]})  # no key read, no context yet: arrival order
    assert o1 is not None and o1.flight is s1
    a.generate_started(o1, {})
    a.generate_answered(o1, "/generate", {"input_ids": [5, 6]}, {"output_ids": [7, 8]}, "sglang")
    o2 = a.owner("/generate", {}, {"input_ids": [5, 6]})
    assert o2 is not None and o2.flight is s2
    a.generate_started(o2, {})
    a.generate_answered(o2, "/generate", {"input_ids": [5, 6]}, {"output_ids": [9]}, "sglang")
    a.end(s1)
    a.end(s2)
    n2, n1 = a.begin("s2", "bearer"), a.begin("s1", "bearer")
    # the next turns arrive in the other order; each prompt extends its own session's last prompt + output
    assert a.owner("/generate", {}, {"input_ids": [5, 6, 7, 8, 1]}).flight is n1
    assert a.owner("/generate", {}, {"input_ids": [5, 6, 9, 1]}).flight is n2
    assert a.owner("/health", {}, None) is None  # a call of no session: forwarded, not recorded


def test_volatile_paths_mask_exactly_the_named_fields() -> None:
    assert parse_path("choices[*].delta.tool_calls[0].id") == ("choices", None, "delta", "tool_calls", 0, "id")
    reply = {"id": "msg_1", "content": [{"type": "tool_use", "id": "toolu_a", "input": {"id": "keep"}}]}
    masked = mask(reply, ["id", "content[*].id"])
    assert masked == {"id": MASK, "content": [{"type": "tool_use", "id": MASK, "input": {"id": "keep"}}]}
    assert reply["id"] == "msg_1"  # the original is left alone
    with pytest.raises(ValueError, match="not a reply field path"):
        parse_path("content[x]")


def test_a_reply_differs_only_outside_its_volatile_fields() -> None:
    a = b'{"id":"msg_1","content":[{"type":"text","text":"hi"}]}'
    b = b'{"id":"msg_2","content":[{"type":"text","text":"hi"}]}'
    assert reply_difference(a, None, b, None) is not None  # a random id is a difference unless named
    assert reply_difference(a, None, b, None, ["id"]) is None
    c = b'{"id":"msg_3","content":[{"type":"text","text":"ho"}]}'
    assert reply_difference(a, None, c, None, ["id"]) == ["body: content[0].text", "recorded: 'hi'", "replayed: 'ho'"]
    d = b'{"content":[{"type":"text","text":"hi"}]}'  # a volatile field must still be there
    assert reply_difference(a, None, d, None, ["id"]) is not None
    events_a = ['event: message_start\ndata: {"message":{"id":"msg_1"}}\n\n']
    events_b = ['event: message_start\ndata: {"message":{"id":"msg_2"}}\n\n']
    assert reply_difference(None, events_a, None, events_b, ["message.id"]) is None
    assert reply_difference(None, events_a, None, events_b, ["id"]) is not None


def test_an_sse_body_splits_into_its_events_and_keeps_a_cut_tail() -> None:
    assert split_events("data: 1\n\ndata: 2\n\n") == ["data: 1\n\n", "data: 2\n\n"]
    assert split_events("event: a\r\ndata: 1\r\n\r\ndata: 2") == ["event: a\ndata: 1\n\n", "data: 2"]


def test_the_registry_finds_targets_or_says_why_in_one_line() -> None:
    assert parse_target(None).kind == "tito" and parse_target("http://h:1").kind == "http"
    assert parse_target("slime").kind == "driver"
    assert callable(load_factory("tito_rl.recorder.targets.tito:create"))
    with pytest.raises(TargetError, match="unknown target 'nope'"):
        load_factory("nope")
    with pytest.raises(TargetError, match="has no attribute"):
        load_factory("tito_rl.recorder.targets.tito:missing")
    with pytest.raises(TargetError, match="lacks info, start, finish, drop, stop"):
        create_driver("tests.target_variants:not_a_driver", TargetOptions())


class Collected:
    """A TrafficTap that keeps what the taps report, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self.calls.append(("request", session))

    def agent_exchange(self, session: str, source: str, exchange: Any) -> None:
        self.calls.append(("agent", exchange))

    def engine_exchange(self, session: str, source: str, exchange: Any) -> None:
        self.calls.append(("engine", exchange))

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self.calls.append(("finished", samples))

    def session_dropped(self, session: str, source: str) -> None:
        self.calls.append(("dropped", session))


class StubTarget:
    """A gateway whose replies the test decides: a stream cut after two events, or a reply that never comes."""

    info = TargetInfo("stub")

    def __init__(self) -> None:
        self.hung_up = asyncio.Event()

    async def start(self, engine_url: str) -> str:
        async def stream(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"n": 1}\n\ndata: {"n": 2}\n\n')
            request.transport.close()  # the gateway dies mid-stream
            return response

        async def slow(request: web.Request) -> web.Response:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.hung_up.set()
                raise
            return web.Response(text="late")

        app = web.Application()
        app.router.add_post("/stream", stream)
        app.router.add_post("/slow", slow)
        self.runner, url = await serve(app, "127.0.0.1", 0)
        return url

    async def finish(self, session: str, reward: float) -> list[dict[str, Any]]:
        return []

    async def drop(self, session: str) -> bool:
        return False

    async def stop(self) -> None:
        await self.runner.cleanup()


async def test_a_cut_stream_and_a_hang_up_pass_through_the_agent_tap_and_are_recorded() -> None:
    tap, target = Collected(), StubTarget()
    around = TapsAround(tap, target, "http://127.0.0.1:9")
    ends = await around.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
            async with http.post(
                ends.agent_url + "/stream", data=b"{}", headers={"Authorization": "Bearer cut-1"}
            ) as resp:
                received = b""
                with contextlib.suppress(aiohttp.ClientError):
                    async for chunk in resp.content.iter_any():
                        received += chunk
            assert received == b'data: {"n": 1}\n\ndata: {"n": 2}\n\n'  # what the gateway sent, then the cut
            with contextlib.suppress(TimeoutError):
                await http.post(
                    ends.agent_url + "/slow",
                    data=b"{}",
                    headers={"Authorization": "Bearer cut-2"},
                    timeout=aiohttp.ClientTimeout(total=0.5),
                )
            await asyncio.wait_for(target.hung_up.wait(), 120)  # the gateway saw the agent hang up
        for _ in range(2_400):  # a hang's bound (120 s), not a timing
            if sum(kind == "agent" for kind, _ in tap.calls) == 2:
                break
            await asyncio.sleep(0.05)
    finally:
        await around.stop()
    cut, gone = [e for kind, e in tap.calls if kind == "agent"]
    assert cut.status == 200 and cut.reply_events == ['data: {"n": 1}\n\n', 'data: {"n": 2}\n\n']
    assert gone.status == 499 and gone.path == "/slow"


class DropTarget(StubTarget):
    """A gateway whose drop says whether it knew the session: True, False, or None (slime's, rllm's and miles' say
    nothing)."""

    def __init__(self, knows: bool | None) -> None:
        super().__init__()
        self.knows = knows

    async def drop(self, session: str) -> bool | None:  # type: ignore[override]
        return self.knows


@pytest.mark.parametrize("knows", [True, False, None])
async def test_a_drop_answers_known_only_when_the_target_says(knows: bool | None) -> None:
    """The tap answered `known: false` for every target whose drop returns nothing, as if the gateway had never seen
    the session (found by mypy, issue #37: `bool(None)`); a target that cannot tell now answers `known: null`."""
    tap, target = Collected(), DropTarget(knows)
    around = TapsAround(tap, target, "http://127.0.0.1:9")
    ends = await around.start(("127.0.0.1", 0), ("127.0.0.1", 0))
    try:
        async with aiohttp.ClientSession() as http, http.delete(ends.agent_url + "/tito/sessions/gone-1") as resp:
            assert resp.status == 200
            assert await resp.json() == {"dropped": "gone-1", "known": knows}
    finally:
        await around.stop()
    assert ("dropped", "gone-1") in tap.calls
