"""The tools a prompt offers, read back from the `<tools>` block the Qwen3 chat template renders.

Scenarios name tools by role (`shell`, `read`, `write`, `edit`, `glob`, `grep`, `list`, `fetch`, `todo`,
`agent`) with Claude Code's argument names (`command`, `file_path`, `content`, `old_string`, `new_string`,
`pattern`, `path`); each agent CLI calls its tools something else (`Bash` for Claude Code, `exec_command`
with `cmd` for Codex, `run_shell_command` for Qwen Code and Gemini CLI, `bash` for opencode, whose file
tools take `filePath`/`oldString`), so the engine picks the name and arguments the prompt actually offers,
like a real model would. A scenario may also name one client's tool (`Bash`) and play on another client.
`{workdir}` in an argument becomes the working directory the prompt names (Qwen Code's and Claude Code's file
tools want absolute paths, and the sandbox's path is only known once the CLI runs).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Roles a scenario may use, mapped to the pinned CLIs' tool names (first offered wins). Seen in
# tests/captures: Claude Code 2.1.330, Codex 0.169.0, Qwen Code 0.24.4, opencode 1.18.33, Gemini CLI 0.61.0.
TOOL_ALIASES: dict[str, tuple[str, ...]] = {
    "shell": ("Bash", "exec_command", "shell", "run_shell_command", "bash", "local_shell"),
    "read": ("Read", "read_file", "read"),
    "write": ("Write", "write_file", "write"),
    "edit": ("Edit", "apply_patch", "replace", "edit"),
    "glob": ("Glob", "glob"),
    "grep": ("Grep", "grep_search", "grep", "search_file_content"),
    "list": ("LS", "list_directory", "list", "ls"),
    "fetch": ("WebFetch", "web_fetch", "webfetch"),
    "todo": ("TodoWrite", "write_todos", "todowrite", "todo_write"),
    "agent": ("Agent", "Task", "agent", "task", "invoke_agent"),
}
# Argument renames per tool, from the scenario's generic names (before the generic synonyms below).
ARGUMENT_ALIASES: dict[str, dict[str, str]] = {
    "exec_command": {"command": "cmd"},
}
# A generic argument name and the spellings tools use for it, tried in order when the tool lacks the name.
ARGUMENT_SYNONYMS: dict[str, tuple[str, ...]] = {
    "command": ("cmd",),
    "file_path": ("filePath", "path", "absolute_path"),
    "path": ("dir_path", "directory", "filePath", "file_path"),
    "old_string": ("oldString",),
    "new_string": ("newString",),
    "replace_all": ("replaceAll", "allow_multiple"),
    "include": ("include_pattern", "glob"),
    "subagent_type": ("agent_name",),
}


# How each pinned CLI states its working directory in the prompt (system prompt or first user message).
WORKDIR_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"Primary working directory: (/[^\s<>\"]*)",  # Claude Code
        r"<cwd>(/[^<]+)</cwd>",  # Codex
        r"I'm currently working in the directory: (/[^\s<>\"]*)",  # Qwen Code
        r"\bWorking directory: (/[^\s<>\"]*)",  # opencode
        r"Workspace Directories:\*\*\n\s*- (/[^\s<>\"]*)",  # Gemini CLI
    )
)
WORKDIR = "{workdir}"


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
    for line in prompt_text[start + len("<tools>\n") : end].splitlines():
        try:
            spec = json.loads(line)
        except json.JSONDecodeError:
            continue
        fn = spec.get("function", spec) if isinstance(spec, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            props = (fn.get("parameters") or {}).get("properties") or {}
            tools.append(OfferedTool(fn["name"], tuple(props) if isinstance(props, dict) else ()))
    return tools


def role_of(name: str) -> str | None:
    """The role a scenario's tool name stands for: a role itself, or any client's name for one."""
    if name in TOOL_ALIASES:
        return name
    lowered = name.lower()
    for role, names in TOOL_ALIASES.items():
        if lowered in (n.lower() for n in names):
            return role
    return None


def _argument_name(key: str, tool: OfferedTool) -> str:
    props = tool.properties
    renamed = ARGUMENT_ALIASES.get(tool.name, {}).get(key, key)
    if not props or renamed in props:
        return renamed
    for synonym in ARGUMENT_SYNONYMS.get(key, ()):
        if synonym in props:
            return synonym
    return key


def resolve_call(name: str, arguments: dict[str, Any], offered: list[OfferedTool]) -> tuple[str, dict[str, Any]]:
    """Map a scenario's tool name and arguments onto what the prompt offers (unchanged if nothing fits)."""
    by_name = {t.name: t for t in offered}
    role = role_of(name)
    # The name itself first (a role may be a client's own name: opencode's `edit`, `glob`), then the role's.
    for candidate in (name, *(TOOL_ALIASES.get(role, ()) if role else ())):
        if candidate in by_name:
            tool = by_name[candidate]
            return candidate, {_argument_name(key, tool): value for key, value in arguments.items()}
    return name, arguments


def workdir_of(prompt_text: str) -> str | None:
    """The working directory the prompt names, by the first pattern that finds one."""
    for pattern in WORKDIR_PATTERNS:
        found = pattern.search(prompt_text)
        if found:
            return found.group(1).rstrip("/") or "/"
    return None


def with_workdir(arguments: Any, workdir: str | None) -> Any:
    """Arguments with `{workdir}` replaced in every string; ValueError if one needs it and the prompt has none."""
    if isinstance(arguments, str):
        if WORKDIR not in arguments:
            return arguments
        if workdir is None:
            raise ValueError(f"{WORKDIR} in {arguments!r}, but the prompt names no working directory")
        return arguments.replace(WORKDIR, workdir)
    if isinstance(arguments, dict):
        return {k: with_workdir(v, workdir) for k, v in arguments.items()}
    if isinstance(arguments, list):
        return [with_workdir(v, workdir) for v in arguments]
    return arguments
