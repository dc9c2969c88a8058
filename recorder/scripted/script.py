"""The scripted agent client's script: the `client:` side of a corpus scenario file.

A corpus scenario (`cassettes/scenarios/<name>.yaml`) holds both sides of a recording: the fake engine's
script (`fake_engine/scripted.py`, which ignores `client:`) and what the client does:

    client:
      record_args: [--no-preserve-reasoning]   # extra `tito record` flags the corpus recorder passes
      sessions:                                # all run concurrently
        - id: tool-loop-0000                   # the session id, sent as the bearer token
          wire: anthropic                      # anthropic | chat | responses
          stream: true
          system: You are a coding agent.
          tools: [Bash, Read, Agent]           # catalog names (TOOL_CATALOG) or {name, description, parameters}
          results:                             # canned tool results by tool name (nothing is executed)
            Bash: ["a.txt\\nb.txt", "ok"]      # a list is used in order, its last entry repeats
            Agent: {subagent: explorer}        # run that sub-agent; its last text is the result
          subagents:
            explorer: {system: You explore., tools: [Read], results: {Read: "..."}}
          disconnects: [{request: 1, after_ms: 300, resend_after_ms: 300}]   # client aborts
          steps:
            - prompt: List the files.          # a user message, then the tool loop (max_turns)
            - compact: Summarise the work.     # a summary turn, then the history is that summary
            - finish: 1.0                      # POST /tito/sessions/<id>/finish {"reward": 1.0}
            - drop: true                       # DELETE /tito/sessions/<id>

`client.concurrency: N` runs at most N sessions at once (default: all of them), as a training step's rollouts.
Parsing is strict (unknown keys are errors) so a typo cannot silently record the wrong scenario.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_engine.scripted import strict_mapping

WIRES = ("anthropic", "chat", "responses")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 529})


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]


def _tool(name: str, about: str, **props: str) -> ToolSpec:
    properties = {k: {"type": "string", "description": v} for k, v in props.items()}
    return ToolSpec(name, about, {"type": "object", "properties": properties, "required": [next(iter(props))]})


# What each CLI calls its tools (the fake engine maps a scenario's `shell` onto whichever is offered).
TOOL_CATALOG: dict[str, ToolSpec] = {t.name: t for t in (
    _tool("Bash", "Executes a bash command and returns its output.", command="The command to run",
          description="What the command does, in a few words"),
    _tool("Read", "Reads a file from the local filesystem.", file_path="Absolute path of the file"),
    _tool("Agent", "Launch a new agent to handle a multi-step task on its own.", prompt="The task for the agent",
          description="A short description of the task", subagent_type="The kind of agent to use"),
    _tool("run_shell_command", "Runs a shell command.", command="The command to run",
          description="What the command does"),
    _tool("read_file", "Reads a file.", absolute_path="Absolute path of the file"),
    _tool("exec_command", "Runs a command in a PTY, returning its output.", cmd="Shell command to execute"),
)}


@dataclass(frozen=True)
class AgentSpec:
    """A conversation's fixed parts: the main thread's, or a sub-agent's."""

    system: str
    tools: tuple[ToolSpec, ...] = ()
    # tool name -> str | [str, ...] | {subagent: name} | {lines: n}
    results: dict[str, Any] = field(default_factory=dict)
    prompt: str | None = None  # a sub-agent's task when the Agent call carries no `prompt` argument


@dataclass(frozen=True)
class Disconnect:
    """The client goes away `after_ms` into its `request`-th model request (0-based, per session, re-sends
    not counted), then re-sends the identical body `resend_after_ms` later."""

    request: int
    after_ms: float
    resend_after_ms: float = 300.0


@dataclass(frozen=True)
class Step:
    kind: str  # prompt | compact | finish | drop
    text: str = ""
    max_turns: int = 12
    reward: float = 0.0


@dataclass(frozen=True)
class ClientSession:
    id: str
    wire: str
    agent: AgentSpec
    steps: tuple[Step, ...]
    stream: bool = True
    model: str = "tito-policy"
    max_tokens: int = 32000
    subagents: dict[str, AgentSpec] = field(default_factory=dict)
    disconnects: tuple[Disconnect, ...] = ()
    retries: int = 3  # re-sends of the identical body after a retryable status
    retry_delay_ms: float = 50.0
    start_after_ms: float = 0.0


@dataclass(frozen=True)
class ClientScript:
    sessions: tuple[ClientSession, ...]
    record_args: tuple[str, ...] = ()
    concurrency: int | None = None  # sessions at once (None: all)


def _keys(where: str, data: Any, allowed: set[str], required: frozenset[str] | set[str] = frozenset()
          ) -> dict[str, Any]:
    strict_mapping(where, data, allowed)
    missing = sorted(required - set(data))
    if missing:
        raise ValueError(f"{where}: missing keys {missing}")
    return data


def _tools(where: str, raw: Any) -> tuple[ToolSpec, ...]:
    tools = []
    for i, t in enumerate(raw or []):
        if isinstance(t, str):
            if t not in TOOL_CATALOG:
                raise ValueError(f"{where}[{i}]: unknown tool {t!r}; catalog: {sorted(TOOL_CATALOG)}")
            tools.append(TOOL_CATALOG[t])
        else:
            d = _keys(f"{where}[{i}]", t, {"name", "description", "parameters"}, {"name"})
            tools.append(ToolSpec(str(d["name"]), str(d.get("description", "")),
                                  d.get("parameters") or {"type": "object", "properties": {}}))
    return tuple(tools)


