"""rllm's gateway traces as training samples, built the way rllm's own trainer builds them.

rllm turns each gateway trace into one `Step` (`rllm/engine/trace_converter.py: trace_record_to_step`: the trace's
`prompt_token_ids`, `completion_token_ids` and `logprobs`, unchanged), matches the steps to the session's
trajectory in trace order (`rllm/engine/agentflow_engine.py: enrich_episode_with_traces`), and the trainer merges a
trajectory's steps into rows by prefix (`rllm/trainer/verl/transform.py: _process_trajectory`, the same rule as
`rllm/trainer/tinker/transform.py: trajectory_to_datums`): a step whose prompt starts with the running row's whole
sequence (prompt, then every observation and action so far) extends that row, its new prompt tokens as masked
observation (logprob 0.0) and its completion as trained action; any other step closes the row and opens a new one.
Every row carries the trajectory's reward. rllm-org/rllm at 9beb6e0f; docs/targets.md says what was followed.

Plain data in and out (trace dicts as `GET /sessions/{sid}/traces` returns them), so it runs without the gateway.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.records import Sample


@dataclass
class Row:
    """One merged row: rllm's *segment* (`_new_segment` in rllm/trainer/verl/transform.py)."""

    prompt: list[int]
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)  # indexes of the traces merged into this row

    @property
    def full(self) -> list[int]:
        return self.prompt + self.response

    def act(self, turn: int, observation: list[int], action: list[int], logprobs: list[float]) -> None:
        self.response += observation + action
        self.mask += [0] * len(observation) + [1] * len(action)
        self.logprobs += [0.0] * len(observation) + logprobs
        self.turns.append(turn)


@dataclass
class Built:
    """The samples and what the build decided, for `TargetFinish.stats`."""

    samples: list[dict[str, Any]]
    stats: dict[str, Any]


def _ids(value: Any) -> list[int]:
    return [int(t) for t in value] if isinstance(value, list) else []


def _aligned(logprobs: Any, n: int) -> tuple[list[float], bool]:
    """The trace's logprobs fitted to its completion: rllm's verl transform pads a short list with 0.0
    (`_new_segment`); a longer one is cut here, since tito's Sample requires one value per response token."""
    values = [float(x) for x in logprobs] if isinstance(logprobs, list) else []
    return (values + [0.0] * (n - len(values)))[:n], len(values) == n


def _fork_reason(row: Row, prompt: list[int]) -> str:
    """Where `prompt` leaves the row's running sequence, in the reasons of docs/manager.md: inside an earlier
    trained completion (`earlier-response`: the history re-rendered the model's output differently), or in the
    context (`prompt`)."""
    full = row.full
    at = next((i for i, (a, b) in enumerate(zip(full, prompt, strict=False)) if a != b), len(prompt))
    at = min(at, len(full) - 1)
    return "earlier-response" if at >= len(row.prompt) and row.mask[at - len(row.prompt)] == 1 else "prompt"


def build_samples(traces: list[dict[str, Any]], reward: float) -> Built:
    """rllm's rows for one session's traces (in the gateway's order, which is the order the calls completed).

    A trace with no prompt ids or no completion ids (an engine error, `GET /v1/models`, a non-vLLM engine) cannot
    train: rllm's strict enrich rejects the whole rollout for it (`EnrichMismatchError`), tito skips it and counts
    it in `malformed_traces` so the recording still has the others.
    """
    rows: list[Row] = []
    forks = {"prompt": 0, "earlier-response": 0}
    malformed = padded = generated = untrained = 0
    for turn, trace in enumerate(traces):
        prompt, action = _ids(trace.get("prompt_token_ids")), _ids(trace.get("completion_token_ids"))
        generated += bool(action)
        if not prompt or not action:
            malformed += 1
            untrained += bool(action)
            continue
        logprobs, exact = _aligned(trace.get("logprobs"), len(action))
        padded += not exact
        row = rows[-1] if rows else None
        full = row.full if row is not None else []
        if row is not None and len(prompt) >= len(full) and prompt[: len(full)] == full:
            row.act(turn, prompt[len(full) :], action, logprobs)
            continue
        if row is not None:  # rllm opens a new row; say where the prompt left the running sequence
            forks[_fork_reason(row, prompt)] += 1
        rows.append(Row(prompt=prompt))
        rows[-1].act(turn, [], action, logprobs)
    samples = [
        Sample(
            tokens=r.full,
            response_length=len(r.response),
            loss_mask=r.mask,
            rollout_log_probs=r.logprobs,
            reward=float(reward),
            metadata={"turns": r.turns},
        ).to_dict()
        for r in rows
    ]
    # turns: traces that generated tokens; untrained_turns: those of them no sample trains (no prompt ids)
    stats = {
        "turns": generated,
        "traces": len(traces),
        "samples": len(samples),
        "forks": {k: v for k, v in forks.items() if v},
        "merges": 0,
        "realigns": 0,
        "untrained_turns": untrained,
        "malformed_traces": malformed,
        "padded_logprobs": padded,
        "trained_tokens": sum(sum(r.mask) for r in rows),
        "masked_tokens": sum(len(r.mask) - sum(r.mask) for r in rows),
    }
    return Built(samples, stats)
