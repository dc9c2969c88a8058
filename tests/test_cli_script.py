"""A scenario's `client:` section (recorder/agents/cli_script.py): strict parsing, one clear error per mistake, ids that
never depend on anything but the script, and the --agent / --task overrides tito simulate passes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tito_rl.recorder.agents.cli_script import (
    CliRun,
    client_agent,
    load_cli_script,
    parse_cli_script,
    scenario_name,
    session_id,
)
from tito_rl.recorder.agents.stream_cut import StreamCut

ENGINE = {"turns": [{"text": "done"}]}


def write(tmp_path: Path, client: Any = None, name: str = "demo", **top: Any) -> Path:
    data: dict[str, Any] = {"name": name, **ENGINE, **top}
    if client is not None:
        data["client"] = client
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("client", "message"),
    [
        ("claude-code", "client: expected object, got string"),
        ({"agent": "claude-code", "task": "t", "tsk": "x"}, "client: unknown key 'tsk'; allowed: agent, args, "),
        (
            {"agent": "claude", "task": "t"},
            "client.agent: 'claude' is not one of 'claude-code', 'codex', 'gemini-cli', 'mini-swe-agent', 'opencode', "
            "'qwen-code'",
        ),
        ({"agent": "codex"}, "client: missing key 'task' (the task text), or 'runs'"),
        ({"agent": "codex", "task": "   "}, "client: the task text is empty"),
        ({"agent": "codex", "task": "t", "timeout_s": 0}, "client.timeout_s: expected number > 0.0, got 0"),
        ({"agent": "codex", "task": "t", "timeout_s": True}, "client.timeout_s: expected number, got boolean"),
        (
            {"agent": "codex", "task": "t", "record_args": "--reward 1"},
            "client.record_args: expected array, got string",
        ),
        ({"agent": "codex", "task": "t", "args": ["--x", 1]}, "client.args[1]: expected string, got integer"),
        ({"agent": "codex", "task": "t", "kill_after_s": -1}, "client.kill_after_s: expected number > 0.0, got -1"),
        (
            {"agent": "codex", "task": "t", "kill_after_s": "5"},
            "client.kill_after_s: expected number | null, got string",
        ),
        ({"agent": "codex", "task": "t", "sessions": [{"task": "u"}]}, "client: either sessions or ['task'], not both"),
        ({"agent": "codex", "sessions": []}, "client.sessions: expected array of length >= 1"),
        ({"agent": "codex", "sessions": {"task": "t"}}, "client.sessions: expected array | null, got object"),
        (
            {"agent": "codex", "sessions": [{"agent": "vim", "task": "t"}]},
            "client.sessions[0].agent: 'vim' is not one of 'claude-code', ",
        ),
        (
            {"agent": "codex", "sessions": [{"task": "t"}, {"runs": [{"task": "a"}], "task": "b"}]},
            "client.sessions[1]: either runs or ['task'], not both",
        ),
        ({"agent": "codex", "sessions": [{"runs": []}]}, "client.sessions[0].runs: expected array of length >= 1"),
        (
            {"agent": "codex", "sessions": [{"runs": [{"task": "a"}, {"task": "b", "env": {}}]}]},
            "client.sessions[0].runs[1]: unknown key 'env'; allowed: args, kill_after_s, task",
        ),
        (
            {"agent": "codex", "sessions": [{"task": "t", "env": {"BAD-NAME": "1"}}]},
            "client.sessions[0].env: key 'BAD-NAME': expected string matching regex '^[A-Za-z_][A-Za-z0-9_]*$'",
        ),
        (
            {"agent": "codex", "sessions": [{"task": "t", "env": {"FLAG": True}}]},
            "client.sessions[0].env.FLAG: expected integer | number | string, got boolean",
        ),
        (
            {"agent": "codex", "sessions": [{"task": "t", "env": ["A=1"]}]},
            "client.sessions[0].env: expected object, got array",
        ),
        (
            {"agent": "codex", "task": "t", "cut_streams": {"request": 1}},
            "client.cut_streams: expected array, got object",
        ),
        (
            {"agent": "codex", "task": "t", "cut_streams": [{"request": 1}]},
            "client.cut_streams[0]: missing key 'after_events'",
        ),
        (
            {"agent": "codex", "task": "t", "cut_streams": [{"request": 1, "after_events": 0}]},
            "client.cut_streams[0]: a stream cut needs request >= 0 and after_events >= 1",
        ),
        (
            {"agent": "codex", "task": "t", "cut_streams": [{"request": 1, "after": 2}]},
            "client.cut_streams[0]: unknown key 'after'; allowed: after_events, request",
        ),
    ],
)
def test_each_mistake_is_one_clear_error(client: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_cli_script(client, "demo")
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_the_shorthand_is_one_session_of_one_run() -> None:
    script = parse_cli_script(
        {
            "agent": "qwen-code",
            "task": "List.",
            "args": ["--continue"],
            "kill_after_s": 4,
            "env": {"N": 3},
            "record_args": ["--reward", "1"],
            "timeout_s": 60,
        },
        "demo",
    )
    (session,) = script.sessions
    assert session.id == "demo-qwen-code-0000" and session.agent == "qwen-code" and session.env == {"N": "3"}
    assert session.runs == (CliRun("List.", ("--continue",), 4.0),)
    assert script.record_args == ("--reward", "1") and script.timeout_s == 60.0 and script.agents == ["qwen-code"]


def test_cut_streams_belong_to_their_session() -> None:
    script = parse_cli_script(
        {
            "agent": "claude-code",
            "sessions": [{"task": "a", "cut_streams": [{"request": 1, "after_events": 3}]}, {"task": "b"}],
        },
        "demo",
    )
    assert [s.cut_streams for s in script.sessions] == [(StreamCut(1, 3),), ()]


def test_client_agent_is_the_default_of_sessions_that_name_none() -> None:
    """`agent:` beside `sessions:` is the default, not a clash (the module's own example has both)."""
    script = parse_cli_script(
        {
            "agent": "codex",
            "sessions": [{"task": "a"}, {"agent": "opencode", "task": "b"}, {"runs": [{"task": "c"}, {"task": "d"}]}],
        },
        "mix",
    )
    assert [(s.id, s.agent, len(s.runs)) for s in script.sessions] == [
        ("mix-codex-0000", "codex", 1),
        ("mix-opencode-0001", "opencode", 1),
        ("mix-codex-0002", "codex", 2),
    ]
    assert script.agents == ["codex", "opencode"]


def test_ids_depend_only_on_the_script() -> None:
    client = {"agent": "claude-code", "sessions": [{"task": "a"}, {"agent": "gemini-cli", "task": "b"}]}
    first = [s.id for s in parse_cli_script(client, "my scenario/1").sessions]
    assert first == [s.id for s in parse_cli_script(client, "my scenario/1").sessions]
    assert first == ["my-scenario-1-claude-code-0000", "my-scenario-1-gemini-cli-0001"]
    assert session_id("a_b", "codex", 12) == "a-b-codex-0012"


def test_agent_override_runs_every_session() -> None:
    client = {"agent": "claude-code", "sessions": [{"task": "a"}, {"agent": "gemini-cli", "task": "b"}]}
    script = parse_cli_script(client, "demo", agent="opencode")
    assert [s.agent for s in script.sessions] == ["opencode", "opencode"] and script.agent == "opencode"
    assert [s.id for s in script.sessions] == ["demo-opencode-0000", "demo-opencode-0001"]
    with pytest.raises(ValueError, match="client.agent: 'nope' is not one of 'claude-code', "):
        parse_cli_script(client, "demo", agent="nope")


def test_task_replaces_the_scripts_runs(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "agent": "claude-code",
            "timeout_s": 30,
            "record_args": ["--reward", "0.5"],
            "sessions": [
                {"runs": [{"task": "a"}, {"task": "b", "args": ["--continue"]}]},
                {"task": "c", "kill_after_s": 2},
            ],
        },
    )
    script = load_cli_script(path, task="Only this.")
    (session,) = script.sessions
    assert session.runs == (CliRun("Only this."),) and session.agent == "claude-code"
    assert script.timeout_s == 30.0 and script.record_args == ("--reward", "0.5")  # the rest is kept
    as_written = load_cli_script(path)
    assert [len(s.runs) for s in as_written.sessions] == [2, 1]
    assert as_written.sessions[1].runs[0].kill_after_s == 2.0


