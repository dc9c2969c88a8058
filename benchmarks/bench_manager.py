"""Manager speed: record + linearize a 200-turn, 1M-prompt-token session, against a naive baseline.

The session is one chain whose prompts extend each other (1,000,000 prompt tokens summed over the 200
turns), plus a forked variant (a second chain branching at turn 100, and token drift every 40 turns).
The naive baseline runs the same algorithm but compares messages by JSON serialization and tokens
element by element in Python, as the reference system first did. Both run in this process.
"""

from __future__ import annotations

import contextlib
import json
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tito_rl.trajectory import linearize as lin  # noqa: E402
from tito_rl.trajectory import manager as mgr  # noqa: E402
from tito_rl.trajectory.manager import TrajectoryManager  # noqa: E402
from tito_rl.trajectory.records import TurnRecord  # noqa: E402
from tito_rl.trajectory.tree import MessageTree  # noqa: E402

TURNS = 200
TOTAL_PROMPT_TOKENS = 1_000_000
OUTPUT_TOKENS = 24


def build_session(forked: bool) -> list[tuple[list[dict], dict, TurnRecord]]:
    rng = random.Random(7)
    first = 1_000
    step = (TOTAL_PROMPT_TOKENS - TURNS * first) * 2 // (TURNS * (TURNS - 1))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 40},
        {"role": "user", "content": "Fix the failing test in the repository."},
    ]
    prompt = [rng.randrange(150_000) for _ in range(first)]
    turns = []
    for t in range(TURNS):
        output = [rng.randrange(150_000) for _ in range(OUTPUT_TOKENS)] + [151645]
        reply: dict[str, Any] = {
            "role": "assistant",
            "content": f"step {t}",
            "tool_calls": [{"type": "function", "function": {"name": "Bash", "arguments": {"command": f"ls {t}"}}}],
        }
        prompt_ids = list(prompt)
        if forked and t and t % 40 == 0:
            prompt_ids[len(prompt_ids) // 2] += 1  # token drift in the prompt region: forks
        turns.append((list(messages), reply, TurnRecord(prompt_ids, output, "stop", [-0.5] * len(output))))
        result = " ".join(f"line{rng.randrange(10**6)}" for _ in range(step // 2))
        messages = messages + [reply, {"role": "tool", "content": result, "tool_call_id": f"call_{t}"}]
        prompt = prompt + output + [198] + [rng.randrange(150_000) for _ in range(step - len(output) - 1)]
    if forked:  # a second chain: the conversation from turn 100 retried with another tool result
        base_msgs, _, base_turn = turns[100]
        for t in range(40):
            msgs = base_msgs + [{"role": "user", "content": f"try again {t}"}]
            rec = TurnRecord(base_turn.prompt_ids + [t + 7], [t, t + 1, 151645], "stop", [-1.0] * 3)
            turns.append((msgs, {"role": "assistant", "content": f"retry {t}"}, rec))
    return turns


def run(turns: list[tuple[list[dict], dict, TurnRecord]]) -> tuple[float, float, int]:
    manager = TrajectoryManager()
    t0 = time.perf_counter()
    for msgs, reply, rec in turns:
        manager.record_turn("bench", msgs, reply, rec)
    t1 = time.perf_counter()
    samples = manager.samples("bench", 1.0)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(samples)


def naive_prefix_len(a: list[int], b: list[int]) -> int:
    i = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        i += 1
    return i


def naive_match(self: MessageTree, parent, message):
    key = json.dumps(message, sort_keys=True)
    for child in parent.children:
        if json.dumps(child.raw, sort_keys=True) == key:
            return child
    return None


@contextlib.contextmanager
def naive() -> Iterator[None]:
    cached_chain = lin.linearize_chain  # the manager's, imported by name into tito_rl.trajectory.manager

    def uncached_chain(leaf, trained, threshold, events, _cache=None):
        return cached_chain(leaf, trained, threshold, events, None)

    with (
        mock.patch.object(lin, "common_prefix_len", naive_prefix_len),
        mock.patch.object(MessageTree, "_match", naive_match),
        mock.patch.object(mgr, "linearize_chain", uncached_chain),
    ):
        yield


def best(turns, repeats: int = 3) -> tuple[float, float, int]:
    results = [run(turns) for _ in range(repeats)]
    return min(results, key=lambda r: r[0] + r[1])


def main() -> None:
    chain, forked = build_session(False), build_session(True)
    prompt_total = sum(len(rec.prompt_ids) for _, _, rec in chain)
    rec_c, lin_c, n_c = best(chain)
    rec_f, lin_f, n_f = best(forked)
    with naive():
        nrec_c, nlin_c, nn_c = best(chain, 1)
        nrec_f, nlin_f, nn_f = best(forked, 1)
    assert (n_c, n_f) == (nn_c, nn_f), "naive baseline must produce the same samples"
    ms = 1000
    print(
        f"chain: {len(chain)} turns, {prompt_total} prompt tokens: record {rec_c * ms:.1f} ms, "
        f"linearize {lin_c * ms:.1f} ms, {n_c} sample(s)"
    )
    print(f"forked: {len(forked)} turns: record {rec_f * ms:.1f} ms, linearize {lin_f * ms:.1f} ms, {n_f} samples")
    print(
        f"naive chain: record {nrec_c * ms:.1f} ms, linearize {nlin_c * ms:.1f} ms; "
        f"naive forked: record {nrec_f * ms:.1f} ms, linearize {nlin_f * ms:.1f} ms"
    )
    manager_ms = (rec_c + lin_c) * ms
    naive_ms = (nrec_c + nlin_c) * ms
    print(f"manager: {manager_ms:.2f} ms, naive: {naive_ms:.2f} ms, ratio: {naive_ms / manager_ms:.1f}")


if __name__ == "__main__":
    main()
