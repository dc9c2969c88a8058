"""One launcher per pinned agent CLI: config files, environment and command line for a recorded session.

Every launcher follows the measured recipe in the shared agent-clients note. The session id is the API
key / auth token, so the adapter app reads it back from `Authorization: Bearer <sid>`; it never goes on the
command line (visible to every process) and is never logged.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

from tito_rl.recorder.agents.pins import (
    CLAUDE_CODE,
    CODEX,
    GEMINI_CLI,
    MINI_SWE_AGENT,
    OPENCODE,
    QWEN_CODE,
    AgentPin,
)
from tito_rl.recorder.agents.sandbox import Sandbox

log = logging.getLogger(__name__)

TAIL_CHARS = 4000
# Same alphabet as the adapter's session-id check, so a launched session is always routable.
_SESSION_ID = re.compile(r"^[A-Za-z0-9._:@+=-]{1,200}$")
_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)


@dataclass(frozen=True)
class AgentTask:
    base_url: str  # root of the adapter app (or recording proxy), e.g. http://127.0.0.1:8000, no /v1
    session_id: str
    task: str
    model: str
    timeout_s: float = 600.0
    # The target's session path (`TargetInfo.session_path`, rllm's `/sessions/{id}`): for a gateway that takes
    # its session from the URL, the CLI's base URL gains it, `{id}` replaced by the session id.
    session_path: str | None = None

    def __post_init__(self) -> None:
        if not re.match(r"^https?://[^/\s]+(/\S*)?$", self.base_url):
            raise ValueError(f"base_url must be an http(s) URL, got {self.base_url!r}")
        if self.session_path is not None and not re.match(r"^(/[^/?#\s]+)+$", self.session_path):
            raise ValueError(f"session_path must be a path like /sessions/{{id}}, got {self.session_path!r}")
        if not _SESSION_ID.match(self.session_id):
            raise ValueError(f"session id {self.session_id!r} must match {_SESSION_ID.pattern}")
        if not self.task.strip():
            raise ValueError("task text is empty")
        if self.task.startswith("-"):
            raise ValueError("task text must not start with '-': the CLIs would read it as an option")
        if not self.model.strip():
            raise ValueError("model name is empty")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {self.timeout_s!r}")

    @property
    def root_url(self) -> str:
        """What the CLI's base URL is built on: the proxy's root, plus the session's path where the target wants it."""
        path = (self.session_path or "").replace("{id}", self.session_id)
        return self.base_url.rstrip("/") + path


@dataclass(frozen=True)
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = field(repr=False)
    files: dict[str, str] = field(repr=False)  # path relative to HOME -> content

    def redacted_env(self) -> dict[str, str]:
        return {k: ("<redacted>" if _SECRET_NAME.search(k) else v) for k, v in self.env.items()}

    def __repr__(self) -> str:
        return f"LaunchPlan(argv={self.argv!r}, env={self.redacted_env()!r}, files={sorted(self.files)!r})"


@dataclass(frozen=True)
class AgentRun:
    session_id: str
    agent: str
    version: str
    exit_code: int | None
    timed_out: bool
    stdout_tail: str
    stderr_tail: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AgentLauncher(ABC):
    pin: AgentPin

    @abstractmethod
    def plan(self, task: AgentTask, home: str, binary: str, base_path: str) -> LaunchPlan:
        """Pure: what to write and run, for a sandbox whose HOME is `home`."""

    def launch(self, sandbox: Sandbox, task: AgentTask, binary: str | None = None) -> AgentRun:
        if binary is None:
            binary = sandbox.install_agent(self.pin)
        plan = self.plan(task, sandbox.home, binary, sandbox.base_path)
        for path, content in plan.files.items():
            sandbox.write_file(path, content)
        log.info("launching %s %s in %s sandbox: %r", self.pin.name, self.pin.version, sandbox.kind, plan)
        result = sandbox.run(plan.argv, plan.env, timeout_s=task.timeout_s)
        return AgentRun(
            task.session_id,
            self.pin.name,
            self.pin.version,
            result.exit_code,
            result.timed_out,
            result.stdout[-TAIL_CHARS:],
            result.stderr[-TAIL_CHARS:],
            result.duration_s,
        )

    def _base_env(self, home: str, binary: str, base_path: str) -> dict[str, str]:
        path = posixpath.dirname(binary)
        return {
            "PATH": f"{path}:{base_path}" if path else base_path,
            "HOME": home,
            "TERM": "dumb",
            "LANG": "C.UTF-8",
        }


class ClaudeCodeLauncher(AgentLauncher):
    """Anthropic Messages API; ANTHROPIC_AUTH_TOKEN arrives as `Authorization: Bearer`."""

    pin = CLAUDE_CODE

    def plan(self, task: AgentTask, home: str, binary: str, base_path: str) -> LaunchPlan:
        env = self._base_env(home, binary, base_path) | {
            "ANTHROPIC_BASE_URL": task.root_url,
            "ANTHROPIC_AUTH_TOKEN": task.session_id,
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
            "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "IS_SANDBOX": "1",  # required when running as root with --dangerously-skip-permissions
        }
        argv = [
            binary,
            "-p",
            task.task,
            "--output-format",
            "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
            "--model",
            task.model,
        ]
        return LaunchPlan(argv, env, {})


