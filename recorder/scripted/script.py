"""The scripted agent client's script: the `client:` side of a corpus scenario file.

A corpus scenario (`cassettes/scenarios/<name>.yaml`) holds both sides of a recording: the fake engine's
script (`fake_engine/policies/scripted.py`, which ignores `client:`) and what the client does:

    client:
      record_args: [--no-preserve-reasoning]   # extra `tito record` flags the corpus recorder passes
      engine_args: [--enable-return-routed-experts]   # extra `tito fake-engine` flags tito simulate passes
      sessions:                                # all run concurrently
        - id: tool-loop-0000                   # the session id, sent as the bearer token
          wire: anthropic                      # anthropic | chat | responses
          stream: true
          path_prefix: /sessions/{id}          # optional: the session in the URL too (rllm's gateway, miles)
          headers: {x-session-id: "{id}"}      # optional: sent with every model request ({id}: the session id)
          api_key: sk-test-...                 # optional: the bearer token instead of the session id
          session_cookie: VLLMModel___policy_model   # optional: a signed session cookie kept across turns
          system: You are a coding agent.
          tools: [Bash, Read, Agent]           # catalog names (TOOL_CATALOG) or {name, description, parameters}
          results:                             # canned tool results by tool name (nothing is executed)
            Bash: ["a.txt\\nb.txt", "ok"]      # a list is used in order, its last entry repeats
            Agent: {subagent: explorer}        # run that sub-agent (or the one the call's subagent_type names);
                                               # its last text is the result; a reply's sub-agents run at once
          subagents:
            explorer: {system: You explore., tools: [Read], results: {Read: "..."}}
          disconnects: [{request: 1, after_ms: 300, resend_after_ms: 300}]   # client aborts
          extra_body: {seed: 7}                # merged into every model request's body, as the OpenAI SDK's
          steps:
            - prompt: List the files.          # a user message, then the tool loop (max_turns)
            - compact: Summarise the work.     # a summary turn, then the history is that summary
            - finish: 1.0                      # POST /tito/sessions/<id>/finish {"reward": 1.0}
            - drop: true                       # DELETE /tito/sessions/<id>

`path_prefix` is for a gateway whose sessions live in the URL: the model requests go to
`{base}{prefix}/v1/...` (`{id}` is replaced by the session id), e.g. `/sessions/{id}/v1/chat/completions` for
rllm's gateway, whose agents are handed the base URL `.../sessions/<sid>/v1`. finish and drop still go to tito's
agent tap (`/tito/sessions/<id>/finish`), which is not the gateway's. The prefix starts with `/`, has no trailing
`/`, query or fragment, and `{id}` is its only placeholder. `headers` are for a gateway that keeps its sessions in a
header or a cookie (`x-session-id: "{id}"`, `Cookie: "sid={id}"`; `tito record --session-from header:x-session-id`
or `cookie:sid`); `api_key` makes the bearer token something other than the session id (a rollout's own secret).
`session_cookie: NAME` is for a gateway that keeps its session in a Starlette signed session cookie (NeMo Gym's
`VLLMModel___policy_model`, signed with its own name as the key): the first request carries `{"session_id": <the
session id>}` signed so, each later one the value the gateway last set (`Set-Cookie`), as a client keeping cookies
does; `tito record --session-from session-cookie:NAME` reads the id inside.

`client.concurrency: N` runs at most N sessions at once (default: all of them), as a training step's rollouts.
The Structs below are the format (`fake_engine/scenario_model.py`): an unknown key or a wrong type is an error
with its path, so a typo cannot silently record the wrong scenario.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from tito_rl.fake_engine.policies.scripted import read_scenario_data
from tito_rl.fake_engine.scenario_model import (
    FrozenStrict,
    NonNegFloat,
    NonNegInt,
    PosInt,
    ScenarioError,
    Strict,
    validate,
)

WIRES = ("anthropic", "chat", "responses")
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504, 529})


class ToolSpec(FrozenStrict, frozen=True):
    """A tool offered to the model: a catalog name in the file (`Bash`), or this mapping."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object", "properties": {}})


