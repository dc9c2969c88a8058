"""Recorder benchmarks (issue 5, point 7).

(a) proxy latency: added p50/p99 per request at 64 concurrent sessions against the fake engine, as a ratio
    to calling the engine directly in the same run. Not written yet: `measure_proxy_latency` is its place.
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
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recorder.cassette_format import Header  # noqa: E402
from recorder.cassette_writer import CassetteWriter  # noqa: E402
from trajectory.adapters.tap import AgentExchange, EngineExchange  # noqa: E402
from trajectory.tokenizer import fingerprint, load_tokenizer  # noqa: E402

TURNS = 40
TARGET_TOKENS = 150_000
EOS = 151645
SESSION = "bench-session-token-0123456789"
CAPTURE = Path("/work/shared/captures/claude_baseline/bodies/baseline_001.json")


def tool_outputs() -> list[str]:
    """Realistic tool results: source files, read in a fixed order (what coding agents mostly read)."""
    import aiohttp

    files = sorted(Path(aiohttp.__file__).parent.glob("*.py"))
    return [f.read_text(errors="replace") for f in files if f.stat().st_size > 2000]


def build_session(tokenizer: Any) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """Tap events of one session, in the adapter's order: engine call, then the agent exchange."""
    base_body = json.loads(CAPTURE.read_bytes()) if CAPTURE.exists() else {"model": "m", "messages": []}
    system_text = json.dumps(base_body.get("system", "")) + json.dumps(base_body.get("tools", []))
    prompt = tokenizer.encode("<|im_start|>system\n" + system_text + "<|im_end|>\n<|im_start|>user\nFix the bug."
                              "<|im_end|>\n<|im_start|>assistant\n")
    sources = tool_outputs()
    per_turn_tokens = (TARGET_TOKENS - len(prompt)) // TURNS
    messages = list(base_body.get("messages", []))
    events: list[tuple[str, Any]] = []
    lp = 0
    for turn in range(TURNS):
        call = {"name": "Read", "arguments": {"file_path": f"/repo/src/module_{turn}.py"}}
        output = tokenizer.encode(f"<think>\nI should read module {turn} next to find the bug.\n</think>\n\n"
                                  f"<tool_call>\n{json.dumps(call)}\n</tool_call>") + [EOS]
        logprobs = [[-((lp + i) % 97) / 97.0 - 0.001, t, None] for i, t in enumerate(output)]
        lp += len(output)
        rid = f"{turn:032x}"
        request = {"rid": rid, "input_ids": prompt, "return_logprob": True,
                   "sampling_params": {"max_new_tokens": 32000, "skip_special_tokens": False,
                                       "spaces_between_special_tokens": False, "no_stop_trim": True}}
        response = {"text": tokenizer.decode(output[:-1]), "output_ids": output, "meta_info": {
            "id": rid, "finish_reason": {"type": "stop", "matched": EOS}, "prompt_tokens": len(prompt),
            "output_token_logprobs": logprobs, "completion_tokens": len(output), "cached_tokens": len(prompt) - 40,
            "e2e_latency": 0.5}}
        events.append(("engine", EngineExchange("POST", "/generate", request, 200, response,
                                                headers={"X-SMG-Routing-Key": SESSION}, started_s=turn * 2.0,
                                                duration_s=0.5)))
        body = dict(base_body, messages=messages)
        reply = [f'event: content_block_start\ndata: {{"index":0,"content_block":{{"type":"tool_use",'
                 f'"id":"toolu_{turn:04d}","name":"Read","input":{{}}}}}}\n\n',
                 f'event: content_block_delta\ndata: {{"index":0,"delta":{{"type":"input_json_delta",'
                 f'"partial_json":{json.dumps(json.dumps(call["arguments"]))}}}}}\n\n',
                 'event: message_stop\ndata: {"type":"message_stop"}\n\n']
        events.append(("agent", AgentExchange(
            "POST", "/v1/messages", "beta=true", {"Authorization": f"Bearer {SESSION}",
                                                  "Content-Type": "application/json"},
            json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode(), 200,
            {"Content-Type": "text/event-stream"}, reply_events=reply, started_s=turn * 2.0, duration_s=0.6,
            turn_index=turn)))
        # The tool result: the next slice of real source text, sized to reach the target over 40 turns.
        text, ids = "", []
        while len(ids) < per_turn_tokens:
            text += sources[(turn + len(text)) % len(sources)][: 4 * per_turn_tokens]
            ids = tokenizer.encode(text)
        text = tokenizer.decode(ids[:per_turn_tokens])
        tail = tokenizer.encode(f"<|im_end|>\n<|im_start|>user\n<tool_response>\n{text}\n</tool_response>"
                                "<|im_end|>\n<|im_start|>assistant\n")
        messages = messages + [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{turn:04d}", "name": "Read",
                                               "input": call["arguments"]}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{turn:04d}",
                                          "content": text}]}]
        prompt = prompt + output + tail
    last = [e for k, e in events if k == "engine"][-1]
    tokens = last.request["input_ids"] + last.response["output_ids"]
    n = len(tokens) - len(events[0][1].request["input_ids"])
    sample = {"tokens": tokens, "response_length": n, "loss_mask": [1] * n,
              "rollout_log_probs": [0.0] * (n - len(last.response["output_ids"]))
              + [t[0] for t in last.response["meta_info"]["output_token_logprobs"]],
              "reward": 1.0, "metadata": {"truncated": False, "use_tool": True}}
    return events, sample


def cassette_bytes(events: list[tuple[str, Any]], sample: dict[str, Any]) -> tuple[int, float]:
    buffer = io.BytesIO()
    start = time.perf_counter()
    writer = CassetteWriter(buffer, Header(tokenizer_fingerprint=fingerprint(), created="2026-01-01T00:00:00Z"))
    for kind, exchange in events:
        if kind == "engine":
            writer.engine_exchange(SESSION, "bearer", exchange)
        else:
            writer.agent_exchange(SESSION, "bearer", exchange)
    writer.session_finished(SESSION, "api", 1.0, [sample])
    return len(buffer.getvalue()), time.perf_counter() - start


def json_bytes(events: list[tuple[str, Any]], sample: dict[str, Any]) -> int:
    """The same traffic as JSON lines: what a per-call JSON audit log (Polar-style) stores."""
    total = 0
    for kind, e in events:
        if kind == "engine":
            line = {"leg": "engine", "path": e.path, "request": e.request, "status": e.status,
                    "response": e.response, "headers": e.headers, "started_s": e.started_s}
        else:
            line = {"leg": "agent", "path": e.path, "query": e.query, "headers": e.headers,
                    "body": json.loads(e.body), "status": e.status, "reply_headers": e.reply_headers,
                    "reply_events": e.reply_events, "started_s": e.started_s}
        total += len(json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()) + 1
    total += len(json.dumps({"leg": "samples", "samples": [sample]}, separators=(",", ":")).encode()) + 1
    return total


def measure_proxy_latency() -> tuple[float, float] | None:
    """Part (a), to come with `tito record`: (added p99 ms, direct p99 ms), or None while not measured."""
    return None


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
    latency = measure_proxy_latency()
    added, direct = ("n/a", "n/a") if latency is None else (f"{latency[0]:.2f}", f"{latency[1]:.2f}")
    print(f"proxy p99: {added} ms added, direct p99: {direct} ms, cassette: {b:.3f} bytes/token, "
          f"json: {j:.2f} bytes/token, size ratio: {j / b:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
