"""The tools a prompt offers, read back from the `<tools>` block the Qwen3 chat template renders.

Scenarios name tools by role ("shell"); each agent CLI calls its shell tool something else (`Bash` for
Claude Code, `exec_command` with `cmd` for Codex), so the engine picks the name and argument the prompt
actually offers, like a real model would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# Aliases a scenario may use, mapped to known per-CLI tool names (first offered wins).
TOOL_ALIASES: dict[str, tuple[str, ...]] = {
    "shell": ("Bash", "exec_command", "shell", "run_shell_command", "bash", "local_shell"),
    "read": ("Read", "read_file", "read"),
    "write": ("Write", "write_file", "write"),
    "edit": ("Edit", "apply_patch", "replace", "edit"),
}
# Argument renames per tool, from the scenario's generic names.
ARGUMENT_ALIASES: dict[str, dict[str, str]] = {
    "exec_command": {"command": "cmd"},
}


@dataclass(frozen=True)
class OfferedTool:
    name: str
    properties: tuple[str, ...] = field(default_factory=tuple)


def offered_tools(prompt_text: str) -> list[OfferedTool]:
    start = prompt_text.find("<tools>\n")
    end = prompt_text.find("\n</tools>", start)
    if start < 0 or end < 0:
        return []
    tools = []
    for line in prompt_text[start + len("<tools>\n"):end].splitlines():
        try:
            spec = json.loads(line)
        except json.JSONDecodeError:
            continue
        fn = spec.get("function", spec) if isinstance(spec, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            props = (fn.get("parameters") or {}).get("properties") or {}
            tools.append(OfferedTool(fn["name"], tuple(props) if isinstance(props, dict) else ()))
    return tools


def resolve_call(name: str, arguments: dict[str, Any], offered: list[OfferedTool]) -> tuple[str, dict[str, Any]]:
    """Map a scenario's tool name and arguments onto what the prompt offers (unchanged if nothing fits)."""
    by_name = {t.name: t for t in offered}
    if name in by_name or not offered:
        return name, arguments
    for candidate in TOOL_ALIASES.get(name, ()):
        if candidate in by_name:
            renames = ARGUMENT_ALIASES.get(candidate, {})
            props = set(by_name[candidate].properties)
            mapped = {}
            for key, value in arguments.items():
                new_key = renames.get(key, key)
                mapped[new_key if (not props or new_key in props) else key] = value
            return candidate, mapped
    return name, arguments
