"""Recorder benchmarks (issue 5, point 7).

(a) proxy latency: added p50/p99 per request at 64 concurrent sessions against the fake engine, as a ratio
    to calling the engine directly in the same run. Both servers are the real `tito fake-engine` and
    `tito record` processes; the same 64 sessions of 16 turns run twice at once, interleaved: one copy
    calls the engine's /generate directly, the other goes through the proxy (Anthropic Messages, streamed,
    cassette written). Run side by side, both meet the same host: a stall of the engine's core or of the
    driver, or a busy moment on the host, lands on both, not on whichever ran first (run one after the
    other, the two p99s differed by host noise alone, and the added figure was sometimes negative).
    With two cores or more the proxy gets one to itself, as in deployment, where agents and the engine
    run on other machines; the engine and this driver share the rest.
    The proxy's cassette writer process inherits that core and runs there at idle priority.
    The proxy's CPU time per request (its writer included) is printed too: on a shared VM it varies far less
    than latency does. So is the most the hypervisor stole any core (from /proc/stat) during the run: steal
    on the proxy's core moves its p99 by milliseconds.
    Own time, per proxied request its latency minus the engine call it made (timed in the cassette), is the
    proxy's share measured request by request: stalls of the engine's core do not move it. It also holds the
    driver's own work on the request, which a direct call has too: an upper bound on what the proxy adds.
    Two loads:
    - agent: each turn the engine spends GENERATE_MS generating (a short reply at a fast decode rate) and
      the agent TOOL_S running tools; this is the goal's figure (p99 added under 5 ms). It runs AGENT_RUNS
      times, each with fresh processes, and the figure is the median run's; every run is printed;
    - stress: an engine that answers at once, same tool time: about 3x the request rate, so queueing
      on the proxy's core shows.
(b) cassette size: a 40-turn coding-agent session growing to ~150k prompt tokens, recorded through the
    cassette writer (both legs, samples included), against the same traffic stored as JSON lines.
    Bytes are divided by the prompt tokens sent to the engine over the session (the sum over turns).
    Goal: at least 50x smaller than JSON.

Run: .venv/bin/python benchmarks/bench_recorder.py
Last line: proxy p99: <X> ms added, direct p99: <Y> ms, cassette: <B> bytes/token, json: <J> bytes/token,
size ratio: <J/B>
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from host_steal import steal_watch  # noqa: E402  (benchmarks/, the script's folder)

from tito_rl.cassette.format.records import Header  # noqa: E402
from tito_rl.cassette.writer import CassetteWriter  # noqa: E402
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange  # noqa: E402
from tito_rl.trajectory.tokens.tokenizer import fingerprint, load_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TURNS = 40
TARGET_TOKENS = 150_000
EOS = 151645
SESSION = "bench-session-token-0123456789"
CAPTURE = (
    Path(__file__).resolve().parents[1] / "tests" / "captures" / "claude_baseline" / "bodies" / "baseline_001.json"
)


def tool_outputs() -> list[str]:
    """Realistic tool results: source files, read in a fixed order (what coding agents mostly read)."""
    import aiohttp

    files = sorted(Path(aiohttp.__file__).parent.glob("*.py"))
    return [f.read_text(errors="replace") for f in files if f.stat().st_size > 2000]


def build_session(tokenizer: Any) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """Tap events of one session, in the adapter's order: engine call, then the agent exchange."""
    base_body = json.loads(CAPTURE.read_bytes()) if CAPTURE.exists() else {"model": "m", "messages": []}
    system_text = json.dumps(base_body.get("system", "")) + json.dumps(base_body.get("tools", []))
    prompt = tokenizer.encode(
        "<|im_start|>system\n" + system_text + "<|im_end|>\n<|im_start|>user\nFix the bug."
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    sources = tool_outputs()
    per_turn_tokens = (TARGET_TOKENS - len(prompt)) // TURNS
    messages = list(base_body.get("messages", []))
    events: list[tuple[str, Any]] = []
    lp = 0
    for turn in range(TURNS):
        call = {"name": "Read", "arguments": {"file_path": f"/repo/src/module_{turn}.py"}}
        output = tokenizer.encode(
            f"<think>\nI should read module {turn} next to find the bug.\n</think>\n\n"
            f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
        ) + [EOS]
        logprobs = [[-((lp + i) % 97) / 97.0 - 0.001, t, None] for i, t in enumerate(output)]
        lp += len(output)
        rid = f"{turn:032x}"
        request = {
            "rid": rid,
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {
                "max_new_tokens": 32000,
                "skip_special_tokens": False,
                "spaces_between_special_tokens": False,
                "no_stop_trim": True,
            },
        }
        response = {
            "text": tokenizer.decode(output[:-1]),
            "output_ids": output,
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": "stop", "matched": EOS},
                "prompt_tokens": len(prompt),
                "output_token_logprobs": logprobs,
                "completion_tokens": len(output),
                "cached_tokens": len(prompt) - 40,
                "e2e_latency": 0.5,
            },
        }
        events.append(
            (
                "engine",
                EngineExchange(
                    "POST",
                    "/generate",
                    request,
                    200,
                    response,
                    headers={"X-SMG-Routing-Key": SESSION},
                    started_s=turn * 2.0,
                    duration_s=0.5,
                ),
            )
        )
        body = dict(base_body, messages=messages)
        reply = [
            f'event: content_block_start\ndata: {{"index":0,"content_block":{{"type":"tool_use",'
            f'"id":"toolu_{turn:04d}","name":"Read","input":{{}}}}}}\n\n',
            f'event: content_block_delta\ndata: {{"index":0,"delta":{{"type":"input_json_delta",'
            f'"partial_json":{json.dumps(json.dumps(call["arguments"]))}}}}}\n\n',
            'event: message_stop\ndata: {"type":"message_stop"}\n\n',
        ]
        events.append(
            (
                "agent",
                AgentExchange(
                    "POST",
                    "/v1/messages",
                    "beta=true",
                    {"Authorization": f"Bearer {SESSION}", "Content-Type": "application/json"},
                    json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(),
                    200,
                    {"Content-Type": "text/event-stream"},
                    reply_events=reply,
                    started_s=turn * 2.0,
                    duration_s=0.6,
                    turn_index=turn,
                ),
            )
        )
        # The tool result: the next slice of real source text, sized to reach the target over 40 turns.
        text = ""
        ids: list[int] = []
        while len(ids) < per_turn_tokens:
            text += sources[(turn + len(text)) % len(sources)][: 4 * per_turn_tokens]
            ids = tokenizer.encode(text)
        text = tokenizer.decode(ids[:per_turn_tokens])
        tail = tokenizer.encode(
            f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{text}\n</tool_response>"
            "<|im_end|>\n<|im_start|>assistant\n"
        )
        messages = messages + [
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": f"toolu_{turn:04d}", "name": "Read", "input": call["arguments"]}
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{turn:04d}", "content": text}]},
        ]
        prompt = prompt + output + tail
    last = [e for k, e in events if k == "engine"][-1]
    tokens = last.request["input_ids"] + last.response["output_ids"]
    n = len(tokens) - len(events[0][1].request["input_ids"])
    sample = {
        "tokens": tokens,
        "response_length": n,
        "loss_mask": [1] * n,
        "rollout_log_probs": [0.0] * (n - len(last.response["output_ids"]))
        + [t[0] for t in last.response["meta_info"]["output_token_logprobs"]],
        "reward": 1.0,
        "metadata": {"truncated": False, "use_tool": True},
    }
    return events, sample


