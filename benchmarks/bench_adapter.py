"""Adapter CPU per session: a 40-turn agent session growing to ~150k tokens, with the real Qwen3 tokenizer.

Each turn runs the adapter's prompt path (canonical translation, echo restore, system folding, template
render, encode) and its output path (decode + sglang parsers). Baseline, measured in the same process: the
same turns with a full re-render + full encode every turn. Prints the ratio; goal < 1 s and >= 5x.
"""

from __future__ import annotations

import json
import time

from tito_rl.trajectory.adapters.app import Adapter, AdapterSettings
from tito_rl.trajectory.adapters.wires import anthropic
from tito_rl.trajectory.manager import TrajectoryManager

TURNS = 40
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    }
]


def tool_output(turn: int) -> str:
    lines = [
        f"file_{turn}_{i:04d}.py  {i * 37 % 9973:6d} bytes  def handler_{i}(request): return {i}" for i in range(125)
    ]
    return "\n".join(lines)


def session_requests() -> tuple[list[bytes], list[list[int]]]:
    """Wire bodies of each turn (Claude Code shape) and the engine output ids each turn answers with."""
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    tok = load_tokenizer()
    messages: list[dict] = [{"role": "user", "content": "Refactor the handlers."}]
    bodies, outputs = [], []
    for turn in range(TURNS):
        bodies.append(
            json.dumps(
                {
                    "model": "m",
                    "max_tokens": 4096,
                    "system": "You are an agent.",
                    "tools": TOOLS,
                    "messages": messages,
                    "stream": True,
                }
            ).encode()
        )
        text = (
            f"<think>\nStep {turn}: inspect the next directory.\n</think>\n\nChecking part {turn}.\n"
            f'<tool_call>\n{{"name": "Bash", "arguments": {{"command": "ls -la src/part{turn}"}}}}\n</tool_call>'
        )
        outputs.append(tok.encode(text, add_special_tokens=False) + [151645])
        call_id = f"toolu_{turn:04d}"
        messages = [
            *messages,
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"Step {turn}: inspect the next directory.", "signature": "s"},
                    {"type": "text", "text": f"Checking part {turn}."},
                    {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": f"ls -la src/part{turn}"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call_id, "content": tool_output(turn)}],
            },
        ]
    return bodies, outputs


def run_session(adapter: Adapter, bodies: list[bytes], outputs: list[list[int]], full: bool) -> tuple[float, int]:
    state = adapter.state(f"bench-{full}")
    start = time.process_time()
    prompt_len = 0
    for body, output in zip(bodies, outputs, strict=True):
        turn = anthropic.parse_request(json.loads(body))
        if full:
            messages = adapter.renderer_messages(state, turn)
            ids = adapter.renderer.encode(adapter.renderer.render(messages, turn.tools))
        else:
            messages, ids = adapter.prepare(state, turn)
        parsed = adapter.parse_output(output, turn.tools)
        state.echoes.remember(adapter.reply_message(parsed))
        prompt_len = len(ids)
    return time.process_time() - start, prompt_len


def main() -> None:
    adapter = Adapter(AdapterSettings(), TrajectoryManager())
    bodies, outputs = session_requests()
    adapter.parse_output(outputs[0], anthropic.parse_request(json.loads(bodies[0])).tools)  # sglang import
    full_s, full_len = run_session(adapter, bodies, outputs, full=True)
    inc_s, inc_len = run_session(adapter, bodies, outputs, full=False)
    print(f"{TURNS} turns, final prompt {inc_len} tokens (full-render path: {full_len})")
    print(f"adapter: {inc_s:.3f} s, full-render: {full_s:.3f} s, ratio: {full_s / inc_s:.1f}")


if __name__ == "__main__":
    main()
