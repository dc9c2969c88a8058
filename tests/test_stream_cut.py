"""The stream-cutting relay (recorder/agents/stream_cut.py): the chosen reply stops mid-stream on a closed connection,
everything else passes through byte for byte."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tito_rl.recorder.agents.stream_cut import CuttingRelay, StreamCut, cut_events

EVENTS = b"".join(f'event: e{n}\ndata: {{"n":{n}}}\n\n'.encode() for n in range(5))


def test_cut_events_keeps_whole_events_only() -> None:
    assert cut_events(EVENTS, 2) == b'event: e0\ndata: {"n":0}\n\nevent: e1\ndata: {"n":1}\n\n'
    assert cut_events(EVENTS, 5) is None and cut_events(b'{"json": true}', 1) is None
    with pytest.raises(ValueError):
        StreamCut(0, 0)


async def test_the_chosen_reply_is_cut_and_the_others_pass_through() -> None:
    seen: list[tuple[str, bytes, str | None]] = []

    async def upstream(request: web.Request) -> web.Response:
        seen.append((request.path_qs, await request.read(), request.headers.get("Authorization")))
        return web.Response(body=EVENTS, headers={"Content-Type": "text/event-stream"})

    app = web.Application()
    app.router.add_post("/v1/messages", upstream)
    async with TestServer(app) as server:
        relay = CuttingRelay(str(server.make_url("")), [StreamCut(request=1, after_events=2)])
        url = await relay.start()
        try:
            async with aiohttp.ClientSession() as http:
                replies: list[bytes | None] = []
                for _ in range(3):
                    try:
                        async with http.post(
                            url + "/v1/messages?beta=true", data=b'{"a":1}', headers={"Authorization": "Bearer s"}
                        ) as resp:
                            replies.append(await resp.read())
                    except aiohttp.ClientPayloadError:
                        replies.append(None)
        finally:
            await relay.stop()
    assert replies == [EVENTS, None, EVENTS] and relay.cut == [1]
    assert seen == [("/v1/messages?beta=true", b'{"a":1}', "Bearer s")] * 3  # the upstream wrote all three
