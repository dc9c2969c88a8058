"""The N-session loop: deterministic ids, one fresh sandbox per session, results in session order."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from tito_rl.recorder.agents.launchers import AgentLauncher, AgentTask, LaunchPlan
from tito_rl.recorder.agents.pins import CODEX
from tito_rl.recorder.agents.sandbox import LocalSandbox
from tito_rl.recorder.agents.sessions import SessionPlan, run_sessions, sandbox_factory
from tito_rl.trajectory.adapters.session import session_digest


class EnvEchoLauncher(AgentLauncher):
    """A stand-in agent: a Python one-liner that reports its HOME, token and working directory."""

    pin = CODEX

    def plan(self, task: AgentTask, home: str, binary: str, base_path: str) -> LaunchPlan:
        code = (
            "import json, os; print(json.dumps({'home': os.environ['HOME'], 'token': os.environ['TOKEN'],"
            " 'config': open(os.path.join(os.environ['HOME'], 'cfg.txt')).read(), 'cwd': os.getcwd()}))"
        )
        env = self._base_env(home, binary, base_path) | {"TOKEN": task.session_id}
        return LaunchPlan([binary, "-c", code], env, {"cfg.txt": task.root_url})

    def launch(self, sandbox, task, binary=None):
        return super().launch(sandbox, task, binary=sys.executable)


def test_each_session_gets_its_own_sandbox_and_token(tmp_path: Path) -> None:
    plan = SessionPlan("codex", "http://127.0.0.1:9/", "do it", "m", sessions=3, session_prefix="exp1", parallel=2)
    made: list[LocalSandbox] = []

    def factory(session_id: str) -> LocalSandbox:
        made.append(LocalSandbox(parent=tmp_path, name=session_id))
        return made[-1]

    runs = run_sessions(plan, factory, EnvEchoLauncher())
    ids = ["exp1-codex-0000", "exp1-codex-0001", "exp1-codex-0002"]
    assert [r.session_id for r in runs] == ids == plan.session_ids()
    reports = [json.loads(r.stdout_tail) for r in runs]
    assert [r["token"] for r in reports] == ids
    assert [r["home"] for r in reports] == [str((tmp_path / sid / "home").resolve()) for sid in ids]
    assert all(r["config"] == "http://127.0.0.1:9" for r in reports)
    assert all(run.ok for run in runs)
    assert sorted(box.root.name for box in made) == ids
    assert not any(box.root.exists() for box in made)  # every sandbox was closed


def test_bad_plans_are_rejected() -> None:
    with pytest.raises(ValueError, match="sessions must be at least 1"):
        SessionPlan("codex", "http://x", "t", "m", sessions=0).session_ids()
    with pytest.raises(ValueError, match="parallel"):
        run_sessions(SessionPlan("codex", "http://x", "t", "m", parallel=0), lambda sid: LocalSandbox())
    with pytest.raises(ValueError, match="unknown sandbox kind 'docker'"):
        sandbox_factory("docker")
    with pytest.raises(ValueError, match="unknown agent"):
        run_sessions(SessionPlan("aider", "http://x", "t", "m"), lambda sid: LocalSandbox())


def test_local_factory_names_the_sandbox_after_the_sessions_cassette_name(tmp_path: Path) -> None:
    # Not after the id: it is the API key, scrubbed from recorded bodies, and the path is in the prompt.
    with sandbox_factory("local", parent=tmp_path)("rec-codex-0007") as box:
        assert isinstance(box, LocalSandbox)
        assert box.root == (tmp_path / session_digest("rec-codex-0007")).resolve()
        assert "rec-codex-0007" not in str(box.root)


async def test_agent_results_or_the_exit_code_a_stop_or_a_sandbox_error_gives(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tito_rl.recorder.agents.runs import result_or_exit_code
    from tito_rl.recorder.agents.sandbox import SandboxError

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    assert await result_or_exit_code(loop.run_in_executor(None, lambda: ["run"]), stop) == ["run"]

    def refused() -> list[str]:
        raise SandboxError("sandbox /tmp/x exists")

    assert await result_or_exit_code(loop.run_in_executor(None, refused), stop) == 1
    assert capsys.readouterr().err == "tito record: sandbox /tmp/x exists\n"

    stop.set()
    never: asyncio.Future[list[str]] = loop.create_future()
    assert await result_or_exit_code(never, stop) == 130
    assert "stop requested; open sessions are finalized with reward 0" in capsys.readouterr().err
