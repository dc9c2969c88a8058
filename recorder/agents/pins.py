"""The pinned agent CLI versions: the one place to bump them.

Request shapes change between CLI versions (claude-code 2.1.197 sends 24 tools, 2.1.330 sends 12), so a
recording is only reproducible against the exact version it was made with. Most CLIs come from npm; a Python
CLI comes from PyPI into a virtual environment of its own (`recorder/agents/install.py`), with the libraries
that shape its requests pinned beside it (`with_pins`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class AgentPin:
    name: str  # the registry name used by `tito record --agent`
    package: str  # the package's name in its registry
    version: str
    binary: str  # the executable the package installs (node_modules/.bin or the environment's bin/)
    registry: Literal["npm", "pypi"] = "npm"
    # PyPI only: libraries pinned with the CLI because they build its requests (litellm, openai)
    with_pins: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        return f"{self.package}=={self.version}" if self.registry == "pypi" else f"{self.package}@{self.version}"


CLAUDE_CODE = AgentPin("claude-code", "@anthropic-ai/claude-code", "2.1.330", "claude")
CODEX = AgentPin("codex", "@openai/codex", "0.169.0", "codex")
QWEN_CODE = AgentPin("qwen-code", "@qwen-code/qwen-code", "0.24.4", "qwen")
OPENCODE = AgentPin("opencode", "opencode-ai", "1.18.33", "opencode")
GEMINI_CLI = AgentPin("gemini-cli", "@google/gemini-cli", "0.61.0", "gemini")
# OpenAI chat completions, unstreamed (litellm's `completion`): the CLI for gateways that refuse streaming
MINI_SWE_AGENT = AgentPin(
    "mini-swe-agent", "mini-swe-agent", "2.4.6", "mini", "pypi", ("litellm==1.110.2", "openai==3.57.0")
)

PINS: dict[str, AgentPin] = {
    pin.name: pin for pin in (CLAUDE_CODE, CODEX, QWEN_CODE, OPENCODE, GEMINI_CLI, MINI_SWE_AGENT)
}


def pin_for(name: str) -> AgentPin:
    try:
        return PINS[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known agents: {', '.join(sorted(PINS))}") from None