def cassette_bytes(events: list[tuple[str, Any]], sample: dict[str, Any]) -> tuple[int, float]:
    start = time.perf_counter()
    data = write_cassette(events, sample)
    return len(data), time.perf_counter() - start


def write_cassette(events: list[tuple[str, Any]], sample: dict[str, Any]) -> bytes:
    """The session's cassette, written in memory as the recorder writes it."""
    buffer = io.BytesIO()
    writer = CassetteWriter(buffer, Header(tokenizer_fingerprint=fingerprint(), created="2026-01-01T00:00:00Z"))
    for kind, exchange in events:
        if kind == "engine":
            writer.engine_exchange(SESSION, "bearer", exchange)
        else:
            writer.agent_exchange(SESSION, "bearer", exchange)
    writer.session_finished(SESSION, "api", 1.0, [sample])
    return buffer.getvalue()


def json_bytes(events: list[tuple[str, Any]], sample: dict[str, Any]) -> int:
    """The same traffic as JSON lines: what a per-call JSON audit log (Polar-style) stores."""
    total = 0
    for kind, e in events:
        if kind == "engine":
            line = {
                "leg": "engine",
                "path": e.path,
                "request": e.request,
                "status": e.status,
                "response": e.response,
                "headers": e.headers,
                "started_s": e.started_s,
            }
        else:
            line = {
                "leg": "agent",
                "path": e.path,
                "query": e.query,
                "headers": e.headers,
                "body": json.loads(e.body),
                "status": e.status,
                "reply_headers": e.reply_headers,
                "reply_events": e.reply_events,
                "started_s": e.started_s,
            }
        total += len(json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()) + 1
    total += len(json.dumps({"leg": "samples", "samples": [sample]}, separators=(",", ":")).encode()) + 1
    return total


