"""Play a CLI script (`recorder/agents/cli_script.py`) against the recording proxy: every session in its own sandbox,
all sessions at once, each session's runs one after the other in that sandbox (so `--continue` finds the
previous run's conversation under the same HOME and working directory).

A run with `kill_after_s` is the sandbox's timeout: the CLI's whole process group is killed mid-turn, which
is what the proxy must notice (it aborts the engine request). Such a run counts as ok when it was killed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tito_rl.recorder.agents.cli_script import CliRun, CliScript, CliSession
from tito_rl.recorder.agents.launchers import TAIL_CHARS, AgentRun, AgentTask, LaunchPlan, launcher_for
from tito_rl.recorder.agents.sandbox import Sandbox
from tito_rl.recorder.agents.sessions import SandboxFactory

log = logging.getLogger(__name__)

# After a kill: time for the proxy to see the dropped connection (a 50 ms tick), abort the engine request and
# record the 499, before the next run starts or the session is finished.
SETTLE_AFTER_KILL_S = 1.5


@dataclass(frozen=True)
class SessionOutcome:
    session: CliSession
    runs: tuple[AgentRun, ...]

    @property
    def ok(self) -> bool:
        return len(self.runs) == len(self.session.runs) and all(
            run_ok(spec, run) for spec, run in zip(self.session.runs, self.runs, strict=True)
        )


def run_ok(spec: CliRun, run: AgentRun) -> bool:
    """A run meant to be killed is ok when it was; any other run when the CLI exited 0."""
    return run.timed_out if spec.kill_after_s is not None else run.ok


def plan_run(
    session: CliSession,
    run: CliRun,
    base_url: str,
    model: str,
    sandbox: Sandbox,
    binary: str,
    timeout_s: float,
    session_path: str | None = None,
) -> tuple[LaunchPlan, float]:
    """The launcher's plan with the run's flags appended and the session's environment added; `session_path`:
    the target's (`TargetInfo.session_path`), where it takes the session from the URL."""
    launcher = launcher_for(session.agent)
    task = AgentTask(base_url, session.id, run.task, model, timeout_s, session_path)
    plan = launcher.plan(task, sandbox.home, binary, sandbox.base_path)
    plan = LaunchPlan([*plan.argv, *run.args], plan.env | session.env, plan.files)
    return plan, run.kill_after_s if run.kill_after_s is not None else timeout_s


def run_session(
    session: CliSession, base_url: str, model: str, sandbox: Sandbox, timeout_s: float, session_path: str | None = None
) -> SessionOutcome:
    launcher = launcher_for(session.agent)
    binary = sandbox.install_agent(launcher.pin)
    done: list[AgentRun] = []
    for spec in session.runs:
        plan, limit = plan_run(session, spec, base_url, model, sandbox, binary, timeout_s, session_path)
        for path, content in plan.files.items():
            sandbox.write_file(path, content)
        log.info("run %d of %s: %r", len(done), session.id, plan)
        result = sandbox.run(plan.argv, plan.env, timeout_s=limit)
        run = AgentRun(
            session.id,
            launcher.pin.name,
            launcher.pin.version,
            result.exit_code,
            result.timed_out,
            result.stdout[-TAIL_CHARS:],
            result.stderr[-TAIL_CHARS:],
            result.duration_s,
        )
        done.append(run)
        if spec.kill_after_s is not None:
            time.sleep(SETTLE_AFTER_KILL_S)
        if not run_ok(spec, run):
            break  # the later runs (a --continue) would continue something else than the script meant
    return SessionOutcome(session, tuple(done))


def run_script(
    script: CliScript,
    base_url: str,
    model: str,
    make_sandbox: SandboxFactory,
    base_urls: Mapping[str, str] | None = None,
    session_path: str | None = None,
) -> list[SessionOutcome]:
    """Every session at once; outcomes in script order. `base_urls`: a session's own URL (its stream-cutting
    relay) in place of `base_url`; `session_path`: the target's, added to each CLI's base URL."""

    def one(session: CliSession) -> SessionOutcome:
        with make_sandbox(session.id) as sandbox:
            return run_session(
                session, (base_urls or {}).get(session.id, base_url), model, sandbox, script.timeout_s, session_path
            )

    with ThreadPoolExecutor(max_workers=len(script.sessions)) as pool:
        return list(pool.map(one, script.sessions))
