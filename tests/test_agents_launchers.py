"""Each launcher's env, config files and command line follow the measured recipes exactly."""

from __future__ import annotations

import json
import logging
import tomllib
from collections.abc import Mapping, Sequence

import pytest

from tito_rl.recorder.agents.launchers import (
    LAUNCHERS,
    TAIL_CHARS,
    AgentTask,
    ClaudeCodeLauncher,
    CodexLauncher,
    GeminiCliLauncher,
    MiniSweAgentLauncher,
    OpencodeLauncher,
    QwenCodeLauncher,
    launcher_for,
)
from tito_rl.recorder.agents.pins import PINS, AgentPin, pin_for
from tito_rl.recorder.agents.sandbox import CommandResult, Sandbox

SID = "sess-7f3a.secret-token"
HOME = "/sandbox/home"
BINARY = "/opt/tools/bin/agent"
BASE_PATH = "/usr/bin:/bin"


def task(**overrides: object) -> AgentTask:
    fields = {
        "base_url": "http://127.0.0.1:8123/",
        "session_id": SID,
        "task": "fix the failing test",
        "model": "qwen3-8b",
    } | overrides
    return AgentTask(**fields)  # type: ignore[arg-type]


BASE_ENV = {"PATH": f"/opt/tools/bin:{BASE_PATH}", "HOME": HOME, "TERM": "dumb", "LANG": "C.UTF-8"}


def test_registry_covers_the_pinned_clis_with_their_versions() -> None:
    assert sorted(LAUNCHERS) == ["claude-code", "codex", "gemini-cli", "mini-swe-agent", "opencode", "qwen-code"]
    assert {name: pin.spec for name, pin in PINS.items()} == {
        "claude-code": "@anthropic-ai/claude-code@2.1.330",
        "codex": "@openai/codex@0.169.0",
        "qwen-code": "@qwen-code/qwen-code@0.24.4",
        "opencode": "opencode-ai@1.18.33",
        "gemini-cli": "@google/gemini-cli@0.61.0",
        "mini-swe-agent": "mini-swe-agent==2.4.6",  # from PyPI, with the libraries that build its requests
    }
    assert {n for n, p in PINS.items() if p.registry == "pypi"} == {"mini-swe-agent"}
    assert PINS["mini-swe-agent"].with_pins == ("litellm==1.110.2", "openai==3.57.0")
    for name, launcher in LAUNCHERS.items():
        assert launcher.pin is pin_for(name)
    assert isinstance(launcher_for("codex"), CodexLauncher)


def test_unknown_agent_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown agent 'gemini'.*gemini-cli, mini-swe-agent, opencode, qwen-code"):
        launcher_for("gemini")
    with pytest.raises(ValueError, match="unknown agent"):
        pin_for("aider")


def test_claude_code_plan() -> None:
    plan = ClaudeCodeLauncher().plan(task(), HOME, BINARY, BASE_PATH)
    assert plan.env == BASE_ENV | {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:8123",
        "ANTHROPIC_AUTH_TOKEN": SID,
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "IS_SANDBOX": "1",
    }
    assert "ANTHROPIC_API_KEY" not in plan.env  # it would arrive as x-api-key, not as the bearer token
    assert plan.argv == [
        BINARY,
        "-p",
        "fix the failing test",
        "--output-format",
        "stream-json",
        "--verbose",
        "--dangerously-skip-permissions",
        "--model",
        "qwen3-8b",
    ]
    assert plan.files == {}


def test_claude_code_keeps_a_path_prefix_for_per_session_routing() -> None:
    plan = ClaudeCodeLauncher().plan(task(base_url="http://127.0.0.1:8123/s/abc"), HOME, BINARY, BASE_PATH)
    assert plan.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123/s/abc"


def test_codex_plan_uses_a_responses_provider_in_a_fresh_codex_home() -> None:
    plan = CodexLauncher().plan(task(model='we"ird\\name'), HOME, BINARY, BASE_PATH)
    assert plan.env == BASE_ENV | {"CODEX_HOME": HOME, "LOCAL_API_KEY": SID}
    assert plan.argv == [BINARY, "exec", "--json", "--skip-git-repo-check", "fix the failing test"]
    assert list(plan.files) == ["config.toml"]
    config = tomllib.loads(plan.files["config.toml"])
    assert config == {
        "model": 'we"ird\\name',
        "model_provider": "local",
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access",
        "check_for_update_on_startup": False,
        "analytics": {"enabled": False},
        "model_providers": {
            "local": {
                "name": "local",
                "base_url": "http://127.0.0.1:8123/v1",
                "wire_api": "responses",
                "env_key": "LOCAL_API_KEY",
            }
        },
    }
    assert SID not in plan.files["config.toml"]  # the key is read from the environment


def test_qwen_code_plan() -> None:
    plan = QwenCodeLauncher().plan(task(), HOME, BINARY, BASE_PATH)
    assert plan.env == BASE_ENV | {
        "OPENAI_BASE_URL": "http://127.0.0.1:8123/v1",
        "OPENAI_API_KEY": SID,
        "OPENAI_MODEL": "qwen3-8b",
    }
    assert plan.argv == [
        BINARY,
        "--auth-type",
        "openai",
        "--yolo",
        "-m",
        "qwen3-8b",
        "-o",
        "stream-json",
        "fix the failing test",
    ]
    assert json.loads(plan.files[".qwen/settings.json"]) == {
        "security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}}
    }