CLIENTS = 64
TURNS_PER_SESSION = 16
TOOL_S = 0.5  # an agent runs tools between model calls; 0.5 s is fast for a coding agent
GENERATE_MS = 1000.0  # e.g. 60 tokens at 60 tokens/s; real agent turns generate hundreds of tokens
AGENT_RUNS = 5  # fresh engine and proxy each; the figure is the median run's


@dataclass
class Latency:
    """Milliseconds: what the proxy adds at p50 and p99, over the direct call's p50 and p99."""

    added_p50: float
    added_p99: float
    own_p50: float  # per request: its latency minus the engine call it caused (as the cassette timed it)
    own_p99: float
    direct_p50: float
    direct_p99: float
    requests: int
    proxy_cpu_ms: float  # the proxy's CPU time per proxied request, its writer process included; 0 if unknown
    steal_pct: float  # share of the run the hypervisor gave one of our cores to someone else (the most)

    @property
    def p99_ratio(self) -> float:
        return (self.direct_p99 + self.added_p99) / self.direct_p99

    def figures(self) -> str:
        return (
            f"proxy adds p50 {self.added_p50:.2f} ms, p99 {self.added_p99:.2f} ms (own time p50 "
            f"{self.own_p50:.2f}, p99 {self.own_p99:.2f} ms) over direct p50 "
            f"{self.direct_p50:.2f} ms, p99 {self.direct_p99:.2f} ms; proxy CPU {self.proxy_cpu_ms:.2f} ms "
            f"per request; host steal {self.steal_pct:.1f}%"
        )


def _tito(args: list[str], cpus: set[int] | None) -> Any:
    """A real `tito` server process (what users run), optionally pinned to `cpus`."""
    return _process([sys.executable, "-m", "tito_rl", *args], cpus)


