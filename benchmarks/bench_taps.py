"""What the two taps around a foreign target add per engine call (issue 22, point 6).

The same 64 concurrent sessions of 16 turns run twice at once, interleaved, against one fake engine: one copy
talks to a gateway that calls the engine directly (the baseline), the other to `tito record --target
http://...`, whose agent tap forwards to an identical gateway whose engine URL is the record process's engine
tap. Each proxied turn thus crosses both taps once each way, with one engine call: the added p99 per request is
what the taps add per engine call. The gateways are `tito serve` processes (a gateway tito did not start); the
recording process gets a core of its own (as bench_recorder.py gives the proxy), the engine, both gateways and
this driver share the other. Each turn the engine spends GENERATE_MS and the agent TOOL_S running tools, as in
bench_recorder.py's agent load. RUNS runs, fresh processes each; the figure is the median run's.

OpenAI dialects (issue #31, point 7): `--dialect vllm-openai` runs the same load through rllm's gateway
(`rllm-model-gateway` processes, sessions in the URL, OpenAI chat in, vLLM's `/v1/chat/completions` with messages
and `return_token_ids` out) in front of the fake engine answering in vLLM's dialect; `--stream` streams both legs
(the engine tap then keeps every chunk). The taps' added p99 per engine call is the figure, as above.

Run: .venv/bin/python benchmarks/bench_taps.py [--dialect sglang|vllm-openai] [--stream]
Last line: taps p99: <X> ms added per engine call, direct p99: <Y> ms, ratio: <(Y+X)/Y>, host steal: <S>%
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_recorder import (  # noqa: E402  (benchmarks/, the script's folder)
    CLIENTS,
    TOOL_S,
    TURNS_PER_SESSION,
    _cpu_s,
    _drive,
    _free_port,
    _percentiles,
    _placement,
    _process,
    _tito,
    _wait_healthy,
)
from host_steal import steal_watch  # noqa: E402

GENERATE_MS = 1000.0
RUNS = 3


def bodies() -> dict[tuple[int, int], tuple[bytes, dict[str, str]]]:
    tools = [
        {
            "name": "Bash",
            "description": "Run a shell command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
        }
    ]
    out = {}
    for c in range(CLIENTS):
        history = [{"role": "user", "content": f"Session {c}: list the files."}]
        for turn in range(TURNS_PER_SESSION):
            body = {
                "model": "m",
                "max_tokens": 256,
                "system": "You are a coding agent.",
                "tools": tools,
                "messages": list(history),
                "stream": True,
            }
            out[c, turn] = (
                json.dumps(body).encode(),
                {"Content-Type": "application/json", "Authorization": f"Bearer taps-{c}"},
            )
            history += [
                {"role": "assistant", "content": f"Turn {turn} done."},
                {"role": "user", "content": f"Go on {turn}."},
            ]
    return out


def chat_bodies(stream: bool) -> dict[tuple[int, int], tuple[bytes, dict[str, str]]]:
    """The same sessions on the OpenAI chat wire, as Qwen Code or opencode send them to rllm's gateway."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "run_shell_command",
                "description": "Run a shell command",
                "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
            },
        }
    ]
    out = {}
    for c in range(128):
        history: list[dict[str, str]] = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"Session {c}: list the files."},
        ]
        for turn in range(TURNS_PER_SESSION):
            body = {"model": "m", "max_tokens": 256, "tools": tools, "messages": list(history), "stream": stream}
            out[c, turn] = (
                json.dumps(body).encode(),
                {"Content-Type": "application/json", "Authorization": f"Bearer taps-{c}"},
            )
            history += [
                {"role": "assistant", "content": f"Turn {turn} done."},
                {"role": "user", "content": f"Go on {turn}."},
            ]
    return out


def _rllm(port: int, worker: str, cpus: set[int] | None) -> Any:
    """A `rllm-model-gateway` process (a gateway tito did not start), optionally pinned to `cpus`."""
    exe = str(Path(sys.executable).with_name("rllm-model-gateway"))
    return _process(
        [
            exe,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker",
            worker,
            "--store",
            "memory",
            "--log-level",
            "warning",
        ],
        cpus,
    )