def test_opencode_plan() -> None:
    plan = OpencodeLauncher().plan(task(), HOME, BINARY, BASE_PATH)
    assert plan.env == BASE_ENV | {
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    assert plan.argv == [
        BINARY,
        "run",
        "--format",
        "json",
        "--auto",
        "-m",
        "tito/qwen3-8b",
        "fix the failing test",
    ]
    config = json.loads(plan.files[".config/opencode/opencode.json"])
    assert config["model"] == "tito/qwen3-8b"
    assert config["permission"] == {"*": "allow"}
    assert config["provider"]["tito"]["npm"] == "@ai-sdk/openai-compatible"
    assert config["provider"]["tito"]["options"] == {"baseURL": "http://127.0.0.1:8123/v1", "apiKey": SID}
    assert config["provider"]["tito"]["models"] == {"qwen3-8b": {}}


def test_gemini_cli_plan_authenticates_with_the_api_key_and_keeps_telemetry_off() -> None:
    plan = GeminiCliLauncher().plan(task(base_url="http://127.0.0.1:8123/s/abc/"), HOME, BINARY, BASE_PATH)
    assert plan.env == BASE_ENV | {
        "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:8123/s/abc",  # a path prefix is kept
        "GEMINI_API_KEY": SID,  # arrives as x-goog-api-key
    }
    assert plan.argv == [BINARY, "-p", "fix the failing test", "--yolo", "-m", "qwen3-8b", "-o", "stream-json"]
    assert json.loads(plan.files[".gemini/settings.json"]) == {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
    }


def test_mini_swe_agent_plan_runs_headless_against_the_base_url_with_no_setup_prompt_and_no_download() -> None:
    # rllm's and Agent Lightning's session path goes into the base URL litellm's openai provider is given
    plan = MiniSweAgentLauncher().plan(task(session_path="/proxy/rollout/{id}"), HOME, BINARY, BASE_PATH)
    assert plan.env == BASE_ENV | {
        "OPENAI_BASE_URL": f"http://127.0.0.1:8123/proxy/rollout/{SID}/v1",
        "OPENAI_API_KEY": SID,
        "MSWEA_CONFIGURED": "true",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    assert plan.argv == [BINARY, "-y", "--exit-immediately", "-m", "openai/qwen3-8b", "-t", "fix the failing test"]
    assert plan.files == {}


@pytest.mark.parametrize("name", sorted(LAUNCHERS))
def test_the_session_token_stays_off_the_command_line_and_out_of_reprs(name: str) -> None:
    plan = LAUNCHERS[name].plan(task(), HOME, BINARY, BASE_PATH)
    assert SID in plan.env.values() or any(SID in text for text in plan.files.values())
    assert not any(SID in arg for arg in plan.argv)
    assert SID not in repr(plan)
    assert set(plan.redacted_env()) == set(plan.env)
    assert plan.env["HOME"] == HOME and plan.env["PATH"].startswith("/opt/tools/bin:")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"session_id": "has space"}, "session id"),
        ({"session_id": ""}, "session id"),
        ({"base_url": "127.0.0.1:8000"}, "base_url"),
        ({"task": "   "}, "task text is empty"),
        ({"task": "--help"}, "must not start with '-'"),
        ({"model": ""}, "model name is empty"),
        ({"timeout_s": 0}, "timeout_s"),
    ],
)
def test_bad_task_input_is_rejected_clearly(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        task(**overrides)


class RecordingSandbox(Sandbox):
    """Records what a launcher asks of its sandbox; answers every command with a canned result."""

    kind = "recording"

    def __init__(self, result: CommandResult) -> None:
        self.home, self.workdir, self.base_path = HOME, "/sandbox/work", BASE_PATH
        self.result = result
        self.written: dict[str, str | bytes] = {}
        self.runs: list[tuple[list[str], dict[str, str], float]] = []
        self.installed: list[AgentPin] = []

    def write_file(self, path: str, content: str | bytes) -> str:
        self.written[path] = content
        return f"{HOME}/{path}"

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: str | None = None
    ) -> CommandResult:
        self.runs.append((list(argv), dict(env), timeout_s))
        return self.result

    def install_agent(self, pin: AgentPin) -> str:
        self.installed.append(pin)
        return BINARY

    def close(self) -> None:
        pass


def test_launch_installs_writes_config_runs_once_and_reports_tails(caplog: pytest.LogCaptureFixture) -> None:
    long_out = "x" * (TAIL_CHARS + 100) + "END"
    sandbox = RecordingSandbox(CommandResult(3, long_out, "boom", False, 1.25))
    launcher = CodexLauncher()
    with caplog.at_level(logging.DEBUG, logger="tito_rl.recorder"):
        run = launcher.launch(sandbox, task(timeout_s=42))
    assert sandbox.installed == [launcher.pin]
    expected = launcher.plan(task(), HOME, BINARY, BASE_PATH)
    assert sandbox.written == expected.files
    assert sandbox.runs == [(expected.argv, expected.env, 42)]
    assert (run.session_id, run.agent, run.version) == (SID, "codex", "0.169.0")
    assert (run.exit_code, run.timed_out, run.duration_s, run.ok) == (3, False, 1.25, False)
    assert len(run.stdout_tail) == TAIL_CHARS and run.stdout_tail.endswith("END")
    assert run.stderr_tail == "boom"
    assert run.to_dict()["agent"] == "codex"
    assert "launching codex 0.169.0" in caplog.text
    assert SID not in caplog.text


def test_launch_with_a_given_binary_skips_the_install() -> None:
    sandbox = RecordingSandbox(CommandResult(None, "", "", True, 9.0))
    run = ClaudeCodeLauncher().launch(sandbox, task(), binary="/custom/claude")
    assert sandbox.installed == []
    assert sandbox.runs[0][0][0] == "/custom/claude"
    assert sandbox.runs[0][1]["PATH"] == f"/custom:{BASE_PATH}"
    assert run.timed_out and not run.ok and run.exit_code is None