@contextmanager
def _process(argv: list[str], cpus: set[int] | None) -> Iterator[subprocess.Popen[bytes]]:
    """A server process (tito's, or a gateway's), optionally pinned to `cpus`, stopped on exit."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if cpus:
            os.sched_setaffinity(proc.pid, cpus)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def _no_process() -> Iterator[None]:
    yield None


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 180.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"server on port {port} not healthy after {timeout_s} s")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


Target = tuple[int, str, Callable[[int, int], tuple[bytes, dict[str, str]]]]  # port, path, (session, turn) -> body


async def _drive(targets: dict[str, Target], tool_s: float, cycle_s: float) -> dict[str, dict[tuple[int, int], float]]:
    """CLIENTS concurrent sessions per target, all targets at once; latency per target and (session, turn).

    Between turns an agent runs tools for `tool_s`. Sessions start spread over one turn's cycle
    (`cycle_s`: generation plus tools), as independent agents are, rather than all at once; the targets'
    sessions interleave, so that whatever the host does during the run it does to all of them.
    """
    import asyncio

    import aiohttp

    latencies: dict[str, dict[tuple[int, int], float]] = {name: {} for name in targets}
    with _driver_gc_off():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS * len(targets))) as http:

            async def session(name: str, offset: float, c: int) -> None:
                port, path, bodies = targets[name]
                await asyncio.sleep(cycle_s * (c + offset) / CLIENTS)
                for turn in range(TURNS_PER_SESSION):
                    if turn:
                        await asyncio.sleep(tool_s)
                    body, headers = bodies(c, turn)
                    t0 = time.perf_counter()
                    url = f"http://127.0.0.1:{port}{path.format(c=c)}"  # a gateway may keep sessions in the URL
                    async with http.post(url, data=body, headers=headers) as r:
                        await r.read()
                        assert r.status == 200, (r.status, await r.text())
                    latencies[name][c, turn] = time.perf_counter() - t0

            await asyncio.gather(
                *(session(name, k / len(targets), c) for k, name in enumerate(targets) for c in range(CLIENTS))
            )
    return latencies


@contextmanager
def _driver_gc_off() -> Iterator[None]:
    """The driver's own garbage collection off while it times requests, as `timeit` does: its passes (a few
    per run, up to 2 ms each) made the requests it timed meanwhile look slow, direct or proxied."""
    import gc

    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def _stat_fields(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and of its children (the recorder's cassette writer process
    works for the proxy and is counted with it) (Linux); 0.0 where /proc is not there."""
    pids = [pid] + [
        int(p.name) for p in Path("/proc").glob("[0-9]*") if (f := _stat_fields(int(p.name))) and int(f[1]) == pid
    ]
    return sum(int(f[11]) + int(f[12]) for f in map(_stat_fields, pids) if f) / os.sysconf("SC_CLK_TCK")


