"""A real-CLI scenario's `client:` section: which pinned CLI runs, with what task, flags and environment.

A corpus scenario (`cassettes/scenarios/<name>.yaml`) holds the fake engine's script and a `client:` section.
`client.agent` says who plays the client: `scripted` (the default; `recorder/scripted/script.py`) or a pinned
CLI (`recorder/agents/pins.py`), described here:

    client:
      agent: claude-code                 # the pinned CLI every session runs (a session may name another)
      record_args: [--reward, "1"]        # extra `tito record` flags (tito simulate and make corpus apply them)
      timeout_s: 120                      # per CLI run
      task: List the files.               # shorthand for one session of one run; or:
      sessions:                           # run concurrently, each in its own sandbox with its own session id
        - agent: codex                    # optional: mixed recordings
          env: {CLAUDE_AUTOCOMPACT_PCT_OVERRIDE: "5"}   # added to the launcher's environment
          runs:                           # CLI processes in order, in the same sandbox (HOME and workdir)
            - task: Count the lines.
            - task: And the words?
              args: [--continue]          # appended to the launcher's command line
              kill_after_s: 6             # kill the CLI's process group this long after it started
          cut_streams:                    # replies cut mid-stream on their way to the CLI (agents/stream_cut.py)
            - {request: 1, after_events: 3}   # the session's 2nd request (0-based): 3 SSE events, then closed

Session ids are `<scenario>-<agent>-<NNNN>` (numbered across the script), never random, so a re-recording
sends the same credentials and its sandboxes sit at the same paths (the CLIs put the path into the prompt).
Parsing is strict: a typo can not silently record another scenario.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_engine.scripted import strict_mapping
from recorder.agents.pins import PINS
from recorder.agents.stream_cut import StreamCut
from recorder.scripted.script import load_scenario_file

SCRIPTED = "scripted"
RUN_KEYS = {"task", "args", "kill_after_s"}
SESSION_KEYS = {"agent", "env", "runs", "cut_streams"} | RUN_KEYS
CUT_KEYS = {"request", "after_events"}
CLIENT_KEYS = {"agent", "record_args", "timeout_s", "sessions"} | SESSION_KEYS - {"agent"}


@dataclass(frozen=True)
class CliRun:
    """One CLI process: its task, extra flags, and when (if ever) it is killed mid-turn."""

    task: str
    args: tuple[str, ...] = ()
    kill_after_s: float | None = None


@dataclass(frozen=True)
class CliSession:
    id: str
    agent: str
    runs: tuple[CliRun, ...]
    env: dict[str, str] = field(default_factory=dict)
    cut_streams: tuple[StreamCut, ...] = ()  # a relay in front of the proxy cuts these replies to the CLI


@dataclass(frozen=True)
class CliScript:
    name: str
    agent: str
    sessions: tuple[CliSession, ...]
    record_args: tuple[str, ...] = ()
    timeout_s: float = 180.0

    @property
    def agents(self) -> list[str]:
        return list(dict.fromkeys(s.agent for s in self.sessions))


def _strings(where: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: a list of strings")
    return tuple(value)


def _agent(where: str, value: Any) -> str:
    if value not in PINS:
        raise ValueError(f"{where}: {value!r} is not a pinned CLI; one of {sorted(PINS)}")
    return str(value)


def _run(where: str, data: Any) -> CliRun:
    d = strict_mapping(where, data, RUN_KEYS)
    task = d.get("task")
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"{where}.task: the task text is required")
    kill = d.get("kill_after_s")
    if kill is not None and (isinstance(kill, bool) or not isinstance(kill, int | float) or kill <= 0):
        raise ValueError(f"{where}.kill_after_s: a positive number of seconds")
    return CliRun(task, _strings(f"{where}.args", d.get("args")), None if kill is None else float(kill))


def _runs(where: str, d: dict[str, Any]) -> tuple[CliRun, ...]:
    """A session's `runs:`, or the one run its own task/args/kill_after_s describe."""
    own = {k: d[k] for k in RUN_KEYS if k in d}
    if "runs" in d:
        if own:
            raise ValueError(f"{where}: either runs or {sorted(own)}, not both")
        raw = d["runs"]
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"{where}.runs: needs at least one run")
        return tuple(_run(f"{where}.runs[{i}]", r) for i, r in enumerate(raw))
    return (_run(where, own),)


