"""Every pinned client's tools are reachable from a scenario's generic roles (fake_engine/policies/prompt_tools.py).

The tool lists (names, properties, required) are copied from the real CLIs' captured requests
(tests/captures: claude_baseline, codex_baseline, qwen, opencode, gemini); the issue's bug was a scenario's
`shell` call that opencode's `bash` tool never received, ending its tool loop after one turn.
"""

from __future__ import annotations

import json

import pytest

from tests.fake_engine_helpers import prompt_ids, tokenizer
from tests.test_fake_engine_scripted import parsers, request
from tito_rl.fake_engine.policies.prompt_tools import (
    TOOL_ALIASES,
    OfferedTool,
    offered_tools,
    resolve_call,
    role_of,
    with_workdir,
    workdir_of,
)
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.fake_engine.policy import PolicyError

# client -> tool -> (properties, required), as captured.
CLIENT_TOOLS: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    "claude-code": {
        "Bash": (("command", "timeout", "description", "run_in_background"), ("command",)),
        "Read": (("file_path", "offset", "limit", "pages"), ("file_path",)),
        "Write": (("file_path", "content"), ("file_path", "content")),
        "Edit": (("file_path", "old_string", "new_string", "replace_all"), ("file_path", "old_string", "new_string")),
        "Agent": (("description", "prompt", "subagent_type", "model"), ("description", "prompt")),
    },
    "codex": {
        "exec_command": (("cmd", "justification", "shell", "tty", "workdir", "yield_time_ms"), ("cmd",)),
        "write_stdin": (("chars", "session_id"), ("session_id",)),
    },
    "qwen-code": {
        "run_shell_command": (("command", "is_background", "timeout", "description", "directory"), ("command",)),
        "read_file": (("file_path", "offset", "limit", "pages"), ("file_path",)),
        "write_file": (("file_path", "content", "record_as_artifact"), ("file_path", "content")),
        "edit": (("file_path", "old_string", "new_string", "replace_all"), ("file_path", "old_string", "new_string")),
        "glob": (("pattern", "path"), ("pattern",)),
        "grep_search": (("pattern", "glob", "path", "limit"), ("pattern",)),
        "agent": (("description", "prompt", "subagent_type"), ("description", "prompt")),
    },
    "opencode": {
        "bash": (("command", "timeout", "workdir"), ("command",)),
        "edit": (("filePath", "oldString", "newString", "replaceAll"), ("filePath", "oldString", "newString")),
        "glob": (("pattern", "path"), ("pattern",)),
        "grep": (("pattern", "path", "include"), ("pattern",)),
        "read": (("filePath", "offset", "limit"), ("filePath",)),
        "task": (
            ("description", "prompt", "subagent_type", "task_id", "command"),
            ("description", "prompt", "subagent_type"),
        ),
        "todowrite": (("todos",), ("todos",)),
        "webfetch": (("url", "format", "timeout"), ("url",)),
        "write": (("content", "filePath"), ("content", "filePath")),
    },
    "gemini-cli": {
        "list_directory": (("dir_path", "ignore"), ("dir_path",)),
        "read_file": (("file_path", "start_line", "end_line"), ("file_path",)),
        "grep_search": (("pattern", "dir_path", "include_pattern"), ("pattern",)),
        "glob": (("pattern", "dir_path", "case_sensitive"), ("pattern",)),
        "replace": (
            ("file_path", "instruction", "old_string", "new_string", "allow_multiple"),
            ("file_path", "instruction", "old_string", "new_string"),
        ),
        "write_file": (("file_path", "content"), ("file_path", "content")),
        "web_fetch": (("prompt",), ("prompt",)),
        "run_shell_command": (("command", "description", "dir_path", "is_background"), ("command",)),
        "write_todos": (("todos",), ("todos",)),
        "invoke_agent": (("agent_name", "prompt"), ("agent_name", "prompt")),
    },
}
# What a scenario writes per role (Claude Code's argument names).
ROLE_CALLS: dict[str, dict[str, object]] = {
    "shell": {"command": "ls"},
    "read": {"file_path": "notes.txt"},
    "write": {"file_path": "notes.txt", "content": "a\n"},
    "edit": {"file_path": "notes.txt", "old_string": "a", "new_string": "b", "instruction": "swap"},
    "glob": {"pattern": "*.txt", "path": "."},
    "grep": {"pattern": "a", "path": "."},
    "list": {"path": "."},
    "fetch": {"url": "http://x", "prompt": "read it"},
    "todo": {"todos": []},
    "agent": {"description": "d", "prompt": "p", "subagent_type": "general"},
}