class CodexLauncher(AgentLauncher):
    """Responses API over HTTP via a custom provider; the built-in one would switch to WebSockets."""

    pin = CODEX
    KEY_ENV = "LOCAL_API_KEY"

    def plan(self, task: AgentTask, home: str, binary: str, base_path: str) -> LaunchPlan:
        config = "\n".join(
            [
                f"model = {_toml_str(task.model)}",
                'model_provider = "local"',
                'approval_policy = "never"',
                'sandbox_mode = "danger-full-access"',
                "check_for_update_on_startup = false",
                "",
                "[analytics]",
                "enabled = false",
                "",
                "[model_providers.local]",
                'name = "local"',
                f"base_url = {_toml_str(task.root_url + '/v1')}",  # the client appends /responses
                'wire_api = "responses"',
                f"env_key = {_toml_str(self.KEY_ENV)}",  # sent as Authorization: Bearer <value>
                "",
            ]
        )
        env = self._base_env(home, binary, base_path) | {"CODEX_HOME": home, self.KEY_ENV: task.session_id}
        argv = [binary, "exec", "--json", "--skip-git-repo-check", task.task]
        return LaunchPlan(argv, env, {"config.toml": config})


class QwenCodeLauncher(AgentLauncher):
    """OpenAI chat completions; settings select the OpenAI auth type so no login is attempted."""

    pin = QWEN_CODE

    def plan(self, task: AgentTask, home: str, binary: str, base_path: str) -> LaunchPlan:
        settings = {"security": {"auth": {"selectedType": "openai"}, "folderTrust": {"enabled": False}}}
        env = self._base_env(home, binary, base_path) | {
            "OPENAI_BASE_URL": task.root_url + "/v1",
            "OPENAI_API_KEY": task.session_id,
            "OPENAI_MODEL": task.model,
        }
        argv = [binary, "--auth-type", "openai", "--yolo", "-m", task.model, "-o", "stream-json", task.task]
        return LaunchPlan(argv, env, {".qwen/settings.json": json.dumps(settings, indent=2) + "\n"})


class OpencodeLauncher(AgentLauncher):
    """OpenAI chat completions through a configured openai-compatible provider."""

    pin = OPENCODE
    PROVIDER = "tito"

    def plan(self, task: AgentTask, home: str, binary: str, base_path: str) -> LaunchPlan:
        config = {
            "provider": {
                self.PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": self.PROVIDER,
                    "options": {"baseURL": task.root_url + "/v1", "apiKey": task.session_id},
                    "models": {task.model: {}},
                }
            },
            "permission": {"*": "allow"},
            "model": f"{self.PROVIDER}/{task.model}",
        }
        env = self._base_env(home, binary, base_path) | {
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        }
        argv = [binary, "run", "--format", "json", "--auto", "-m", f"{self.PROVIDER}/{task.model}", task.task]
        return LaunchPlan(argv, env, {".config/opencode/opencode.json": json.dumps(config, indent=2) + "\n"})


class GeminiCliLauncher(AgentLauncher):
    """Gemini API; GEMINI_API_KEY arrives as `x-goog-api-key`. Settings pick API-key auth (no login) and turn
    off usage statistics and telemetry, which would otherwise call Google."""

    pin = GEMINI_CLI

    def plan(self, task: AgentTask, home: str, binary: str, base_path: str) -> LaunchPlan:
        settings = {
            "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
        }
        env = self._base_env(home, binary, base_path) | {
            "GOOGLE_GEMINI_BASE_URL": task.root_url,  # the client appends /v1beta/models/<model>:<action>
            "GEMINI_API_KEY": task.session_id,
        }
        argv = [binary, "-p", task.task, "--yolo", "-m", task.model, "-o", "stream-json"]
        return LaunchPlan(argv, env, {".gemini/settings.json": json.dumps(settings, indent=2) + "\n"})


class MiniSweAgentLauncher(AgentLauncher):
    """OpenAI chat completions, unstreamed: `mini` (mini-swe-agent, PyPI) calls litellm's `completion` with
    `openai/<model>`, its one `bash` tool and no `stream`, so a gateway that refuses streaming (Agent Lightning)
    can serve it. Headless: `-y` runs every command unconfirmed, `--exit-immediately` exits when the model
    submits (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`); the environment skips its first-run setup prompts,
    keeps litellm from fetching its model price list at import, and lets a model with no price run."""

    pin = MINI_SWE_AGENT

    def plan(self, task: AgentTask, home: str, binary: str, base_path: str) -> LaunchPlan:
        env = self._base_env(home, binary, base_path) | {
            "OPENAI_BASE_URL": task.root_url + "/v1",  # litellm's openai provider appends /chat/completions
            "OPENAI_API_KEY": task.session_id,  # sent as Authorization: Bearer <value>
            "MSWEA_CONFIGURED": "true",  # otherwise the first run asks for a model and keys on the terminal
            "MSWEA_COST_TRACKING": "ignore_errors",  # otherwise a model litellm has no price for aborts the run
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # otherwise litellm downloads its price list at import
        }
        argv = [binary, "-y", "--exit-immediately", "-m", f"openai/{task.model}", "-t", task.task]
        return LaunchPlan(argv, env, {})


def _toml_str(value: str) -> str:
    # JSON string escapes are valid TOML basic-string escapes.
    return json.dumps(value)


LAUNCHERS: dict[str, AgentLauncher] = {
    launcher.pin.name: launcher
    for launcher in (
        ClaudeCodeLauncher(),
        CodexLauncher(),
        QwenCodeLauncher(),
        OpencodeLauncher(),
        GeminiCliLauncher(),
        MiniSweAgentLauncher(),
    )
}


def launcher_for(name: str) -> AgentLauncher:
    try:
        return LAUNCHERS[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known agents: {', '.join(sorted(LAUNCHERS))}") from None
