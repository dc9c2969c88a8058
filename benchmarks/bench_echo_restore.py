"""Echo restoring per turn in a long session (trajectory/adapters/canonical.EchoMemory).

Every turn the client re-sends the whole history as fresh JSON; the adapter maps each echoed assistant
message back to the reply it recorded, on the request path. A 200-turn coding-agent session: one tool call
per turn, reasoning dropped from echoes, arguments re-serialised, a 2 kB tool result after each call.
Baseline: keying every assistant message every turn (`EchoMemory(histories=0)`), in the same process.

Run: .venv/bin/python benchmarks/bench_echo_restore.py
Last line: echo restore at turn <N>: <X> ms per turn, baseline: <Y> ms, ratio: <Y/X>
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tito_rl.trajectory.adapters.canonical import EchoMemory, message, tool_call  # noqa: E402

TURNS = 200


def session() -> tuple[list[dict[str, Any]], list[bytes]]:
    """The replies sent, and each turn's request history as the client's JSON."""
    replies, bodies, history = [], [], [message("user", "Fix the failing test.")]
    for t in range(TURNS):
        args = {"file_path": f"/repo/src/module_{t}.py", "offset": t * 10, "limit": 200}
        replies.append(
            message(
                "assistant",
                f"Reading module {t}.",
                f"The bug may be in module {t}.",
                [tool_call("Read", json.dumps(args))],
            )
        )
        echoed = message("assistant", f"Reading module {t}.", None, [tool_call("Read", json.dumps(args, indent=1))])
        history = [*history, echoed, message("user", f"def f_{t}():\n" + "    pass\n" * 200)]
        bodies.append(json.dumps(history).encode())
    return replies, bodies


def per_turn_ms(memory: EchoMemory, replies: list[dict[str, Any]], bodies: list[bytes], last: int) -> float:
    """The session replayed turn by turn; the mean restore time over its `last` turns."""
    spent = 0.0
    for t, (reply, body) in enumerate(zip(replies, bodies, strict=True)):
        memory.remember(reply)
        history = json.loads(body)  # fresh dicts, as every request brings
        start = time.perf_counter()
        memory.restore(history)
        if t >= TURNS - last:
            spent += time.perf_counter() - start
    return spent / last * 1000


def main() -> int:
    replies, bodies = session()
    last = 20
    baseline = per_turn_ms(EchoMemory(histories=0), replies, bodies, last)
    ours = per_turn_ms(EchoMemory(), replies, bodies, last)
    print(f"{TURNS}-turn session, mean over its last {last} turns")
    print(
        f"echo restore at turn {TURNS}: {ours:.3f} ms per turn, baseline: {baseline:.3f} ms, "
        f"ratio: {baseline / max(ours, 1e-6):.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
