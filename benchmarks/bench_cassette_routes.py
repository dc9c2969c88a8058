"""Expert routes in the cassette (issue 46, point 3): what a real MoE's routes (48 layers, top 8 of 128 experts) cost
on disk and in the recorder, each figure against a baseline measured in this run.

(a) size: the production scenario's sessions (`bench_production.py`'s: turn counts, tool outputs growing the prompt,
    one in 16 dropped), their engine leg as tito's adapter records it (`/generate` calls with logprobs, then the
    samples), every answer carrying SGLang's `meta_info.routed_experts` for its whole prompt and output (no
    `routed_experts_start_len`: the prefix is re-sent every turn), written by the real `CassetteWriter` three ways:
    without routes (the baseline), with routes (the codec, `cassette/format/routes.py`), and with routes as plain
    base64 in the body (the codec turned off: what format 4 stores). The goal: a session's routes cost about one copy
    of its final sequence's routes compressed (`zlib` of their uint8 rows, printed as `one copy`), however many
    turns re-sent them. Routes are the CHANNELS.md rule's (a token's row depends only on its prefix;
    `tests/route_channels.py`), near-random as a router's top-k are. The sessions' tokens are scaled by `--scale`
    (default 0.01): at full size the plain cassette of even 8 sessions is 12 GB of base64 text, which zlib takes
    hours over on a 2-core host; the ratios depend on the turn counts, which are the scenario's (`--scale 1
    --skip-plain`: full size, without the plain cassette). The writer's time per engine call (its p50 and p99,
    in-process: the recorder's writer process does this work) is printed for each, and the most the writer held
    for a session (its delta bases: the route context is a byte an expert id of the session's rows so far). Then
    the writer's memory bound on routes (`RouteContext`: past `ROUTE_MEMORY_BYTES` a session's route context waits
    in a temporary file): the same sessions written with the bound and without it (all in memory, as before the
    bound), alternately `--repeats` times, their cassettes compared byte for byte, the most held in memory for a
    session and the writer's time per call (median p50 and p99 over the repeats), bound / unbound.
(b) recorder p99 (`bench_recorder.py`'s method: 64 sessions of 16 turns direct and through `tito record` side by
    side, the agent load): once against the fake engine, once against the same engine behind a front that adds
    routes to every `/generate` answer (both copies get them); `--latency-runs` runs each (default 1).

    .venv/bin/python benchmarks/bench_cassette_routes.py [--sessions 8] [--scale 0.01] [--latency-runs 1]
        [--skip-latency] [--skip-plain] [--repeats 2]
Last line: `routes: cassette <R>x the size without routes (plain base64: <P>x), codec / plain <C>, routes / one
copy <O>; writer held <H> bytes a session at most (<U> unbound), p99 a call bound / unbound <T>; recorder p99
added <X> ms with routes, <Y> ms without`
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import random
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_production import scenario  # noqa: E402
from host_steal import steal_watch  # noqa: E402

from tests.route_channels import MoeShape, route_rows, sglang_routes  # noqa: E402
from tito_rl.cassette.format.records import Header  # noqa: E402
from tito_rl.cassette.format.routes import ROUTE_MEMORY_BYTES  # noqa: E402
from tito_rl.cassette.writer import CassetteWriter  # noqa: E402
from tito_rl.trajectory.adapters.tap import EngineExchange  # noqa: E402

SHAPE = MoeShape(48, 8, 128)
TOKENS_A_LINE = 16  # what a line of the scenario's tool output takes (bench_production.py)
SYSTEM_TOKENS = 900  # the scripted client's system prompt and tools, rendered
OUTPUT_TOKENS = 48  # a turn's reasoning, text and tool call
EOS = 151645


@dataclass
class Session:
    name: str
    calls: list[tuple[list[int], list[int]]]  # (prompt ids, output ids) per engine call
    dropped: bool
    rows: Any = None  # the final sequence's routes, [tokens - 1, layers, top_k]


def production_sessions(count: int, scale: float) -> list[Session]:
    """The first `count` sessions of the production scenario (2,048 of them), their tokens scaled by `scale`."""
    spec = scenario(2048)
    out = []
    for i, client in enumerate(spec["client"]["sessions"][:count]):
        turns = int(client["system"].split("T=")[1][:2])
        tool_tokens = max(1, round(client["results"]["Bash"]["lines"] * TOKENS_A_LINE * scale))
        rng = random.Random(i)
        prompt = [rng.randrange(151_000) for _ in range(max(8, round(SYSTEM_TOKENS * scale)))]
        calls = []
        for _ in range(turns):
            output = [rng.randrange(151_000) for _ in range(OUTPUT_TOKENS - 1)] + [EOS]
            calls.append((prompt, output))
            prompt = prompt + output + [rng.randrange(151_000) for _ in range(tool_tokens)]
        dropped = "drop" in client["steps"][-1]
        out.append(Session(client["id"], calls, dropped))
    return out


def exchange(prompt: list[int], output: list[int], turn: int, routes: str | None) -> EngineExchange:
    """A /generate call as tito's adapter records it; `routes`: its answer's `meta_info.routed_experts`."""
    meta: dict[str, Any] = {
        "id": f"{turn:032x}",
        "finish_reason": {"type": "stop", "matched": EOS},
        "prompt_tokens": len(prompt),
        "output_token_logprobs": [[-0.01 * (1 + i % 97), t, None] for i, t in enumerate(output)],
        "completion_tokens": len(output),
        "cached_tokens": max(0, len(prompt) - 64),
        "e2e_latency": 0.5,
    }
    if routes is not None:
        meta["routed_experts"] = routes
    request = {
        "rid": f"{turn:032x}",
        "input_ids": prompt,
        "return_logprob": True,
        "return_routed_experts": routes is not None,
        "sampling_params": {"max_new_tokens": 32000, "skip_special_tokens": False, "no_stop_trim": True},
    }
    response = {"text": "", "output_ids": output, "meta_info": meta}
    return EngineExchange("POST", "/generate", request, 200, response, started_s=2.0 * turn, duration_s=0.5)


@dataclass
class Written:
    size: int = 0
    call_s: list[float] = field(default_factory=list)  # the writer's time per engine call
    held: int = 0  # the most delta bases the writer held in memory for one session (its last call, before the finish)
    spilled: int = 0  # the most route context it held in a temporary file for one session
    digest: str = ""  # the cassette's sha256


@contextmanager
def codec_off() -> Iterator[None]:
    """The channel codec turned off: routes stay base64 text in the body (format 4's way)."""
    from tito_rl.cassette.format import codec

    kept = codec.__dict__["encode_channels"]
    codec.__dict__["encode_channels"] = lambda context, request, original, response: response
    try:
        yield
    finally:
        codec.__dict__["encode_channels"] = kept


def write(sessions: list[Session], routes: bool, route_memory: int | None = ROUTE_MEMORY_BYTES) -> Written:
    """The sessions' engine legs and samples through one `CassetteWriter`, sessions one after another;
    `route_memory`: the writer's bound on a session's route context in memory (None: none)."""
    written = Written()
    buffer = io.BytesIO()
    header = Header(tokenizer_fingerprint="sha256:bench", created="2026-01-01T00:00:00Z")
    writer = CassetteWriter(buffer, header, route_memory=route_memory)
    for session in sessions:
        for turn, (prompt, output) in enumerate(session.calls):
            text = sglang_routes(prompt + output, SHAPE, 0, session.rows) if routes else None
            call = exchange(prompt, output, turn, text)
            started = time.perf_counter()
            writer.engine_exchange(session.name, "bearer", call)
            written.call_s.append(time.perf_counter() - started)
        written.held = max(written.held, writer._codec.held_bytes())  # one session at a time: its own
        written.spilled = max(written.spilled, writer._codec.spilled_bytes())
        if session.dropped:
            writer.session_dropped(session.name, "bearer")
        else:
            prompt, output = session.calls[-1]
            n = len(prompt) + len(output) - len(session.calls[0][0])
            sample = {"tokens": prompt + output, "response_length": n, "loss_mask": [1] * n, "reward": 1.0}
            writer.session_finished(session.name, "bearer", 1.0, [sample])
    written.size = len(buffer.getvalue())
    written.digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    return written


def p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))]