def offered(client: str) -> list[OfferedTool]:
    return [OfferedTool(name, props) for name, (props, _) in CLIENT_TOOLS[client].items()]


@pytest.mark.parametrize("client", sorted(CLIENT_TOOLS))
def test_every_client_tool_is_reachable_by_a_role_with_its_required_arguments(client):
    reached = set()
    for role, args in ROLE_CALLS.items():
        name, mapped = resolve_call(role, args, offered(client))
        if name == role and name not in CLIENT_TOOLS[client]:
            continue  # this client has no tool for the role
        props, required = CLIENT_TOOLS[client][name]
        assert set(required) <= set(mapped), (client, role, name, mapped)
        assert {k: v for k, v in mapped.items() if k in props} or not props
        reached.add(name)
    unreachable = set(CLIENT_TOOLS[client]) - reached - {"write_stdin"}  # no role: it feeds a running command
    assert not unreachable, f"{client}: no role reaches {sorted(unreachable)}"


def test_opencode_gets_its_own_names_and_camel_case_arguments():
    tools = offered("opencode")
    assert resolve_call("shell", {"command": "ls"}, tools) == ("bash", {"command": "ls"})
    assert resolve_call("edit", {"file_path": "a", "old_string": "x", "new_string": "y"}, tools) == (
        "edit",
        {"filePath": "a", "oldString": "x", "newString": "y"},
    )
    assert resolve_call("Read", {"file_path": "a"}, tools) == ("read", {"filePath": "a"})  # Claude Code's name
    assert resolve_call("grep", {"pattern": "x", "include": "*.py"}, tools) == (
        "grep",
        {"pattern": "x", "include": "*.py"},
    )


def test_codex_and_gemini_argument_renames_and_unknown_names_pass_through():
    assert resolve_call("shell", {"command": "ls"}, offered("codex")) == ("exec_command", {"cmd": "ls"})
    assert resolve_call("glob", {"pattern": "*", "path": "src"}, offered("gemini-cli")) == (
        "glob",
        {"pattern": "*", "dir_path": "src"},
    )
    assert resolve_call("grep", {"pattern": "x"}, offered("codex")) == ("grep", {"pattern": "x"})  # none offered
    assert resolve_call("frobnicate", {"a": 1}, offered("opencode")) == ("frobnicate", {"a": 1})
    assert resolve_call("Bash", {"command": "ls"}, offered("claude-code")) == ("Bash", {"command": "ls"})
    assert resolve_call("shell", {"command": "ls"}, []) == ("shell", {"command": "ls"})  # a side request
    assert role_of("RUN_SHELL_COMMAND") == "shell" and role_of("nothing") is None
    assert all(role_of(role) == role for role in TOOL_ALIASES)


def _spec(name: str, props: tuple[str, ...], required: tuple[str, ...]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": name,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string"} for p in props},
                "required": list(required),
            },
        },
    }