def _agent(where: str, d: dict[str, Any]) -> AgentSpec:
    results = d.get("results") or {}
    if not isinstance(results, dict):
        raise ValueError(f"{where}.results: expected a mapping of tool name to result")
    for name, value in results.items():
        if isinstance(value, dict) and "lines" in value:
            lines = _keys(f"{where}.results.{name}", value, {"lines"}, {"lines"})["lines"]
            if not isinstance(lines, int) or isinstance(lines, bool) or lines < 1:
                raise ValueError(f"{where}.results.{name}.lines: a number of lines >= 1")
        elif isinstance(value, dict):
            _keys(f"{where}.results.{name}", value, {"subagent"}, {"subagent"})
        elif not isinstance(value, str | list):
            raise ValueError(f"{where}.results.{name}: a string, a list of strings, {{subagent: NAME}} or "
                             "{lines: N}")
    prompt = d.get("prompt")
    return AgentSpec(str(d.get("system", "")), _tools(f"{where}.tools", d.get("tools")), dict(results),
                     None if prompt is None else str(prompt))


def _step(where: str, raw: Any) -> Step:
    d = _keys(where, raw, {"prompt", "max_turns", "compact", "finish", "drop"})
    kinds = [k for k in ("prompt", "compact", "finish", "drop") if k in d]
    if len(kinds) != 1:
        raise ValueError(f"{where}: exactly one of prompt, compact, finish, drop (got {kinds})")
    kind = kinds[0]
    if kind == "finish":
        return Step("finish", reward=float(d["finish"]))
    if kind == "drop":
        return Step("drop")
    max_turns = int(d.get("max_turns", 12))
    if max_turns < 1:
        raise ValueError(f"{where}.max_turns: must be >= 1")
    return Step(kind, text=str(d[kind]), max_turns=max_turns)


SESSION_KEYS = {"id", "wire", "stream", "model", "max_tokens", "system", "tools", "results", "subagents",
                "disconnects", "retries", "retry_delay_ms", "start_after_ms", "steps"}


def _session(where: str, raw: Any) -> ClientSession:
    d = _keys(where, raw, SESSION_KEYS, {"id", "wire", "steps"})
    if d["wire"] not in WIRES:
        raise ValueError(f"{where}.wire: one of {list(WIRES)}, got {d['wire']!r}")
    subagents = {}
    for name, sub in (d.get("subagents") or {}).items():
        sub_where = f"{where}.subagents.{name}"
        subagents[str(name)] = _agent(sub_where, _keys(sub_where, sub, {"system", "tools", "results", "prompt"}))
    disconnects = tuple(Disconnect(**_keys(f"{where}.disconnects[{i}]", x, {"request", "after_ms", "resend_after_ms"},
                                           {"request", "after_ms"}))
                        for i, x in enumerate(d.get("disconnects") or []))
    steps = tuple(_step(f"{where}.steps[{i}]", s) for i, s in enumerate(d["steps"] or []))
    if not steps:
        raise ValueError(f"{where}.steps: needs at least one step")
    agent = _agent(where, d)
    for name, value in [*agent.results.items(), *(i for s in subagents.values() for i in s.results.items())]:
        if isinstance(value, dict) and "subagent" in value and value["subagent"] not in subagents:
            raise ValueError(f"{where}: result of {name} names an unknown sub-agent {value['subagent']!r}")
    return ClientSession(
        id=str(d["id"]), wire=d["wire"], agent=agent, steps=steps, stream=bool(d.get("stream", True)),
        model=str(d.get("model", "tito-policy")), max_tokens=int(d.get("max_tokens", 32000)), subagents=subagents,
        disconnects=disconnects, retries=int(d.get("retries", 3)), retry_delay_ms=float(d.get("retry_delay_ms", 50)),
        start_after_ms=float(d.get("start_after_ms", 0)))


def parse_client_script(data: Any) -> ClientScript:
    d = _keys("client", data, {"sessions", "record_args", "concurrency"}, {"sessions"})
    sessions = tuple(_session(f"client.sessions[{i}]", s) for i, s in enumerate(d["sessions"] or []))
    if not sessions:
        raise ValueError("client.sessions: needs at least one session")
    ids = [s.id for s in sessions]
    if len(set(ids)) != len(ids):
        raise ValueError(f"client.sessions: session ids must be unique, got {ids}")
    record_args = d.get("record_args") or []
    if not isinstance(record_args, list) or not all(isinstance(a, str) for a in record_args):
        raise ValueError("client.record_args: a list of strings (tito record flags)")
    concurrency = d.get("concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or isinstance(concurrency, bool)
                                    or concurrency < 1):
        raise ValueError("client.concurrency: a number of sessions >= 1")
    return ClientScript(sessions, tuple(record_args), concurrency)


def load_scenario_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from None


def load_client_script(path: str | Path) -> ClientScript:
    """The `client:` section of a scenario file (YAML or JSON)."""
    data = load_scenario_file(path)
    if not isinstance(data, dict) or "client" not in data:
        raise ValueError(f"{path}: no `client:` section (a corpus scenario holds the client's script)")
    return parse_client_script(data["client"])