def one_run(
    requests: dict[tuple[int, int], tuple[bytes, dict[str, str]]], dialect: str = "sglang"
) -> tuple[float, float, float, float]:
    """(added p99 ms, direct p99 ms, taps CPU ms per request, host steal %)."""
    taps_cpus, other_cpus, _ = _placement()
    if other_cpus:
        os.sched_setaffinity(0, other_cpus)
    engine, direct_gw, tapped_gw, engine_tap, agent_tap = (_free_port() for _ in range(5))
    engine_url = f"http://127.0.0.1:{engine}"
    tmp = tempfile.TemporaryDirectory()
    openai = dialect != "sglang"
    fake = ["fake-engine", "--demo", "--port", str(engine), "--fault-latency-ms", str(GENERATE_MS)]
    record = [
        "record",
        "--engine",
        engine_url,
        "--target",
        f"http://127.0.0.1:{tapped_gw}",
        "--engine-listen",
        f"127.0.0.1:{engine_tap}",
        "--listen",
        f"127.0.0.1:{agent_tap}",
        "--out",
        str(Path(tmp.name) / "taps.tito"),
        "--quiet",
    ]
    if openai:
        fake += ["--openai-dialect", dialect]
        record += ["--routing-header", "none", "--engine-dialect", dialect]
    try:
        with (
            _tito(fake, other_cpus) as eng,
            (
                _rllm(direct_gw, engine_url + "/v1", other_cpus)
                if openai
                else _tito(["serve", "--engine", engine_url, "--listen", f"127.0.0.1:{direct_gw}"], other_cpus)
            ) as gw1,
            (
                _rllm(tapped_gw, f"http://127.0.0.1:{engine_tap}/v1", other_cpus)
                if openai
                else _tito(
                    ["serve", "--engine", f"http://127.0.0.1:{engine_tap}", "--listen", f"127.0.0.1:{tapped_gw}"],
                    other_cpus,
                )
            ) as gw2,
            _tito(record, taps_cpus) as rec,
        ):
            for port, proc in ((engine, eng), (direct_gw, gw1), (tapped_gw, gw2)):
                _wait_healthy(port, proc)
            _wait_healthy(agent_tap, rec)  # /health goes through the agent tap to the gateway
            steal: list[float] = []
            cpu_before = _cpu_s(rec.pid)
            with steal_watch(steal):
                path = "/sessions/taps-{c}/v1/chat/completions" if openai else "/v1/messages"
                runs = asyncio.run(
                    _drive(
                        {
                            "direct": (direct_gw, path, lambda c, t: requests[c, t]),
                            "tapped": (agent_tap, path, lambda c, t: requests[c, t]),
                        },
                        TOOL_S,
                        GENERATE_MS / 1000 + TOOL_S,
                    )
                )
            cpu_ms = (_cpu_s(rec.pid) - cpu_before) / len(runs["tapped"]) * 1000
    finally:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        tmp.cleanup()
    _, d99 = _percentiles(list(runs["direct"].values()))
    _, t99 = _percentiles(list(runs["tapped"].values()))
    return t99 - d99, d99, cpu_ms, steal[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dialect", choices=("sglang", "vllm-openai"), default="sglang")
    parser.add_argument("--stream", action="store_true", help="OpenAI dialect: stream both legs")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument(
        "--clients",
        type=int,
        default=CLIENTS,
        help="concurrent sessions per copy (default %(default)s; the OpenAI dialect's engine renders "
        "the chat template and rllm's gateway is heavier than tito serve: at 64 the shared core "
        "saturates and queueing, not the taps, makes the p99)",
    )
    args = parser.parse_args()
    if args.clients != CLIENTS:
        import bench_recorder

        bench_recorder.CLIENTS = args.clients
    requests = bodies() if args.dialect == "sglang" else chat_bodies(args.stream)
    results = []
    print(
        f"dialect {args.dialect}{', streamed' if args.stream or args.dialect == 'sglang' else ', not streamed'}",
        flush=True,
    )
    for i in range(args.runs):
        added, direct, cpu, steal = one_run(requests, args.dialect)
        results.append((added, direct, cpu, steal))
        print(
            f"run {i + 1}: taps add p99 {added:.2f} ms per engine call over direct p99 {direct:.2f} ms; "
            f"record process CPU {cpu:.2f} ms per request; host steal {steal:.1f}%",
            flush=True,
        )
    added, direct, _, _ = sorted(results)[len(results) // 2]
    steal = max(r[3] for r in results)
    print(
        f"median of {args.runs}: taps p99: {added:.2f} ms added per engine call, direct p99: {direct:.2f} ms, "
        f"ratio: {(direct + added) / direct:.4f}, host steal: up to {steal:.1f}%, record CPU median "
        f"{statistics.median(r[2] for r in results):.2f} ms per request"
    )


if __name__ == "__main__":
    main()
