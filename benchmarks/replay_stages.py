"""Where a replay's time goes, stage by stage: timers wrapped around the functions that do each stage's work,
in this process, for `bench_corpus.py`'s profile.

Stages: request (the agent's JSON parsed into messages), render (echo restore, system folding, the chat
template), encode (incremental and line-cached), engine-leg lookup (the recorded call found and its request
compared), parse (decode and sglang's parsers), reply (the wire's reply built), manager (each turn recorded,
each finish linearized), compare (replies and samples against the recording), golden (sections rendered and
checked). What is left of the wall time is the rest: HTTP on the Unix socket, the event loop, reading and
planning the cassette, printing.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

STAGES = ("request", "render", "encode", "engine-leg lookup", "parse", "reply", "manager", "compare", "golden")


def _targets() -> list[tuple[str, Any, str]]:
    """(stage, owner, attribute) of every function a stage's time is measured on."""
    from tito_rl.replayer.goldens import files as goldens
    from tito_rl.replayer.replay import engine_leg, harness
    from tito_rl.trajectory.adapters import app
    from tito_rl.trajectory.adapters.rendering import render
    from tito_rl.trajectory.adapters.wires import anthropic, gemini, openai_chat, responses
    from tito_rl.trajectory.manager import TrajectoryManager

    wires = (anthropic, openai_chat, responses, gemini)
    return (
        [("request", w, "parse_request") for w in wires]
        + [
            ("render", app.Adapter, "renderer_messages"),
            ("render", render.ChatRenderer, "render"),
            ("encode", render.IncrementalEncoder, "encode"),
            ("engine-leg lookup", engine_leg.ExchangeLeg, "take"),
            ("engine-leg lookup", engine_leg.CassetteTransport, "check_generate"),
            ("parse", app.Adapter, "parse_output"),
            ("reply", app.Adapter, "reply_message"),
        ]
        + [("reply", w, name) for w in wires for name in ("build_events", "build_json")]
        + [
            ("manager", TrajectoryManager, "record_turn"),
            ("manager", TrajectoryManager, "record_side_turn"),
            ("manager", harness.CapturingManager, "finish"),
            ("compare", harness, "exchange_difference"),
            ("compare", harness, "samples_difference"),
            ("golden", goldens.GoldenBook, "check"),
        ]
    )


@contextlib.contextmanager
def stage_timers(clock: Callable[[], float] = time.perf_counter) -> Iterator[dict[str, float]]:
    """Seconds per stage while the block runs (by `clock`: wall time, or `time.process_time` for this process's
    CPU time, which a busy host's other jobs do not move). A call inside another timed call of the same stage
    counts once."""
    spent: dict[str, float] = defaultdict(float)
    depth: dict[str, int] = defaultdict(int)
    saved = []
    for stage, owner, name in _targets():
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, _timed(stage, original, spent, depth, clock))
    try:
        yield spent
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


def _timed(
    stage: str, fn: Callable[..., Any], spent: dict[str, float], depth: dict[str, int], clock: Callable[[], float]
) -> Any:
    if isinstance(fn, staticmethod):
        return staticmethod(_timed(stage, fn.__func__, spent, depth, clock))

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        depth[stage] += 1
        started = clock()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[stage] -= 1
            if not depth[stage]:
                spent[stage] += clock() - started

    return timed
