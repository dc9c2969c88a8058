"""The engine leg replays the engine's bytes (`cassette/answer_bytes.py`): a gateway that passes the engine's answer
on untouched sends its agent what the engine sent, so a replay that served the same JSON re-encoded failed on every
reply ("same JSON, different bytes"). Recorded through `tito record` around such a gateway over real HTTP on loopback,
with engines that write compact JSON (FastAPI's, orjson's), Python's spaced default, SSE with either event
separator, and bodies no encoder reproduces (kept as bytes): replayed twice, both green, and the bytes the gateway
received from the replayed engine leg are the recorded ones exactly. A gateway that changes a byte still fails."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.process_helpers import free_port, tito
from tests.test_targets_record_replay import replay
from tito_rl.cassette.answer_bytes import answer_bytes, answer_wire
from tito_rl.cassette.format.checks import check_fields
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.records import EngineRecord, Header
from tito_rl.cassette.reader import CassetteReader, read_cassette
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.recorder.taps.engine_tap import _parsed, event_jsons
from tito_rl.trajectory.adapters.tap import EngineExchange

# One worker runs this module (tests/xdist_groups.py): its module-scoped recording is made once.
pytestmark = pytest.mark.xdist_group("engine_bytes")
SESSION_FROM = "path:/proxy/{sid}"


def _answer(mode: str, n: int) -> dict[str, Any]:
    """A chat completion as an engine writes one: a float Python writes `-1e-05` and orjson `-0.00001`, non-ASCII."""
    return {
        "id": f"chatcmpl-{mode}-{n}",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"Voilà, {mode} {n}."},
                "logprobs": {"content": [{"token": "Voil", "logprob": -1e-05}, {"token": "à", "logprob": -0.25}]},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
    }


def _chunks(mode: str, n: int) -> list[dict[str, Any]]:
    base = {"id": f"chatcmpl-{mode}-{n}", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}
    deltas = [{"role": "assistant", "content": ""}, {"content": "Voilà"}, {"content": f", {mode} {n}."}]
    logprobs = {"content": [{"token": "Voil", "logprob": -1e-05}]}  # orjson and Python write it differently
    chunks = [
        {**base, "choices": [{"index": 0, "delta": d, "logprobs": logprobs, "finish_reason": None}]} for d in deltas
    ]
    chunks[-1]["choices"][0]["finish_reason"] = "stop"
    return chunks


def _compact(value: Any) -> bytes:  # FastAPI/Starlette's JSONResponse
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


# What each engine sends for the n-th call: (Content-Type, body); a stream's whole text.
ENGINES: dict[str, Callable[[int], tuple[str, bytes]]] = {
    "compact": lambda n: ("application/json", _compact(_answer("compact", n))),
    "orjson": lambda n: ("application/json", orjson.dumps(_answer("orjson", n))),
    "spaced": lambda n: ("application/json; charset=utf-8", json.dumps(_answer("spaced", n)).encode()),
    # a number no encoder writes so (`2.50`): the bytes themselves are kept
    "odd": lambda n: ("application/json", _compact(_answer("odd", n)).replace(b'"total_tokens":14', b'"x":2.50')),
    "sse": lambda n: (
        "text/event-stream; charset=utf-8",
        b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in _chunks("sse", n)) + b"data: [DONE]\n\n",
    ),
    "sse-crlf": lambda n: (
        "text/event-stream",
        b"".join(b"data: " + _compact(c) + b"\r\n\r\n" for c in _chunks("sse-crlf", n)) + b"data: [DONE]\r\n\r\n",
    ),
    # a keep-alive comment between events: the framing is kept as bytes
    "sse-ping": lambda n: (
        "text/event-stream",
        b"data: " + orjson.dumps(_chunks("sse-ping", n)[0]) + b"\n\n: ping\n\n"
        b"data: " + orjson.dumps(_chunks("sse-ping", n)[1]) + b"\n\ndata: [DONE]\n\n",
    ),
}


class Engine:
    """Answers each chat call as the engine its last user message names (`ENGINES`)."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path != "/v1/chat/completions":  # tito record's look at the engine (health, model info)
            return web.json_response({"error": "not here"}, status=404)
        body = await request.json()
        mode = body["messages"][-1]["content"].split()[0]
        n = self.calls[mode] = self.calls.get(mode, 0) + 1
        content_type, data = ENGINES[mode](n)
        if content_type.startswith("text/event-stream"):
            response = web.StreamResponse(headers={"Content-Type": content_type})
            await response.prepare(request)
            for at in range(0, len(data), 97):  # written in pieces, as an engine streams
                await response.write(data[at : at + 97])
            await response.write_eof()
            return response
        return web.Response(body=data, headers={"Content-Type": content_type})