def _tool(name: str, about: str, **props: str) -> ToolSpec:
    properties = {k: {"type": "string", "description": v} for k, v in props.items()}
    return ToolSpec(
        name=name,
        description=about,
        parameters={"type": "object", "properties": properties, "required": [next(iter(props))]},
    )


# What each CLI calls its tools (the fake engine maps a scenario's `shell` onto whichever is offered).
TOOL_CATALOG: dict[str, ToolSpec] = {
    t.name: t
    for t in (
        _tool(
            "Bash",
            "Executes a bash command and returns its output.",
            command="The command to run",
            description="What the command does, in a few words",
        ),
        _tool("Read", "Reads a file from the local filesystem.", file_path="Absolute path of the file"),
        _tool(
            "Agent",
            "Launch a new agent to handle a multi-step task on its own.",
            prompt="The task for the agent",
            description="A short description of the task",
            subagent_type="The kind of agent to use",
        ),
        _tool(
            "run_shell_command",
            "Runs a shell command.",
            command="The command to run",
            description="What the command does",
        ),
        _tool("read_file", "Reads a file.", absolute_path="Absolute path of the file"),
        _tool("exec_command", "Runs a command in a PTY, returning its output.", cmd="Shell command to execute"),
    )
}


class CannedResult(FrozenStrict, frozen=True):
    """`{subagent: NAME}` or `{lines: N}` (msgspec takes one mapping type in a union: the two share it)."""

    subagent: str | None = None
    lines: PosInt | None = None

    def __post_init__(self) -> None:
        if (self.subagent is None) == (self.lines is None):
            raise ValueError("a result mapping is {subagent: NAME} or {lines: N}")


# A canned tool result: a string, a list used in order (its last entry repeats), a sub-agent's answer or
# generated lines.
Result = str | list[str] | CannedResult


