"""Scenario files checked by their typed model (`fake_engine/scenario_model.py`, `recorder/scenario_file.py`):
every section's unknown keys and wrong types are one line with their path; `tito fake-engine --script`, `tito
record --scenario` and `tito simulate` say the same thing about the same file; `tito scenario schema` is a
JSON Schema a real validator (and so an editor) accepts every committed scenario with and rejects mistakes by."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.process_helpers import ROOT
from tito_rl.recorder.scenario_file import ScenarioError, check_scenario, scenario_schema

COMMITTED = (
    sorted((ROOT / "cassettes" / "scenarios").glob("*.yaml"))
    + sorted((ROOT / "fake_engine" / "examples").glob("*.yaml"))
    + sorted((ROOT / "cassettes" / "real_vllm" / "scenarios").glob("*.yaml"))
    + sorted((ROOT / "cassettes" / "real_sglang" / "scenarios").glob("*.yaml"))
)
SCRIPTED = {"sessions": [{"id": "s-0", "wire": "chat", "steps": [{"prompt": "hi"}, {"finish": 1}]}]}
CLI = {"agent": "codex", "task": "List the files."}


def write(tmp_path: Path, data: Any, name: str = "mistake") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def turns(n: int, **last: Any) -> list[dict[str, Any]]:
    return [{"text": f"turn {i}"} for i in range(n)] + [{"text": "last", **last}]


# (scenario data, the one line check_scenario gives after "FILE: ")
MISTAKES = [
    # the engine's script
    (
        {"turns": turns(3, tool_calls=[{"name": "shell", "arguments": ["ls"]}])},
        "turns[3].tool_calls[0].arguments: expected object, got array",
    ),
    (
        {"turns": turns(1, tool_calls=[{"name": "shell", "args": {}}])},
        "turns[1].tool_calls[0]: unknown key 'args'; allowed: arguments, name",
    ),
    (
        {"sessions": [{"turns": ["a"]}, {"match": {"prompt_contain": "x"}, "turns": ["b"]}]},
        "sessions[1].match: unknown key 'prompt_contain'; allowed: last_user_contains, prompt_contains, routing_key",
    ),
    ({"turns": turns(0, faults={"latency_ms": "slow"})}, "turns[0].faults.latency_ms: expected number, got string"),
    ({"turns": turns(0, ids=[1, 2, -3])}, "turns[0].ids[2]: expected integer >= 0, got -3"),
    ({"turns": ["a"], "after_last": "loop"}, "after_last: 'loop' is not one of 'repeat', 'error'"),
    ({"turns": ["a"], "sesions": []}, "scenario: unknown key 'sesions'; allowed: after_last, client, description, "),
    (["turns"], "scenario: expected object, got array"),
    # the scripted client's client: section
    (
        {"turns": ["a"], "client": {"sessions": [{**SCRIPTED["sessions"][0], "steps": [{"prompt": 1}]}]}},
        "client.sessions[0].steps[0].prompt: expected string | null, got integer",
    ),
    (
        {"turns": ["a"], "client": {"sessions": [{**SCRIPTED["sessions"][0], "subagents": {"scout": {"tool": []}}}]}},
        "client.sessions[0].subagents.scout: unknown key 'tool'; allowed: prompt, results, system, tools",
    ),
    (
        {"turns": ["a"], "client": {"sessions": [{**SCRIPTED["sessions"][0], "disconnects": [{"request": 1}]}]}},
        "client.sessions[0].disconnects[0]: missing key 'after_ms'",
    ),
    # a real CLI's client: section
    (
        {"turns": ["a"], "client": {**CLI, "sessions": None, "task": None, "runs": [{"task": "a", "args": "-c"}]}},
        "client.runs[0].args: expected array, got string",
    ),
    (
        {"turns": ["a"], "client": {"agent": "codex", "sessions": [{"task": "a"}, {"task": "b", "kill_after_s": 0}]}},
        "client.sessions[1].kill_after_s: expected number > 0.0, got 0",
    ),
    # record_args: tito record's own flags
    (
        {"turns": ["a"], "client": {**CLI, "record_args": ["--rewrd", "1"]}},
        "client.record_args: not tito record flags: --rewrd 1",
    ),
    (
        {"turns": ["a"], "client": {**SCRIPTED, "record_args": ["--reward", "high"]}},
        "client.record_args: argument --reward: invalid float value: 'high'",
    ),
]


@pytest.mark.parametrize(("data", "message"), MISTAKES, ids=[m.split(":")[0] for _, m in MISTAKES])
def test_each_mistake_is_one_line_with_its_path(tmp_path: Path, data: Any, message: str) -> None:
    path = write(tmp_path, data)
    with pytest.raises(ScenarioError) as info:
        check_scenario(path)
    text = str(info.value)
    assert text.startswith(f"{path}: {message}"), text
    assert "\n" not in text


def test_a_file_that_is_not_yaml_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("turns:\n  - text: [unclosed\n")
    with pytest.raises(ScenarioError, match=rf"^{path}: not valid YAML: while parsing a flow sequence .*line 2"):
        check_scenario(path)


def test_every_committed_scenario_fits_the_model_and_the_schema() -> None:
    schema = scenario_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    clients = set()
    for path in COMMITTED:
        checked = check_scenario(path)
        clients.add(type(checked.client).__name__)
        errors = [
            f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(yaml.safe_load(path.read_text()))
        ]
        assert not errors, (path, errors)
    assert clients == {"ClientScript", "CliClient", "NoneType"}  # all three kinds of file are covered


def test_the_schema_rejects_what_the_model_rejects() -> None:
    validator = jsonschema.Draft202012Validator(scenario_schema())
    for data, _ in MISTAKES[:-2]:  # record_args flags are checked by tito record's parser, not by types
        assert list(validator.iter_errors(data)), data
    deep = jsonschema.exceptions.best_match(validator.iter_errors(MISTAKES[0][0]))
    assert list(deep.absolute_path) == ["turns", 3, "tool_calls", 0, "arguments"]  # where an editor marks it


def tito(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_the_three_commands_give_the_same_one_line_and_exit_2(tmp_path: Path) -> None:
    path = write(tmp_path, {"turns": turns(3, tool_calls=[{"name": "shell", "arguments": ["ls"]}]), "client": SCRIPTED})
    line = f"{path}: turns[3].tool_calls[0].arguments: expected object, got array\n"
    runs = {
        "fake-engine": tito("fake-engine", "--script", str(path), "--listen", "127.0.0.1:1"),
        "record": tito(
            "record", "--engine", "http://127.0.0.1:1", "--out", str(tmp_path / "r.tito"), "--scenario", str(path)
        ),
        "simulate": tito("simulate", "--scenario", str(path), "--out", str(tmp_path / "s.tito")),
        "scenario": tito("scenario", "check", str(path)),
    }
    for command, done in runs.items():
        prefix = "tito scenario check" if command == "scenario" else f"tito {command}"
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"{prefix}: {line}"), command
    assert not list(tmp_path.glob("*.tito*"))


def test_scenario_check_and_schema_on_the_command_line(tmp_path: Path) -> None:
    good = tito(
        "scenario",
        "check",
        str(ROOT / "cassettes" / "scenarios" / "tool_loop.yaml"),
        str(ROOT / "cassettes" / "scenarios" / "claude_tool_loop.yaml"),
    )
    assert good.returncode == 0 and good.stderr == "", good.stderr
    assert good.stdout.splitlines()[1].endswith("claude_tool_loop.yaml: ok (1 engine session(s), client claude-code)")
    schema = tito("scenario", "schema")
    assert schema.returncode == 0 and json.loads(schema.stdout) == json.loads(json.dumps(scenario_schema()))