@pytest.mark.parametrize(
    "role,name,args",
    [
        ("shell", "bash", {"command": "ls"}),
        ("write", "write", {"filePath": "n.txt", "content": "a"}),
        ("edit", "edit", {"filePath": "n.txt", "oldString": "a", "newString": "b"}),
    ],
)
def test_scripted_engine_calls_opencodes_tools_through_the_real_template(role, name, args):
    """The `<tools>` block the Qwen3 template renders from opencode's tools is what the engine reads."""
    specs = [_spec(n, p, r) for n, (p, r) in CLIENT_TOOLS["opencode"].items()]
    generic = {
        "shell": {"command": "ls"},
        "write": {"file_path": "n.txt", "content": "a"},
        "edit": {"file_path": "n.txt", "old_string": "a", "new_string": "b"},
    }[role]
    scenario = parse_scenario({"turns": [{"text": "ok", "tool_calls": [{"name": role, "arguments": generic}]}]})
    ids = prompt_ids(
        [{"role": "system", "content": "You are opencode."}, {"role": "user", "content": '"list files"'}], tools=specs
    )
    assert [t.name for t in offered_tools(tokenizer().decode(ids))] == list(CLIENT_TOOLS["opencode"])
    gen = ScriptedPolicy(scenario, tokenizer()).generate(request(ids))
    text = tokenizer().decode(gen.output_ids[:-1], skip_special_tokens=False)
    _, _, calls = parsers()(text, specs)
    assert calls == [(name, args)]
    assert json.dumps(args) in text  # the engine's spacing: the client echoes it compactly


# How the pinned CLIs name their working directory, copied from the captured requests.
WORKDIR_SNIPPETS = {
    "claude-code": "environment: \n - Primary working directory: /sandbox/work_baseline\n - Is a git repo",
    "codex": "<environment_context>\n  <cwd>/sandbox/cwork_baseline</cwd>\n  <shell>bash</shell>",
    "qwen-code": "My operating system is: linux\nI'm currently working in the directory: /tmp/sid-1/work\nHere is",
    "opencode": "<env>\n  Working directory: /sandbox/owork_opencode\n  Workspace root folder: /sandbox",
    "gemini-cli": "temporary directory is: /sandbox/ohome/.gemini/x\n- **Workspace Directories:**\n"
    "  - /sandbox/owork_gemini\n",
}


@pytest.mark.parametrize("client", sorted(WORKDIR_SNIPPETS))
def test_workdir_is_read_from_each_clients_prompt(client):
    found = workdir_of(
        "You are an agent. All commands run in the current working directory by default.\n" + WORKDIR_SNIPPETS[client]
    )
    assert (
        found is not None
        and found.startswith("/")
        and found.rsplit("/", 1)[1] in ("work_baseline", "cwork_baseline", "work", "owork_opencode", "owork_gemini")
    )


def test_with_workdir_replaces_in_nested_strings_and_refuses_without_a_workdir():
    args = {"file_path": "{workdir}/a.txt", "n": 3, "todos": [{"path": "{workdir}"}], "plain": "x"}
    assert with_workdir(args, "/w") == {"file_path": "/w/a.txt", "n": 3, "todos": [{"path": "/w"}], "plain": "x"}
    assert with_workdir({"command": "ls"}, None) == {"command": "ls"}
    with pytest.raises(ValueError, match="names no working directory"):
        with_workdir({"file_path": "{workdir}/a.txt"}, None)


def test_scripted_engine_fills_the_workdir_of_a_qwen_prompt():
    specs = [_spec(n, p, r) for n, (p, r) in CLIENT_TOOLS["qwen-code"].items()]
    scenario = parse_scenario(
        {"turns": [{"tool_calls": [{"name": "read", "arguments": {"file_path": "{workdir}/notes.txt"}}]}]}
    )
    ids = prompt_ids(
        [
            {"role": "system", "content": "You are Qwen Code."},
            {"role": "user", "content": WORKDIR_SNIPPETS["qwen-code"]},
        ],
        tools=specs,
    )
    gen = ScriptedPolicy(scenario, tokenizer()).generate(request(ids))
    _, _, calls = parsers()(tokenizer().decode(gen.output_ids[:-1], skip_special_tokens=False), specs)
    assert calls == [("read_file", {"file_path": "/tmp/sid-1/work/notes.txt"})]
    no_dir = prompt_ids([{"role": "user", "content": "hi"}], tools=specs)
    with pytest.raises(PolicyError, match="names no working directory"):
        ScriptedPolicy(scenario, tokenizer()).generate(request(no_dir))