class AgentSpec(Strict):
    """A conversation's fixed parts: the main thread's (a session's own keys), or a sub-agent's."""

    system: str = ""
    tools: tuple[str | ToolSpec, ...] = ()  # catalog names (TOOL_CATALOG) or {name, description, parameters}
    results: dict[str, Result] = {}  # canned tool results by tool name (nothing is executed)
    prompt: str | None = None  # a sub-agent's task when the Agent call carries no `prompt` argument

    def __post_init__(self) -> None:
        unknown = [t for t in self.tools if isinstance(t, str) and t not in TOOL_CATALOG]
        if unknown:
            raise ValueError(f"unknown tool {unknown[0]!r} in tools; catalog: {', '.join(sorted(TOOL_CATALOG))}")
        self.tools = tuple(TOOL_CATALOG[t] if isinstance(t, str) else t for t in self.tools)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools as specs: `__post_init__` looked every catalog name up."""
        return tuple(t for t in self.tools if isinstance(t, ToolSpec))


class Disconnect(FrozenStrict, frozen=True):
    """The client goes away `after_ms` into its `request`-th model request (0-based, per session, re-sends
    not counted), then re-sends the identical body `resend_after_ms` later."""

    request: NonNegInt
    after_ms: NonNegFloat
    resend_after_ms: NonNegFloat = 300.0


class Step(FrozenStrict, frozen=True):
    """One of: `prompt` (a user message, then the tool loop), `compact` (a summary turn, then the history is
    that summary), `finish` (POST /tito/sessions/<id>/finish with this reward), `drop` (DELETE the session)."""

    prompt: str | None = None
    compact: str | None = None
    finish: float | None = None
    drop: Literal[True] | None = None
    max_turns: PosInt = 12  # model turns of a prompt's tool loop

    def __post_init__(self) -> None:
        kinds = [k for k in ("prompt", "compact", "finish", "drop") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"exactly one of prompt, compact, finish, drop (got {kinds})")

    @property
    def kind(self) -> str:
        return next(k for k in ("prompt", "compact", "finish", "drop") if getattr(self, k) is not None)

    @property
    def text(self) -> str:
        return self.prompt or self.compact or ""

    @property
    def reward(self) -> float:
        return self.finish or 0.0


def check_path_prefix(prefix: str) -> None:
    """A `path_prefix` that cannot make a wrong URL: `/seg/...`, placeholders only `{id}` (the session id)."""
    if not prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
        raise ValueError(f"path_prefix {prefix!r} must start with '/' and have no empty or trailing segment")
    if any(c in prefix for c in "?# "):
        raise ValueError(f"path_prefix {prefix!r} must be a path only (no query, fragment or space)")
    unknown = [name for name in re.findall(r"\{([^{}]*)\}", prefix) if name != "id"]
    if unknown or prefix.replace("{id}", "").count("{") or prefix.replace("{id}", "").count("}"):
        raise ValueError(f"path_prefix {prefix!r}: the only placeholder is {{id}} (the session id)")


class ClientSession(Strict):
    """One scripted session; its own `system`, `tools` and `results` are the main thread's."""

    id: str  # the session id, sent as the bearer token
    wire: Literal["anthropic", "chat", "responses"]
    steps: Annotated[tuple[Step, ...], msgspec.Meta(min_length=1)]
    path_prefix: str | None = None  # the model requests' path before the wire's (`/sessions/{id}`); None: none
    headers: dict[str, str] = {}  # extra headers of every model request, `{id}` replaced by the session id
    api_key: str | None = None  # the bearer token (None: the session id)
    session_cookie: str | None = None  # a signed session cookie's name (its key too), kept across turns
    system: str = ""
    tools: tuple[str | ToolSpec, ...] = ()
    results: dict[str, Result] = {}
    stream: bool = True
    model: str = "tito-policy"
    max_tokens: PosInt = 32000
    extra_body: dict[str, Any] = {}  # fields added to every model request's body (`{seed: 7, temperature: 0.7}`)
    subagents: dict[str, AgentSpec] = {}
    disconnects: tuple[Disconnect, ...] = ()  # client aborts
    retries: NonNegInt = 3  # re-sends of the identical body after a retryable status
    retry_delay_ms: NonNegFloat = 50.0
    start_after_ms: NonNegFloat = 0.0

    def __post_init__(self) -> None:
        if self.path_prefix is not None:
            check_path_prefix(self.path_prefix)
        self.tools = AgentSpec(tools=self.tools).tools
        for results in [self.results, *(s.results for s in self.subagents.values())]:
            for name, value in results.items():
                if isinstance(value, CannedResult) and value.subagent not in (None, *self.subagents):
                    raise ValueError(f"the result of {name} names an unknown sub-agent {value.subagent!r}")

    @property
    def prefix(self) -> str:
        """The path before the wire's own: `path_prefix` with the session id in place of `{id}`; "" for none."""
        return (self.path_prefix or "").replace("{id}", self.id)

    @property
    def extra_headers(self) -> dict[str, str]:
        """`headers` with the session id in place of `{id}`."""
        return {name: value.replace("{id}", self.id) for name, value in self.headers.items()}

    @property
    def agent(self) -> AgentSpec:
        return AgentSpec(system=self.system, tools=self.tools, results=self.results)


class ClientScript(Strict):
    """The scripted client's `client:` section."""

    sessions: Annotated[tuple[ClientSession, ...], msgspec.Meta(min_length=1)]
    agent: Literal["scripted"] = "scripted"
    record_args: tuple[str, ...] = ()  # extra `tito record` flags the corpus recorder passes
    engine_args: tuple[str, ...] = ()  # extra `tito fake-engine` flags (`--enable-return-routed-experts`)
    concurrency: PosInt | None = None  # sessions at once (None: all of them)

    def __post_init__(self) -> None:
        ids = [s.id for s in self.sessions]
        if len(set(ids)) != len(ids):
            raise ValueError(f"session ids must be unique, got {ids}")


def parse_client_script(data: Any) -> ClientScript:
    return validate(data, ClientScript, where="client")


def load_client_script(path: str | Path) -> ClientScript:
    """The `client:` section of a scenario file (YAML or JSON)."""
    data = read_scenario_data(path)
    if not isinstance(data, dict) or "client" not in data:
        raise ScenarioError(f"{path}: no `client:` section (a corpus scenario holds the client's script)")
    try:
        return parse_client_script(data["client"])
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
