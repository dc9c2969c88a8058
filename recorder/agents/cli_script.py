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
The Structs below are the format (`fake_engine/scenario_model.py`): a typo can not silently record another
scenario.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from tito_rl.fake_engine.policies.scripted import read_scenario_data
from tito_rl.fake_engine.scenario_model import FrozenStrict, PosFloat, ScenarioError, Strict, validate
from tito_rl.recorder.agents.pins import PINS
from tito_rl.recorder.agents.stream_cut import StreamCut

SCRIPTED = "scripted"
if TYPE_CHECKING:  # a checker sees a name; msgspec checks it against the pins
    PinnedCli = str
else:
    PinnedCli = Literal[tuple(sorted(PINS))]
EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]
RUN_KEYS = ("task", "args", "kill_after_s")
SESSION_KEYS = ("env", "runs", "cut_streams", *RUN_KEYS)


class CliRun(FrozenStrict, frozen=True):
    """One CLI process: its task, extra flags, and when (if ever) it is killed mid-turn."""

    task: str
    args: tuple[str, ...] = ()  # appended to the launcher's command line
    kill_after_s: PosFloat | None = None  # kill the CLI's process group this long after it started

    def __post_init__(self) -> None:
        if not self.task.strip():
            raise ValueError("the task text is empty")


class CliSessionSpec(Strict, kw_only=True):
    """A session as the file gives it: its runs, or one run's `task`/`args`/`kill_after_s` as shorthand."""

    agent: PinnedCli | None = None  # default: the client's `agent`
    env: dict[EnvName, str | int | float] = {}  # added to the launcher's environment
    runs: Annotated[tuple[CliRun, ...], msgspec.Meta(min_length=1)] | None = None  # in order, in one sandbox
    task: str | None = None
    args: tuple[str, ...] | None = None
    kill_after_s: PosFloat | None = None
    cut_streams: Annotated[tuple[StreamCut, ...], msgspec.Meta(min_length=1)] = ()  # agents/stream_cut.py

    def __post_init__(self) -> None:
        own = [k for k in RUN_KEYS if getattr(self, k) is not None]
        if self.runs is not None and own:
            raise ValueError(f"either runs or {own}, not both")
        if self.runs is None:
            if self.task is None:
                raise ValueError("missing key 'task' (the task text), or 'runs'")
            self.runs = (CliRun(self.task, self.args or (), self.kill_after_s),)


class CliClient(CliSessionSpec, kw_only=True):
    """A real CLI's `client:` section: the pinned CLI, and one session's keys (shorthand) or `sessions`."""

    agent: PinnedCli  # the pinned CLI every session runs (a session may name another)
    record_args: tuple[str, ...] = ()  # extra `tito record` flags (tito simulate and make corpus apply them)
    timeout_s: PosFloat = 180.0  # per CLI run
    sessions: Annotated[tuple[CliSessionSpec, ...], msgspec.Meta(min_length=1)] | None = None  # run at once

    def __post_init__(self) -> None:
        if self.sessions is None:
            super().__post_init__()
            return
        clash = [k for k in SESSION_KEYS if getattr(self, k) not in (None, (), {})]
        if clash:
            raise ValueError(f"either sessions or {clash}, not both")


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


def session_id(scenario: str, agent: str, number: int) -> str:
    return f"{re.sub(r'[^A-Za-z0-9.-]', '-', scenario)}-{agent}-{number:04d}"


def parse_cli_script(data: Any, name: str, agent: str | None = None) -> CliScript:
    """`agent` (from `--agent`) overrides `client.agent` and every session's, so one scenario can be run by
    another CLI."""
    if agent is not None and isinstance(data, dict):
        data = {**data, "agent": agent}
    client = validate(data, CliClient, where="client")
    sessions = []
    for i, spec in enumerate(client.sessions or (client,)):
        who = agent or spec.agent or client.agent
        env = {k: str(v) for k, v in spec.env.items()}
        sessions.append(CliSession(session_id(name, who, i), who, spec.runs or (), env, spec.cut_streams))
    return CliScript(name, client.agent, tuple(sessions), client.record_args, client.timeout_s)


def client_agent(path: str | Path) -> str | None:
    """Who plays a scenario's client: `scripted`, a pinned CLI's name, or None (no `client:` section)."""
    data = read_scenario_data(path)
    if not isinstance(data, dict) or not isinstance(data.get("client"), dict):
        return None
    return str(data["client"].get("agent", SCRIPTED))


def scenario_name(path: str | Path, data: Any = None) -> str:
    data = read_scenario_data(path) if data is None else data
    return str(data.get("name") or Path(path).stem) if isinstance(data, dict) else Path(path).stem


def load_cli_script(path: str | Path, agent: str | None = None, task: str | None = None) -> CliScript:
    """The CLI script of a scenario file. Without one (an engine script only, as in fake_engine/examples/, or
    a scripted client's), `agent` and `task` make a one-run script; `task` also replaces the script's runs."""
    data = read_scenario_data(path)
    name = scenario_name(path, data)
    client = data.get("client") if isinstance(data, dict) else None
    if not isinstance(client, dict) or client.get("agent", SCRIPTED) == SCRIPTED:
        if not agent or not task:
            raise ScenarioError(f"{path}: no CLI `client:` section, so --agent and --task are needed")
        client = {"agent": agent, "task": task}
    elif task is not None:
        client = {k: v for k, v in client.items() if k not in ("sessions", *SESSION_KEYS)} | {"task": task}
    try:
        return parse_cli_script(client, name, agent)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
