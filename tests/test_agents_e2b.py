"""E2BSandbox against a stand-in for the e2b SDK: the exact calls made at the SDK boundary."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tito_rl.recorder.agents.launchers import AgentTask, ClaudeCodeLauncher
from tito_rl.recorder.agents.pins import CLAUDE_CODE, MINI_SWE_AGENT
from tito_rl.recorder.agents.sandbox import SYSTEM_PATH, E2BSandbox, SandboxError


class FakeResult:
    def __init__(self, exit_code: int = 0, stdout: str = "", stderr: str = "") -> None:
        self.exit_code, self.stdout, self.stderr, self.error = exit_code, stdout, stderr, None


class FakeSDKSandbox:
    """Same method names and keywords as e2b.Sandbox (create, files.write/make_dir, commands.run, kill)."""

    created: list[dict[str, Any]] = []

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.outcomes: list[Any] = []  # per commands.run: a FakeResult or an exception to raise
        outer = self

        class Files:
            def make_dir(self, path: str) -> bool:
                outer.calls.append(("files.make_dir", path))
                return True

            def write(self, path: str, data: str | bytes) -> None:
                outer.calls.append(("files.write", path, data))

        class Commands:
            def run(self, cmd: str, **kwargs: Any) -> FakeResult:
                outer.calls.append(("commands.run", cmd, kwargs))
                outcome = outer.outcomes.pop(0) if outer.outcomes else FakeResult()
                if isinstance(outcome, BaseException):
                    raise outcome
                return outcome

        self.files, self.commands = Files(), Commands()

    @classmethod
    def create(cls, **kwargs: Any) -> FakeSDKSandbox:
        cls.created.append(kwargs)
        return cls()

    def kill(self) -> bool:
        self.calls.append(("kill",))
        return True


@pytest.fixture
def sdk() -> FakeSDKSandbox:
    FakeSDKSandbox.created.clear()
    return FakeSDKSandbox()


def test_create_starts_a_vm_and_makes_fresh_home_and_workdir() -> None:
    FakeSDKSandbox.created.clear()
    box = E2BSandbox.create(template="tito-agents", lifetime_s=900, sandbox_class=FakeSDKSandbox)
    assert FakeSDKSandbox.created == [{"template": "tito-agents", "timeout": 900}]
    assert box._sdk.calls == [
        ("files.make_dir", "/home/user/tito/home"),
        ("files.make_dir", "/home/user/tito/work"),
    ]
    assert (box.home, box.workdir, box.base_path) == (
        "/home/user/tito/home",
        "/home/user/tito/work",
        SYSTEM_PATH,
    )


def test_write_file_is_relative_to_home(sdk: FakeSDKSandbox) -> None:
    box = E2BSandbox(sdk)
    assert box.write_file(".qwen/settings.json", "{}") == "/home/user/tito/home/.qwen/settings.json"
    assert box.write_file("/etc/x", b"y") == "/etc/x"
    assert sdk.calls[-2:] == [
        ("files.write", "/home/user/tito/home/.qwen/settings.json", "{}"),
        ("files.write", "/etc/x", b"y"),
    ]


def test_run_quotes_argv_redirects_stdin_and_passes_env_cwd_timeout(sdk: FakeSDKSandbox) -> None:
    box = E2BSandbox(sdk)
    sdk.outcomes = [FakeResult(0, "hi\n", "")]
    result = box.run(["claude", "-p", "it's a task"], {"HOME": box.home}, timeout_s=30)
    assert sdk.calls[-1] == (
        "commands.run",
        "claude -p 'it'\"'\"'s a task' < /dev/null",
        {
            "envs": {"HOME": "/home/user/tito/home"},
            "cwd": "/home/user/tito/work",
            "timeout": 30,
            "stdin": False,
        },
    )
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (0, "hi\n", "", False)


def test_a_non_zero_exit_is_a_result_not_an_exception(sdk: FakeSDKSandbox) -> None:
    from e2b import CommandExitException  # here: importing e2b is half a second of every worker's collection

    box = E2BSandbox(sdk)
    sdk.outcomes = [CommandExitException(stderr="bad", stdout="partial", exit_code=2, error="exit status 2")]
    result = box.run(["false"], {}, timeout_s=5)
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (2, "partial", "bad", False)


def test_a_sdk_timeout_is_a_timed_out_result(sdk: FakeSDKSandbox) -> None:
    from e2b import TimeoutException  # here: importing e2b is half a second of every worker's collection

    box = E2BSandbox(sdk)
    sdk.outcomes = [TimeoutException("context deadline exceeded")]
    result = box.run(["sleep", "100"], {}, timeout_s=1)
    assert result.timed_out and result.exit_code is None and "deadline" in result.stderr


def test_install_agent_runs_npm_in_the_vm_only_when_missing(sdk: FakeSDKSandbox) -> None:
    box = E2BSandbox(sdk)
    target = "/home/user/.tools/npm/claude-code-2.1.330"
    binary = f"{target}/node_modules/.bin/claude"
    sdk.outcomes = [FakeResult(1), FakeResult(0)]
    assert box.install_agent(CLAUDE_CODE) == binary
    env = {"HOME": "/home/user", "PATH": SYSTEM_PATH}
    assert sdk.calls[-2:] == [
        (
            "commands.run",
            f"test -x {binary} < /dev/null",
            {"envs": env, "cwd": "/home/user/tito/work", "timeout": 30, "stdin": False},
        ),
        (
            "commands.run",
            f"npm install --prefix {target} --save-exact --no-audit --no-fund --loglevel=error "
            "@anthropic-ai/claude-code@2.1.330 < /dev/null",
            {"envs": env, "cwd": "/home/user", "timeout": 900, "stdin": False},
        ),
    ]
    sdk.calls.clear()
    sdk.outcomes = [FakeResult(0)]
    assert box.install_agent(CLAUDE_CODE) == binary
    assert [call[1].split()[0] for call in sdk.calls] == ["test"]


def test_a_pypi_pin_gets_a_venv_of_its_own_in_the_vm(sdk: FakeSDKSandbox) -> None:
    box = E2BSandbox(sdk)
    target = "/home/user/.tools/venv/mini-swe-agent-2.4.6"
    sdk.outcomes = [FakeResult(1), FakeResult(0), FakeResult(0)]
    assert box.install_agent(MINI_SWE_AGENT) == f"{target}/bin/mini"
    assert [call[1] for call in sdk.calls[-3:]] == [
        f"test -x {target}/bin/mini < /dev/null",
        f"python3 -m venv {target} < /dev/null",
        f"{target}/bin/python -m pip install -q --disable-pip-version-check mini-swe-agent==2.4.6 litellm==1.110.2 "
        "openai==3.57.0 < /dev/null",
    ]


def test_a_failed_npm_install_says_why(sdk: FakeSDKSandbox) -> None:
    from e2b import CommandExitException  # here: importing e2b is half a second of every worker's collection

    box = E2BSandbox(sdk)
    sdk.outcomes = [
        FakeResult(1),
        CommandExitException(stderr="E404 not found", stdout="", exit_code=1, error=None),
    ]
    with pytest.raises(SandboxError, match="E404 not found"):
        box.install_agent(CLAUDE_CODE)


def test_claude_code_launch_through_e2b(sdk: FakeSDKSandbox) -> None:
    box = E2BSandbox(sdk)
    sdk.outcomes = [FakeResult(0, '{"type":"result"}\n', "")]
    task = AgentTask("https://proxy.example.test/s/run-1", "run-1", "list files", "qwen3-8b", timeout_s=120)
    run = ClaudeCodeLauncher().launch(box, task, binary="/opt/agents/bin/claude")
    ((name, cmd, kwargs),) = [call for call in sdk.calls if call[0] == "commands.run"]
    assert cmd == (
        "/opt/agents/bin/claude -p 'list files' --output-format stream-json --verbose "
        "--dangerously-skip-permissions --model qwen3-8b < /dev/null"
    )
    assert kwargs["envs"]["ANTHROPIC_AUTH_TOKEN"] == "run-1"
    assert kwargs["envs"]["ANTHROPIC_BASE_URL"] == "https://proxy.example.test/s/run-1"
    assert kwargs["envs"]["HOME"] == "/home/user/tito/home"
    assert kwargs["envs"]["PATH"] == f"/opt/agents/bin:{SYSTEM_PATH}"
    assert (kwargs["timeout"], kwargs["stdin"]) == (120, False)
    assert run.ok and run.stdout_tail == '{"type":"result"}\n'


def test_close_kills_the_vm_once(sdk: FakeSDKSandbox) -> None:
    with E2BSandbox(sdk) as box:
        pass
    box.close()
    assert sdk.calls.count(("kill",)) == 1
    with pytest.raises(SandboxError, match="closed"):
        box.write_file("a", "b")


def test_the_calls_made_fit_the_real_sdk_signatures(sdk: FakeSDKSandbox) -> None:
    """Keeps the stand-in honest: every keyword used above is one the installed e2b SDK accepts."""
    import inspect

    import e2b
    from e2b.sandbox_sync.commands.command import Commands
    from e2b.sandbox_sync.filesystem.filesystem import Filesystem

    box = E2BSandbox(sdk)
    box.write_file("a", "b")
    box.run(["true"], {"A": "1"}, timeout_s=5)
    methods: dict[str, Callable[..., Any]] = {
        "files.make_dir": Filesystem.make_dir,
        "files.write": Filesystem.write,
        "commands.run": Commands.run,
    }
    for name, *args in sdk.calls:
        method = methods[name]
        if name == "commands.run":
            inspect.signature(method).bind(None, args[0], **args[1])
        else:
            inspect.signature(method).bind(None, *args)
    inspect.signature(e2b.Sandbox.create).bind(template="t", timeout=60)
