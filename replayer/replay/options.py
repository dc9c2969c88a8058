"""What a replay can be asked: strictness, the tokenizer, settings over the header's, the target, progress."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tito_rl.replayer.replay.plan import SessionPlan


@dataclass
class ReplayOptions:
    strict: bool = True  # stop each session at its first difference; False: note differences and go on
    tokenizer: str | None = None  # tokenizer folder; default: the header's, else the embedded Qwen3 one
    adapter: dict[str, Any] = field(default_factory=dict)  # AdapterSettings fields over the header's
    manager: dict[str, Any] = field(default_factory=dict)  # TrajectoryManager settings over the header's
    jobs: int = 1  # sessions replayed at once (in this process: `tito replay -j` runs processes)
    on_total: Callable[[int], None] | None = None  # progress: the agent exchanges about to be replayed
    on_exchange: Callable[[], None] | None = None  # progress: called once per replayed agent exchange
    target: str | None = None  # the system to replay through (`--target`); None: the one the header names
    trust_cassette: bool = False  # run the target only the cassette names (`--trust-cassette`; `profiles/trust.py`)
    engine_listen: str | None = None  # HOST:PORT of the engine leg, for a foreign target (an http:// one needs it)
    on_plan: Callable[[SessionPlan], None] | None = None  # each session's plan as its replay starts (inspect reads
