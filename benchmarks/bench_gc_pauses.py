"""Garbage-collector pauses from token lists (see trajectory/runtime/untracked.py).

64 sessions with a 100k-token prompt each in flight, the load the recording proxy and `tito serve` carry
with long-context agents. Each prompt is held as the adapter holds it: a TurnRecord (prompt ids, output ids,
logprobs). The pause is the time of one collector pass over them: gen0 (what the server's collector runs
most often; the prompts are young while in flight), gen1, and a full pass (what session state sees).
Baseline: the same lists as plain tracked lists, measured in the same process.

Run: .venv/bin/python benchmarks/bench_gc_pauses.py
Last line: gc pause (gen0): <X> ms with untracked token lists, baseline: <Y> ms, ratio: <Y/X>
"""

from __future__ import annotations

import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tito_rl.trajectory.records import TurnRecord  # noqa: E402

SESSIONS = 64
PROMPT_TOKENS = 100_000
OUTPUT_TOKENS = 500
VOCAB = 151_643


def _turns(rng: random.Random, records: bool) -> list[Any]:
    """One turn per session, its ids fresh int objects, as the tokenizer and the engine's JSON give them."""
    out: list[Any] = []
    for _ in range(SESSIONS):
        prompt = rng.choices(range(VOCAB), k=PROMPT_TOKENS)
        output = rng.choices(range(VOCAB), k=OUTPUT_TOKENS)
        logprobs = [-rng.random() for _ in range(OUTPUT_TOKENS)]
        out.append(TurnRecord(prompt, output, "stop", logprobs) if records else (prompt, output, logprobs))
    return out


def pauses(records: bool) -> tuple[float, float, float]:
    """(gen0, gen1, full) pass times in ms with the turns alive, each pass's objects where a server has them."""
    gc.collect()
    gc.freeze()  # this harness's own objects out of the way, as a tito server freezes its startup objects
    try:
        turns = _turns(random.Random(0), records)
        times = []
        for generation in (0, 1, 2):  # the turns are young, then middle-aged, then old
            start = time.perf_counter()
            gc.collect(generation)
            times.append((time.perf_counter() - start) * 1000)
        del turns
    finally:
        gc.unfreeze()
    return times[0], times[1], times[2]


def main() -> int:
    gc.disable()  # only the passes measured here run
    base = pauses(records=False)
    ours = pauses(records=True)
    print(f"{SESSIONS} sessions x {PROMPT_TOKENS} prompt tokens in flight")
    for name, b, o in zip(("gen0", "gen1", "full"), base, ours, strict=True):
        print(f"  {name} pass: {o:8.2f} ms untracked (TurnRecord), {b:8.2f} ms as plain lists")
    print(
        f"gc pause (gen0): {ours[0]:.2f} ms with untracked token lists, baseline: {base[0]:.2f} ms, "
        f"ratio: {base[0] / max(ours[0], 1e-3):.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