def _env(where: str, value: Any) -> dict[str, str]:
    env = strict_mapping(where, value or {}, set(value or {}))
    bad = [k for k, v in env.items() if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)) or
           not isinstance(v, str | int | float) or isinstance(v, bool)]
    if bad:
        raise ValueError(f"{where}: names must be identifiers and values strings or numbers ({bad})")
    return {str(k): str(v) for k, v in env.items()}


def _cuts(where: str, value: Any) -> tuple[StreamCut, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: a list of {{request, after_events}}")
    cuts = []
    for i, raw in enumerate(value):
        d = strict_mapping(f"{where}[{i}]", raw, CUT_KEYS)
        numbers = [d.get(k) for k in sorted(CUT_KEYS)]
        if any(isinstance(n, bool) or not isinstance(n, int) for n in numbers):
            raise ValueError(f"{where}[{i}]: request and after_events are integers")
        try:
            cuts.append(StreamCut(d["request"], d["after_events"]))
        except ValueError as exc:
            raise ValueError(f"{where}[{i}]: {exc}") from exc
    return tuple(cuts)


def session_id(scenario: str, agent: str, number: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9.-]', '-', scenario)}-{agent}-{number:04d}"


def parse_cli_script(data: Any, name: str, agent: str | None = None) -> CliScript:
    """`agent` (from `--agent`) overrides `client.agent`, so one scenario can be run by another CLI."""
    d = strict_mapping("client", data, CLIENT_KEYS)
    default_agent = _agent("client.agent", agent or d.get("agent"))
    timeout = d.get("timeout_s", 180.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError("client.timeout_s: a positive number of seconds")
    if "sessions" in d:
        clash = set(d) & (SESSION_KEYS - {"agent"})  # client.agent is the sessions' default
        if clash:
            raise ValueError(f"client: either sessions or {sorted(clash)}, not both")
        raw = d["sessions"]
        if not isinstance(raw, list) or not raw:
            raise ValueError("client.sessions: needs at least one session")
    else:
        raw = [{k: d[k] for k in SESSION_KEYS if k in d}]
    sessions = []
    for i, s in enumerate(raw):
        where = f"client.sessions[{i}]" if "sessions" in d else "client"
        s = strict_mapping(where, s, SESSION_KEYS)
        who = _agent(f"{where}.agent", s["agent"]) if "agent" in s and agent is None else default_agent
        sessions.append(CliSession(session_id(name, who, i), who, _runs(where, s), _env(f"{where}.env", s.get("env")),
                                   _cuts(f"{where}.cut_streams", s.get("cut_streams"))))
    return CliScript(name, default_agent, tuple(sessions), _strings("client.record_args", d.get("record_args")),
                     float(timeout))


def client_agent(path: str | Path) -> str | None:
    """Who plays a scenario's client: `scripted`, a pinned CLI's name, or None (no `client:` section)."""
    data = load_scenario_file(path)
    if not isinstance(data, dict) or not isinstance(data.get("client"), dict):
        return None
    return str(data["client"].get("agent", SCRIPTED))


def scenario_name(path: str | Path, data: Any = None) -> str:
    data = load_scenario_file(path) if data is None else data
    return str(data.get("name") or Path(path).stem) if isinstance(data, dict) else Path(path).stem


def load_cli_script(path: str | Path, agent: str | None = None, task: str | None = None) -> CliScript:
    """The CLI script of a scenario file. Without one (an engine script only, as in fake_engine/examples/, or
    a scripted client's), `agent` and `task` make a one-run script; `task` also replaces the script's runs."""
    data = load_scenario_file(path)
    name = scenario_name(path, data)
    client = data.get("client") if isinstance(data, dict) else None
    if not isinstance(client, dict) or client.get("agent", SCRIPTED) == SCRIPTED:
        if not agent or not task:
            raise ValueError(f"{path}: no CLI `client:` section, so --agent and --task are needed")
        return parse_cli_script({"agent": agent, "task": task}, name)
    if task is not None:
        client = {k: v for k, v in client.items() if k not in ("sessions", "runs", *RUN_KEYS)} | {"task": task}
    return parse_cli_script(client, name, agent)