def test_a_scenario_without_a_cli_client_needs_agent_and_task(tmp_path: Path) -> None:
    bare = write(tmp_path, name="bare")
    scripted = write(tmp_path, {"sessions": [{"id": "x", "steps": []}]}, name="scripted")
    for path in (bare, scripted):
        with pytest.raises(ValueError, match=r"no CLI `client:` section, so --agent and --task are needed"):
            load_cli_script(path)
        with pytest.raises(ValueError, match="--agent and --task are needed"):
            load_cli_script(path, agent="codex")
        script = load_cli_script(path, agent="codex", task="Go.")
        assert [(s.id, s.runs) for s in script.sessions] == [(f"{path.stem}-codex-0000", (CliRun("Go."),))]
    assert client_agent(bare) is None and client_agent(scripted) == "scripted"


def test_scenario_name_is_the_name_key_else_the_file_stem(tmp_path: Path) -> None:
    named = write(
        tmp_path,
        {"agent": "codex", "task": "t"},
        name="file_stem",
    )
    data = yaml.safe_load(named.read_text()) | {"name": "other"}
    assert scenario_name(named) == "file_stem" and scenario_name(named, data) == "other"
    assert client_agent(named) == "codex"


def test_every_committed_cli_scenario_parses() -> None:
    """A typo in a committed scenario fails here, not an hour into `make corpus`."""
    root = Path(__file__).resolve().parent.parent / "cassettes" / "scenarios"
    cli = [p for p in sorted(root.glob("*.yaml")) if client_agent(p) not in (None, "scripted")]
    for path in cli:
        script = load_cli_script(path)
        assert script.sessions, path
        assert len({s.id for s in script.sessions}) == len(script.sessions), path