class PassThrough:
    """A gateway that keeps its sessions in the URL (`/proxy/<sid>/...`), has no session API, and passes the
    engine's answer on untouched: status, Content-Type and every byte, a stream as it comes. It keeps what the
    engine sent it, per session. `tamper`: it adds a space after the body's first `:` (the same JSON)."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.received: dict[str, list[bytes]] = {}
        self.tamper = False
        self.url = ""  # where it listens
        self.http: aiohttp.ClientSession | None = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/health":
            return web.Response(text="ok")
        parts = request.path.split("/", 3)  # "", "proxy", sid, rest
        if len(parts) < 4 or parts[1] != "proxy":
            return web.Response(status=404)
        if self.http is None:
            self.http = aiohttp.ClientSession(auto_decompress=False)
        sid = parts[2]
        async with self.http.post(
            f"{self.engine}/{parts[3]}", data=await request.read(), headers={"Content-Type": "application/json"}
        ) as upstream:
            headers = {"Content-Type": upstream.headers["Content-Type"]}
            if upstream.content_type == "text/event-stream":
                response = web.StreamResponse(status=upstream.status, headers=headers)
                await response.prepare(request)
                got = bytearray()
                async for chunk in upstream.content.iter_any():
                    got += chunk
                    await response.write(chunk)
                await response.write_eof()
                self.received.setdefault(sid, []).append(bytes(got))
                return response
            data = await upstream.read()
        self.received.setdefault(sid, []).append(data)
        if self.tamper:
            data = data.replace(b'":', b'": ', 1)
        return web.Response(status=upstream.status, body=data, headers=headers)


@contextmanager
def serving(*handlers: Callable[[web.Request], Any]) -> Iterator[tuple[list[str], asyncio.AbstractEventLoop]]:
    """Each handler as an aiohttp app on its own loopback port, on an event loop in a thread of this process."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners: list[web.AppRunner] = []

    async def start(handler: Callable[[web.Request], Any]) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    try:
        yield [asyncio.run_coroutine_threadsafe(start(h), loop).result(30) for h in handlers], loop
    finally:

        async def cleanup() -> None:
            for runner in runners:
                await runner.cleanup()
            for handler in handlers:
                http = getattr(getattr(handler, "__self__", None), "http", None)
                if http is not None:
                    await http.close()

        asyncio.run_coroutine_threadsafe(cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


def _chat(url: str, sid: str, mode: str, turn: int) -> None:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": f"{mode} turn {turn}"}]}
    if mode.startswith("sse"):
        body["stream"] = True
    request = urllib.request.Request(
        f"{url}/proxy/{sid}/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        resp.read()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, PassThrough, int]]:
    """One recording, a session per engine of `ENGINES` (two calls each), through `tito record --target http://`;
    yields the cassette, the gateway (still running, its engine URL the engine tap's address) and that port."""
    out = tmp_path_factory.mktemp("engine_bytes") / "pass_through.tito"
    engine = Engine()
    listen, port = free_port(), free_port()
    gateway = PassThrough(f"http://127.0.0.1:{listen}")
    with serving(engine.handle, gateway.handle) as ((engine_url, gateway.url), _):
        with tito(
            "record",
            "--engine",
            engine_url,
            "--target",
            gateway.url,
            "--engine-listen",
            f"127.0.0.1:{listen}",
            "--listen",
            f"127.0.0.1:{port}",
            "--out",
            str(out),
            "--session-from",
            SESSION_FROM,
            "--routing-header",
            "none",
            ready=f"http://127.0.0.1:{port}/health",
        ) as rec:
            for turn in (1, 2):
                for mode in ENGINES:
                    _chat(f"http://127.0.0.1:{port}", f"ro-{mode}", mode, turn)
            rec.send_signal(signal.SIGINT)
            err = rec.communicate(timeout=60)[1].decode()
            assert rec.returncode == 0, err[-3000:]
        yield out, gateway, listen


@pytest.mark.slow
def test_a_pass_through_gateway_replays_green_twice_with_the_engines_bytes(
    recorded: tuple[Path, PassThrough, int],
) -> None:
    out, gateway, listen = recorded
    live = {sid: list(bodies) for sid, bodies in gateway.received.items()}
    assert set(live) == {f"ro-{mode}" for mode in ENGINES} and all(len(b) == 2 for b in live.values())
    cassette = read_cassette(out)
    wires = {name: [e.wire or {} for e in log.engine] for name, log in cassette.sessions.items()}
    # how each engine's bytes are kept: an encoding that reproduces them, else the bytes
    assert {name: w[0].get("style", "raw") for name, w in wires.items()} == {
        "ro-compact": "compact",
        "ro-orjson": "orjson",
        "ro-spaced": "spaced",
        "ro-odd": "raw",
        "ro-sse": "orjson",
        "ro-sse-crlf": "compact",
        "ro-sse-ping": "raw",
    }
    assert wires["ro-sse-crlf"][0]["sse"] == "\r\n\r\n" and wires["ro-sse"][0]["done"] is True
    # the gateway's engine URL is where the replay's engine leg listens now
    args = (str(out), "--target", gateway.url, "--engine-listen", f"127.0.0.1:{listen}")
    runs = []
    for extra in (("--update-goldens",), (), ()):
        gateway.received.clear()
        run = replay(*args, *extra)
        runs.append(run)
        assert run.returncode == 0, run.stdout + run.stderr
        assert gateway.received == live  # the replayed engine leg sent the gateway the recorded bytes exactly
    assert runs[1].stdout == runs[2].stdout and f"{len(ENGINES)} session(s): {len(ENGINES)} ok" in runs[1].stdout


def test_a_gateway_that_changes_a_byte_still_fails(recorded: tuple[Path, PassThrough, int]) -> None:
    out, gateway, listen = recorded
    gateway.tamper = True
    try:
        run = replay(str(out), "--target", gateway.url, "--engine-listen", f"127.0.0.1:{listen}")
    finally:
        gateway.tamper = False
    assert run.returncode == 1, run.stdout + run.stderr
    assert "same JSON, different bytes" in run.stdout, run.stdout


def test_a_recording_from_before_wires_still_replays_re_encoded(
    recorded: tuple[Path, PassThrough, int], tmp_path: Path
) -> None:
    """An engine record without a wire (every cassette before it existed) is served as before: re-encoded."""
    out, gateway, listen = recorded
    old = tmp_path / "old.tito"
    with CassetteReader(out) as reader, CassetteWriter(old, reader.header, header_redacted=True) as writer:
        for record in reader.records():
            if isinstance(record, EngineRecord):
                record.wire = None
            writer.append_redacted(record)
    assert b"wire" not in old.read_bytes()  # the engine records as an older tito wrote them
    gateway.received.clear()
    run = replay(str(old), "--target", gateway.url, "--engine-listen", f"127.0.0.1:{listen}")
    compact = read_cassette(old).sessions["ro-compact"].engine[0].response
    assert gateway.received["ro-compact"][0] == json.dumps(compact).encode()  # aiohttp's json_response, as before
    assert run.returncode == 1 and "same JSON, different bytes" in run.stdout, run.stdout  # what issue 45 saw


@pytest.mark.parametrize(
    ("raw", "content_type", "kept"),
    [
        (b'{"a":"\xc3\xa9","lp":-1e-07}', "application/json", {"style": "compact"}),
        (b'{"a":"\xc3\xa9","lp":-1e-7}', "application/json", {"style": "orjson"}),
        (b'{"a": "\\u00e9", "lp": -1e-07}', "application/json", {"style": "spaced"}),
        (b'{"a":"\\u00e9","lp":-1e-07}', "application/json", {"style": "compact-ascii"}),
        (b'{"a": "\xc3\xa9", "lp": -1e-07}', "application/json", {"style": "spaced-utf8"}),
        (b'{"a" : 1}', "application/json", {"raw": b'{"a" : 1}'}),  # spacing no encoder writes
        (b'{"a":1,"a":2}', "application/json", {"raw": b'{"a":1,"a":2}'}),  # a key twice: parsed, one is lost
        (b"not json", "text/plain", {"style": "text"}),
        (b"", None, {"raw": b""}),
        (b"data: [1]\n\ndata: [2]\n\n", "text/event-stream", {"style": "orjson", "sse": "\n\n", "done": False}),
        (b"data: [1]\n\ndata: [2]\n\ndata: [DONE]", "text/event-stream", {"raw": None}),  # cut before its end
        (b"data:[1]\n\n", "text/event-stream", {"raw": None}),  # no space after `data:`
    ],
)
def test_a_wire_reproduces_the_engines_bytes_exactly_or_keeps_them(
    raw: bytes, content_type: str | None, kept: dict[str, Any]
) -> None:
    stream = content_type == "text/event-stream"
    if stream:
        response: Any = event_jsons(raw.decode())
    else:
        response = _parsed(raw, content_type or "") if raw else None
    wire = answer_wire(raw, response, content_type)
    assert wire is not None
    assert {k: v for k, v in wire.items() if k != "content_type"} == {
        k: raw if k == "raw" else v for k, v in kept.items()
    }
    assert wire.get("content_type") == content_type
    assert answer_bytes(wire, response) == raw
    assert answer_wire(None, None, None) is None and answer_bytes(None, response) is None  # no bytes: re-encoded
    assert answer_bytes({"style": "from-a-later-tito"}, response) is None


def test_a_wire_is_stored_redacted_and_a_bad_one_is_corrupt(tmp_path: Path) -> None:
    secret = "sk-proj-" + "a1b2c3d4" * 5
    raw = b'{"note" : "' + secret.encode() + b'"}'  # kept as bytes: they hold the key too
    file = tmp_path / "w.tito"
    with CassetteWriter(file, Header("sha256:test", created="2026-01-01T00:00:00Z")) as writer:
        for body in (raw, b'{"note":"ok"}'):
            exchange = EngineExchange("POST", "/v1/chat/completions", {"messages": []}, 200, _parsed(body, "json"))
            exchange.raw, exchange.content_type = body, "application/json"
            writer.engine_exchange("ro-1", "named", exchange)
    assert secret.encode() not in file.read_bytes()
    first, second = read_cassette(file).sessions["ro-1"].engine
    assert first.wire is not None and answer_bytes(first.wire, first.response) == b'{"note" : "<redacted>"}'
    assert second.wire == {"content_type": "application/json", "style": "orjson"}
    for bad in ({"sse": "\n"}, {"content_type": "a\r\nb: c"}, {"raw": "text"}, {"done": 1}):
        record = EngineRecord("ro-1", 1, "POST", "/v1/chat/completions", None, 200, wire=bad)
        with pytest.raises(CorruptCassetteError, match="'wire'"):
            check_fields(record, "engine")


@pytest.mark.parametrize(
    ("path", "request_body", "answer"),
    [
        (  # SGLang's /generate: output ids and the logprob column packed
            "/generate",
            {"input_ids": [1, 2, 3], "sampling_params": {"temperature": 0.0}},
            {
                "text": "hi",
                "output_ids": [5, 6, 7],
                "meta_info": {
                    "id": "r-1",
                    "finish_reason": {"type": "stop", "matched": 7},
                    "output_token_logprobs": [[-0.1, 5, None], [-1e-07, 6, None], [-0.3, 7, None]],
                },
            },
        ),
        (  # vLLM's completions: the prompt and output ids as deltas on the session's context
            "/v1/completions",
            {"model": "m", "prompt": [1, 2, 3], "max_tokens": 3},
            {
                "id": "cmpl-1",
                "choices": [
                    {
                        "index": 0,
                        "text": "hi",
                        "logprobs": {"token_logprobs": [-0.1, -1e-07, -0.3]},
                        "token_ids": [5, 6, 7],
                        "prompt_token_ids": [1, 2, 3],
                    }
                ],
            },
        ),
    ],
)
def test_an_answer_the_codec_packs_is_written_again_exactly_as_replay_reads_it(
    path: str, request_body: dict[str, Any], answer: dict[str, Any], tmp_path: Path
) -> None:
    from tito_rl.cassette.reader import open_cassette
    from tito_rl.trajectory.dialects.registry import detect_dialect

    file = tmp_path / "packed.tito"
    sent = [_compact(answer), orjson.dumps(answer)]
    with CassetteWriter(file, Header("sha256:test", created="2026-01-01T00:00:00Z")) as writer:
        for raw in sent:  # twice: the second call's deltas lean on the first
            exchange = EngineExchange(
                "POST", path, request_body, 200, json.loads(raw), dialect=detect_dialect(path, request_body)
            )
            exchange.raw, exchange.content_type = raw, "application/json"
            writer.engine_exchange("ro-1", "named", exchange)
    records = open_cassette(file, True, packed_prompts=True).sessions["ro-1"].engine  # as `tito replay` reads it
    assert [r.wire.get("style") for r in records if r.wire] == ["compact", "orjson"]
    assert [answer_bytes(r.wire, r.response) for r in records] == sent