def _percentiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return values[len(values) // 2] * 1000, values[int(0.99 * (len(values) - 1))] * 1000


def _placement() -> tuple[set[int] | None, set[int] | None, str]:
    """(proxy cpus, engine and driver cpus, description): the proxy gets a core of its own when there are
    at least two, as it has in deployment (agents and the engine run elsewhere)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None, "proxy, engine and driver share one core"
    return {cpus[0]}, set(cpus[1:]), f"proxy pinned to cpu {cpus[0]}, engine and driver on {cpus[1:]}"


def measure_proxy_latency(generate_ms: float, tool_s: float, front: list[str] | None = None) -> Latency:
    """Part (a): the same sessions direct and through the proxy, in one run against one engine. `front`: a command
    serving in front of the engine (both copies call it), given its port and the engine's as its last two
    arguments (`bench_cassette_routes.py`'s, which adds expert routes to every answer)."""
    import asyncio
    import tempfile

    tok = load_tokenizer()
    tools = [
        {
            "name": "Bash",
            "description": "Run a shell command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]

    def messages(c: int, turn: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"role": "user", "content": f"Session {c}: list the files."}]
        for t in range(turn):
            out += [{"role": "assistant", "content": f"Turn {t} done."}, {"role": "user", "content": f"Go on {t}."}]
        return out

    # Bodies are built before the clock starts, so the driver's own work is the same for both copies.
    json_type = {"Content-Type": "application/json"}
    anthropic, generate = {}, {}
    for c in range(CLIENTS):
        for turn in range(TURNS_PER_SESSION):
            body = {
                "model": "m",
                "max_tokens": 256,
                "system": "You are a coding agent.",
                "tools": tools,
                "messages": messages(c, turn),
                "stream": True,
            }
            anthropic[c, turn] = (json.dumps(body).encode(), {**json_type, "Authorization": f"Bearer bench-{c}"})
            chat = [{"role": "system", "content": "You are a coding agent."}, *messages(c, turn)]
            ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
            body = {
                "input_ids": ids,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 256, "skip_special_tokens": False},
            }
            generate[c, turn] = (json.dumps(body).encode(), json_type)

    proxy_cpus, other_cpus, _ = _placement()
    if other_cpus:
        os.sched_setaffinity(0, other_cpus)
    engine_port, proxy_port = _free_port(), _free_port()
    inner_port = _free_port() if front else engine_port  # the engine's own, behind the front when there is one
    engine_url = f"http://127.0.0.1:{engine_port}"
    engine_args = ["fake-engine", "--demo", "--port", str(inner_port)]
    if generate_ms:
        engine_args += ["--fault-latency-ms", str(generate_ms)]  # generation time, without using the CPU
    tmp = tempfile.TemporaryDirectory()
    cassette = Path(tmp.name) / "bench.tito"
    try:
        with (
            _tito(engine_args, other_cpus) as engine,
            _process([*front, str(engine_port), str(inner_port)], other_cpus) if front else _no_process() as fronted,
            _tito(
                [
                    "record",
                    "--engine",
                    engine_url,
                    "--listen",
                    f"127.0.0.1:{proxy_port}",
                    "--out",
                    str(cassette),
                    "--quiet",
                ],
                proxy_cpus,
            ) as proxy,
        ):
            _wait_healthy(inner_port, engine)
            if fronted is not None:
                _wait_healthy(engine_port, fronted)
            _wait_healthy(proxy_port, proxy)  # both ready before the run: no startup work overlaps it
            cycle_s = generate_ms / 1000 + tool_s
            steal: list[float] = []
            cpu_before = _cpu_s(proxy.pid)
            with steal_watch(steal):
                runs = asyncio.run(
                    _drive(
                        {
                            "direct": (engine_port, "/generate", lambda c, t: generate[c, t]),
                            "proxied": (proxy_port, "/v1/messages", lambda c, t: anthropic[c, t]),
                        },
                        tool_s,
                        cycle_s,
                    )
                )
            direct, proxied = runs["direct"], runs["proxied"]
            proxy_cpu_ms = (_cpu_s(proxy.pid) - cpu_before) / len(proxied) * 1000
        own50, own99 = _percentiles(_own_times(proxied, cassette))  # the proxy stopped: its cassette is complete
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        tmp.cleanup()
    d50, d99 = _percentiles(list(direct.values()))
    p50, p99 = _percentiles(list(proxied.values()))
    return Latency(p50 - d50, p99 - d99, own50, own99, d50, d99, len(proxied), proxy_cpu_ms, steal[0])


def _own_times(latencies: dict[tuple[int, int], float], cassette: Path) -> list[float]:
    """Per proxied request, its latency minus the engine call it made, as the cassette timed that call.

    Paired request by request, this does not move when the host stalls the engine's core (which the added
    figure, a difference of two p99s, feels on whichever copy's requests the stall caught): it is the proxy's
    own time per request, the extra HTTP hop and the driver's own work on the request included."""
    from tito_rl.cassette.reader import read_cassette
    from tito_rl.cassette.redaction import session_digest

    sessions = read_cassette(cassette).sessions
    calls = {
        c: [e for e in sessions[session_digest(f"bench-{c}")].engine if e.path.endswith("/generate")]
        for c in range(CLIENTS)
    }
    return [latency - calls[c][turn].duration_s for (c, turn), latency in latencies.items()]


BARE_SERVER = """
import asyncio, sys
class Reply(asyncio.Protocol):
    def connection_made(self, transport): self.transport = transport
    def data_received(self, data):
        if b"\\r\\n\\r\\n" in data:
            self.transport.write(b"HTTP/1.1 200 OK\\r\\nContent-Length: 2\\r\\n\\r\\nok")
async def main():
    await asyncio.get_running_loop().create_server(Reply, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


def wakeup_floor(requests: int = 400) -> tuple[float, float, float]:
    """(p50 back to back, p50 and p99 after 5 ms idle), ms: a bare asyncio server on the proxy's core.

    No proxy can answer faster than this host wakes an idle core. Under the agent load the proxy's core is
    idle most of the time and each turn wakes it twice (the request, the engine's reply); on a VM whose
    idle vCPUs halt into the hypervisor that costs far more than on bare metal."""
    import asyncio

    import aiohttp

    proxy_cpus, other_cpus, _ = _placement()
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(port)], stdout=subprocess.PIPE)

    async def run(gap_s: float) -> list[float]:
        out = []
        async with aiohttp.ClientSession() as http:
            for _ in range(requests):
                t0 = time.perf_counter()
                async with http.get(f"http://127.0.0.1:{port}/") as r:
                    await r.read()
                out.append(time.perf_counter() - t0)
                await asyncio.sleep(gap_s)
        return out

    try:
        if proxy_cpus:
            os.sched_setaffinity(server.pid, proxy_cpus)
            os.sched_setaffinity(0, other_cpus or proxy_cpus)
        assert server.stdout is not None and server.stdout.readline() == b"ready\n"
        busy, _ = _percentiles(asyncio.run(run(0.0)))
        idle50, idle99 = _percentiles(asyncio.run(run(0.005)))
    finally:
        server.kill()
        server.wait()
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    return busy, idle50, idle99


def median_run(runs: list[Latency]) -> Latency:
    """The run whose p99 added is the median: one p99 from 1024 requests moves by a millisecond or more
    when the host steals the proxy's core for a moment, so one run alone says little; every run is printed."""
    return sorted(runs, key=lambda r: r.added_p99)[len(runs) // 2]


def main() -> int:
    tokenizer = load_tokenizer()
    events, sample = build_session(tokenizer)
    prompts = [e.request["input_ids"] for k, e in events if k == "engine"]
    prompt_tokens = sum(len(p) for p in prompts)
    cassette, write_s = cassette_bytes(events, sample)
    as_json = json_bytes(events, sample)
    b, j = cassette / prompt_tokens, as_json / prompt_tokens
    print(f"(b) {TURNS} turns, final prompt {len(prompts[-1])} tokens, {prompt_tokens} prompt tokens sent in all")
    print(f"(b) cassette {cassette} bytes (written in {write_s * 1000:.0f} ms), JSON lines {as_json} bytes")
    print(f"(b) size ratio {j / b:.1f}x (goal: at least 50x)")
    _, _, placement = _placement()
    busy, idle50, idle99 = wakeup_floor()
    print(
        f"(a) this host's floor: a bare asyncio server on the proxy's core answers in {busy:.2f} ms back to back "
        f"(p50); after 5 ms idle, p50 {idle50:.2f} ms, p99 {idle99:.2f} ms (the cost of waking an idle core)"
    )
    stress = measure_proxy_latency(0.0, TOOL_S)
    print(
        f"(a) stress: {CLIENTS} sessions, engine answers at once, {TOOL_S * 1000:.0f} ms of tools between turns "
        f"({stress.requests} requests; {placement}): {stress.figures()}"
    )
    runs = []
    for run in range(1, AGENT_RUNS + 1):
        r = measure_proxy_latency(GENERATE_MS, TOOL_S)
        runs.append(r)
        print(
            f"(a) agent run {run}/{AGENT_RUNS}: {CLIENTS} sessions, {GENERATE_MS:.0f} ms generating and "
            f"{TOOL_S * 1000:.0f} ms of tools per turn ({r.requests} requests; {placement}): {r.figures()}",
            flush=True,
        )
    agent = median_run(runs)
    print(
        f"(a) agent, median of {AGENT_RUNS} runs: proxy adds p50 {agent.added_p50:.2f} ms, "
        f"p99 {agent.added_p99:.2f} ms (p99 ratio {agent.p99_ratio:.3f}x; goal: under 5 ms added); "
        f"own time p50 {agent.own_p50:.2f} ms, p99 {agent.own_p99:.2f} ms"
    )
    print(
        f"proxy p99: {agent.added_p99:.2f} ms added, direct p99: {agent.direct_p99:.2f} ms, "
        f"cassette: {b:.3f} bytes/token, json: {j:.2f} bytes/token, size ratio: {j / b:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
