"""The pinned agent CLI versions: the one place to bump them.

Request shapes change between CLI versions (claude-code 2.1.197 sends 24 tools, 2.1.330 sends 12), so a
recording is only reproducible against the exact version it was made with.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AgentPin:
    name: str  # the registry name used by `tito record --agent`
    npm_package: str
    version: str
    binary: str  # the executable the package installs under node_modules/.bin

    @property
    def spec(self) -> str:
        return f"{self.npm_package}@{self.version}"


CLAUDE_CODE = AgentPin("claude-code", "@anthropic-ai/claude-code", "2.1.330", "claude")
CODEX = AgentPin("codex", "@openai/codex", "0.169.0", "codex")
QWEN_CODE = AgentPin("qwen-code", "@qwen-code/qwen-code", "0.24.4", "qwen")
OPENCODE = AgentPin("opencode", "opencode-ai", "1.18.33", "opencode")
GEMINI_CLI = AgentPin("gemini-cli", "@google/gemini-cli", "0.61.0", "gemini")

PINS: dict[str, AgentPin] = {pin.name: pin for pin in (CLAUDE_CODE, CODEX, QWEN_CODE, OPENCODE, GEMINI_CLI)}


def pin_for(name: str) -> AgentPin:
    try:
        return PINS[name]
    except KeyError:
        raise ValueError(f"unknown agent {name!r}; known agents: {', '.join(sorted(PINS))}") from None