def bounded(sessions: list[Session], repeats: int) -> tuple[int, int, float]:
    """The writer with its bound on route memory and without it, alternately: the most held in memory for a
    session with and without, and the p99 a call, bound / unbound (medians over the repeats)."""
    runs: dict[bool, list[Written]] = {True: [], False: []}
    steal: list[float] = []
    for _ in range(repeats):
        for bound in (False, True):
            with steal_watch(steal):
                runs[bound].append(write(sessions, routes=True, route_memory=ROUTE_MEMORY_BYTES if bound else None))
            w = runs[bound][-1]
            print(
                f"(a) routes, {'bound' if bound else 'unbound'}: writer per call {percentiles_ms(w.call_s)}; held "
                f"at most {w.held} bytes for a session in memory, {w.spilled} in its temporary file; steal "
                f"{steal[-1]:.1f}%"
            )
    same = len({w.digest for ws in runs.values() for w in ws}) == 1
    if not same:
        raise SystemExit("bench_cassette_routes: the bound on route memory changed the cassette's bytes")

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    p50s = {b: median([sorted(w.call_s)[len(w.call_s) // 2] for w in ws]) for b, ws in runs.items()}
    p99s = {b: median([p99(w.call_s) for w in ws]) for b, ws in runs.items()}
    held = {b: max(w.held for w in ws) for b, ws in runs.items()}
    print(
        f"(a) writer memory bound ({ROUTE_MEMORY_BYTES} bytes of route context a session in memory, the rest in an "
        f"unlinked temporary file), median of {repeats}: held at most {held[True]} bytes for a session, "
        f"{held[False]} unbound ({held[True] / held[False]:.3f}x); writer per call p50 {p50s[True] * 1000:.1f} ms "
        f"bound, {p50s[False] * 1000:.1f} ms unbound ({p50s[True] / p50s[False]:.2f}x); p99 "
        f"{p99s[True] * 1000:.1f} ms bound, {p99s[False] * 1000:.1f} ms unbound ({p99s[True] / p99s[False]:.2f}x); "
        f"the cassettes byte for byte the same: {same}"
    )
    return held[True], held[False], p99s[True] / p99s[False]


def percentiles_ms(values: list[float]) -> str:
    ordered = sorted(values)
    return (
        f"p50 {ordered[len(ordered) // 2] * 1000:.1f} ms, p99 {ordered[int(0.99 * (len(ordered) - 1))] * 1000:.1f} ms"
    )


def sizes(
    count: int, scale: float, skip_plain: bool = False, repeats: int = 2
) -> tuple[float, float, float, float, str]:
    sessions = production_sessions(count, scale)
    for session in sessions:
        prompt, output = session.calls[-1]
        session.rows = route_rows(prompt + output, SHAPE)
    calls = sum(len(s.calls) for s in sessions)
    final = sum(s.rows.shape[0] - 1 for s in sessions)
    sent = sum(len(p) + len(o) - 1 for s in sessions for p, o in s.calls)
    one_copy = sum(len(zlib.compress(s.rows[:-1].astype(np.uint8).tobytes(), 6)) for s in sessions)
    print(
        f"(a) {count} sessions of the production scenario, tokens scaled by {scale:g}: {calls} engine calls, "
        f"{final} route rows in the final sequences, {sent} sent over all calls ({sent / final:.1f}x); MoE "
        f"{SHAPE.layers} layers, top {SHAPE.top_k} of {SHAPE.experts} experts; one copy of the final rows "
        f"compressed: {one_copy} bytes"
    )
    steal: list[float] = []
    with steal_watch(steal):
        bare = write(sessions, routes=False)
    print(
        f"(a) without routes: {bare.size} bytes; writer per call {percentiles_ms(bare.call_s)}; steal {steal[-1]:.1f}%"
    )
    with steal_watch(steal):
        coded = write(sessions, routes=True)
    print(
        f"(a) routes, codec: {coded.size} bytes, {coded.size / bare.size:.1f}x; the routes' own "
        f"{coded.size - bare.size} bytes are {(coded.size - bare.size) / one_copy:.2f}x one copy; writer per call "
        f"{percentiles_ms(coded.call_s)}; steal {steal[-1]:.1f}%; the writer held at most {coded.held} bytes for a "
        f"session ({bare.held} without routes): its route context, a byte an expert id"
    )
    held, unbound, ratio = bounded(sessions, repeats)
    memory = f"writer held {held} bytes a session at most ({unbound} unbound), p99 a call bound / unbound {ratio:.2f}"
    if skip_plain:
        return coded.size / bare.size, float("nan"), float("nan"), (coded.size - bare.size) / one_copy, memory
    with steal_watch(steal), codec_off():
        plain = write(sessions, routes=True)
    print(
        f"(a) routes, plain base64: {plain.size} bytes, {plain.size / bare.size:.1f}x; the routes' own "
        f"{(plain.size - bare.size) / one_copy:.2f}x one copy; writer per call {percentiles_ms(plain.call_s)}; "
        f"steal {steal[-1]:.1f}%"
    )
    print(
        f"(a) codec / plain: {coded.size / plain.size:.3f} of the bytes ({plain.size / coded.size:.1f}x smaller); "
        f"writer time per call at p99, codec / plain: "
        f"{sorted(coded.call_s)[int(0.99 * (calls - 1))] / sorted(plain.call_s)[int(0.99 * (calls - 1))]:.2f}"
    )
    copies = (coded.size - bare.size) / one_copy
    return coded.size / bare.size, plain.size / bare.size, coded.size / plain.size, copies, memory


# (b): a front that adds routes to the engine's /generate answers, run as `python -c FRONT <port> <engine port>`.
FRONT = """
import json, sys
sys.path.insert(0, %(root)r)
import aiohttp
from aiohttp import web
from tests.route_channels import MoeShape, RowCache, sglang_routes
SHAPE = MoeShape(%(layers)d, %(top_k)d, %(experts)d)
CACHE = RowCache(SHAPE)  # each session's prefix routed once, as an engine would keep it
port, engine = int(sys.argv[1]), f"http://127.0.0.1:{sys.argv[2]}"

async def forward(request):
    body = await request.read()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
    async with request.app["http"].request(request.method, engine + request.path_qs, data=body, headers=headers) as r:
        data = await r.read()
        kind = r.headers.get("Content-Type", "application/json")
        if request.path == "/generate" and r.status == 200 and kind.startswith("application/json"):
            answer = json.loads(data)
            ids = json.loads(body).get("input_ids") or []
            if isinstance(answer, dict) and isinstance(ids, list):
                seq = ids + answer["output_ids"]
                answer.setdefault("meta_info", {})["routed_experts"] = sglang_routes(seq, SHAPE, 0, CACHE.rows(seq))
                data = json.dumps(answer).encode()
        return web.Response(body=data, status=r.status, content_type=kind.split(";")[0])

async def start(app):
    app["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

async def stop(app):
    await app["http"].close()

app = web.Application(client_max_size=1 << 30)
app.on_startup.append(start)
app.on_cleanup.append(stop)
app.router.add_route("*", "/{tail:.*}", forward)
web.run_app(app, host="127.0.0.1", port=port, print=None)
"""


def latency(runs: int) -> tuple[float, float]:
    import bench_recorder

    front = [
        sys.executable,
        "-c",
        FRONT % {"root": str(ROOT), "layers": SHAPE.layers, "top_k": SHAPE.top_k, "experts": SHAPE.experts},
    ]
    added: dict[str, list[float]] = {"without routes": [], "with routes": []}
    for run in range(1, runs + 1):
        for label, command in (("without routes", None), ("with routes", front)):
            r = bench_recorder.measure_proxy_latency(bench_recorder.GENERATE_MS, bench_recorder.TOOL_S, command)
            added[label].append(r.added_p99)
            print(f"(b) run {run}/{runs}, {label}: {r.figures()}; load average {os.getloadavg()[0]:.1f}", flush=True)
    median = {k: sorted(v)[len(v) // 2] for k, v in added.items()}
    print(
        f"(b) recorder p99 added, median of {runs}: {median['with routes']:.2f} ms with routes on every answer, "
        f"{median['without routes']:.2f} ms without"
    )
    return median["with routes"], median["without routes"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8, help="the production scenario's first N sessions")
    parser.add_argument("--scale", type=float, default=0.01, help="their tokens scaled by this (1: full size)")
    parser.add_argument("--latency-runs", type=int, default=1)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-plain", action="store_true", help="no plain base64 cassette (for full-size runs)")
    parser.add_argument("--repeats", type=int, default=2, help="writes with and without the route memory bound")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}")
    ratio, plain, codec_plain, copies, memory = sizes(args.sessions, args.scale, args.skip_plain, args.repeats)
    line = (
        f"routes: cassette {ratio:.1f}x the size without routes (plain base64: {plain:.1f}x), codec / plain "
        f"{codec_plain:.3f}, routes / one copy {copies:.2f}; {memory}"
    )
    if not args.skip_latency:
        with_routes, without = latency(args.latency_runs)
        line += f"; recorder p99 added {with_routes:.2f} ms with routes, {without:.2f} ms without"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
