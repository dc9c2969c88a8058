"""What one engine call for a turn gives the adapter, whatever the dialect: a `Generation`, or an `EngineError` that
says which status the agent is answered with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.channels import KeptSets, Routes, VersionSpan

# Engine statuses that mean "busy, send it again": the client gets its own wire's overloaded status, which its
# retry logic knows (Anthropic's 529 overloaded_error, 503 on the OpenAI and Gemini wires), not a plain 502.
OVERLOADED_ENGINE_STATUSES = frozenset({529})


class EngineError(Exception):
    """The engine failed a call; `status` is the HTTP status the adapter answers the agent with, unless
    `overloaded`: then the agent's wire says how it spells "overloaded" (`OVERLOADED_STATUS` per wire)."""

    def __init__(self, status: int, message: str, overloaded: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.overloaded = overloaded


def failed_call(path: str, status: int, detail: str) -> EngineError:
    """A non-200 answer: the engine's 4xx is the request's fault (400), anything else the engine's (502)."""
    return EngineError(
        400 if 400 <= status < 500 else 502,
        f"engine {path} failed ({status}): {detail}",
        overloaded=status in OVERLOADED_ENGINE_STATUSES,
    )


@dataclass
class Generation:
    rid: str
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: str  # stop, length, abort
    prompt_tokens: int
    cached_tokens: int = 0
    raw: dict[str, Any] = field(default_factory=dict)
    created: int = 0  # when the engine answered (Unix seconds): the `created` that OpenAI wires show
    routes: Routes | None = None  # per-token channels, where the engine sent them (`trajectory.channels`)
    kept: KeptSets | None = None
    weight_versions: tuple[VersionSpan, ...] = ()
