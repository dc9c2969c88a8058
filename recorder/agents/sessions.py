"""Run N recorded sessions of one agent, each in its own fresh sandbox: the loop behind
`tito record --agent NAME --task TEXT --sessions N`.

Session ids are derived from a prefix and the session number (never random), so a re-recording of the
same plan produces the same ids, and each id is the run's API token, which the adapter reads back.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tito_rl.recorder.agents.launchers import AgentLauncher, AgentRun, AgentTask, launcher_for
from tito_rl.recorder.agents.sandbox import E2BSandbox, LocalSandbox, Sandbox
from tito_rl.trajectory.adapters.session import session_digest

SandboxFactory = Callable[[str], Sandbox]  # session id -> a fresh sandbox


@dataclass(frozen=True)
class SessionPlan:
    agent: str
    base_url: str
    task: str
    model: str
    sessions: int = 1
    session_prefix: str = "rec"
    timeout_s: float = 600.0
    parallel: int = 1
    session_path: str | None = None  # the target's `TargetInfo.session_path` (the session in the URL), if any

    def session_ids(self) -> list[str]:
        if self.sessions < 1:
            raise ValueError(f"sessions must be at least 1, got {self.sessions}")
        return [f"{self.session_prefix}-{self.agent}-{n:04d}" for n in range(self.sessions)]


def sandbox_factory(kind: str, **options: object) -> SandboxFactory:
    """`local` (default; options go to LocalSandbox) or `e2b` (options go to E2BSandbox.create)."""
    if kind == "local":
        # Named after the session's cassette name, not its id: the id is the agent's API key, which the
        # recorder scrubs from bodies (to the name), and the CLIs put this path into the prompt, so a path
        # holding the id would be replayed as other tokens than the engine saw. The name is as stable.
        return lambda session_id: LocalSandbox(name=session_digest(session_id), **options)  # type: ignore[arg-type]
    if kind == "e2b":
        return lambda session_id: E2BSandbox.create(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown sandbox kind {kind!r}; use 'local' or 'e2b'")


def run_sessions(
    plan: SessionPlan, make_sandbox: SandboxFactory, launcher: AgentLauncher | None = None
) -> list[AgentRun]:
    """Runs every session (at most `plan.parallel` at once); results come back in session order."""
    launcher = launcher or launcher_for(plan.agent)
    if plan.parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {plan.parallel}")
    tasks = [
        AgentTask(plan.base_url, sid, plan.task, plan.model, plan.timeout_s, plan.session_path)
        for sid in plan.session_ids()
    ]

    def one(task: AgentTask) -> AgentRun:
        with make_sandbox(task.session_id) as sandbox:
            return launcher.launch(sandbox, task)

    with ThreadPoolExecutor(max_workers=plan.parallel) as pool:
        return list(pool.map(one, tasks))
