"""Fake engine throughput: 1k-token prompts from 64 concurrent clients, against a bare aiohttp echo server.

Both servers run in a child process on loopback and are driven by the same client code in this process,
so the ratio says what the engine adds over aiohttp itself. Last line:
`fake-engine: <R> req/s, p99 <P> ms, echo: <E> req/s, ratio: <R/E>`.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLIENTS = 64
REQUESTS = 1500
PROMPT_TOKENS = 1024


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(kind: str, port: int) -> None:
    from aiohttp import web

    if kind == "echo":

        async def echo(request: web.Request) -> web.Response:
            return web.Response(body=await request.read(), content_type="application/json")

        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/generate", echo)
    else:
        from tito_rl.fake_engine.app import EngineOptions, create_app
        from tito_rl.fake_engine.policies.demo import demo_policy
        from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

        tok = load_tokenizer()
        app = create_app(demo_policy(tok), EngineOptions(tokenizer=tok))
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def _wait_up(port: int) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as s:
        for _ in range(600):
            try:
                async with s.post(f"http://127.0.0.1:{port}/generate", json={"input_ids": [1, 2, 3]}) as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
    raise RuntimeError("server did not start")


async def _drive(port: int, body: dict) -> tuple[float, list[float]]:
    import aiohttp

    latencies: list[float] = []
    queue = iter(range(REQUESTS))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS)) as s:

        async def client() -> None:
            for _ in queue:
                t0 = time.perf_counter()
                async with s.post(f"http://127.0.0.1:{port}/generate", json=body) as r:
                    await r.read()
                    assert r.status == 200, r.status
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(CLIENTS)))
        return REQUESTS / (time.perf_counter() - t0), latencies


def measure(kind: str, body: dict) -> tuple[float, float, float]:
    port = _free_port()
    proc = mp.get_context("fork").Process(target=_serve, args=(kind, port), daemon=True)
    proc.start()
    try:
        asyncio.run(_wait_up(port))
        rps, lat = asyncio.run(_drive(port, body))
    finally:
        proc.terminate()
        proc.join()
    lat.sort()
    return rps, statistics.median(lat) * 1000, lat[int(0.99 * (len(lat) - 1))] * 1000


def main() -> int:
    body = {
        "input_ids": [(i * 7919) % 150000 + 10 for i in range(PROMPT_TOKENS)],
        "sampling_params": {"skip_special_tokens": False, "no_stop_trim": True, "max_new_tokens": 256},
        "return_logprob": True,
    }
    r, p50, p99 = measure("fake-engine", body)
    e, e50, e99 = measure("echo", body)
    print(f"{REQUESTS} requests, {CLIENTS} clients, {PROMPT_TOKENS}-token prompts")
    print(f"fake-engine p50 {p50:.1f} ms; echo p50 {e50:.1f} ms, p99 {e99:.1f} ms")
    print(f"fake-engine: {r:.0f} req/s, p99 {p99:.1f} ms, echo: {e:.0f} req/s, ratio: {r / e:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
