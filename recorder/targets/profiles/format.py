"""The gateway profile file: how to adopt a gateway with a YAML file instead of a Python driver (docs/targets.md).

A profile says how to start the gateway (a command with `{port}`, `{engine}` and the rest in it, and a readiness
check), the calls it needs once started (register a model) and around each session (create it before its first
call; drop it), where its sessions live on the agent leg (`--session-from`'s forms), and where its samples come
from (a URL per session whose JSON body maps to prompt ids, output ids and logprobs per call, or to ready samples,
or a `module:function`). `tito record --target FILE` records with it; the cassette's header keeps the whole profile,
which `tito replay --target FILE` checks the file against (and runs only with `--trust-cassette`: `trust.py`).

The Structs below are the format, version 1 (`profile: 1`): an unknown key or a wrong type is a one-line error
naming where (`FILE: samples.calls.prompt_ids: expected str, got int`). `tito profile check FILE` checks one and
`tito profile schema` prints the JSON Schema built from these same Structs.

Placeholders, in every string of `start`, the calls and `samples.request`: `{host}` and `{port}` (where the gateway
listens: a free loopback port tito picks), `{url}` (`http://{host}:{port}`), `{engine}` (tito's engine tap, the
URL the gateway must call), `{python}` (the gateway's Python, from `python:`), `{session}` (the session's id, in
session calls), `{reward}` (at finish), and each `vars:` entry. A string that is only a placeholder (`"{reward}"`)
takes the value's own type; `{{` and `}}` are literal braces.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec
import yaml

from tito_rl.fake_engine.scenario_model import PosFloat, ScenarioError, Strict, validate
from tito_rl.trajectory.adapters.session_from import SessionFromError, parse_session_from

FORMAT_VERSION = 1
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


class ProfileError(ScenarioError):
    """A profile that does not fit its format, or cannot be read: one line, `FILE: where: what`."""


class Call(Strict):
    """One HTTP call tito makes to the gateway (not recorded: it is set-up, not traffic under test)."""

    path: str  # on the gateway, placeholders allowed: `/api/rollouts/{session}`
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    json: Any = None  # the JSON body, placeholders allowed in every string
    expect: tuple[int, ...] = ()  # statuses that count as success (default: any 2xx)

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError(f"path must start with '/', got {self.path!r}")


class Ready(Strict):
    """The gateway is ready once `GET path` answers `status`."""

    path: str
    status: int = 200
    timeout_s: PosFloat = 120.0


class Start(Strict):
    command: Annotated[tuple[str, ...], msgspec.Meta(min_length=1)]  # argv, placeholders allowed
    ready: Ready
    env: dict[str, str] = {}  # added to tito's environment, placeholders allowed
    cwd: str | None = None


class PythonSpec(Strict):
    """What `{python}` stands for: the interpreter named by `env`, else the cached environment tito makes for a
    known gateway (`gateway_env`, `python -m tito_rl.recorder.targets.own_python.envs NAME`), else `default`."""

    env: str | None = None
    gateway_env: str | None = None
    default: str | None = None


class Sessions(Strict):
    """Where the gateway keeps its sessions, and what it needs around each."""

    # where the agent leg carries the session: bearer, header:NAME, cookie:NAME, session-cookie:NAME, path:PREFIX
    # with {sid}
    session_from: str = msgspec.field(name="from", default="bearer")
    # the path agents put before the API's own (`/v1/...`), `{id}` standing for the session id; the real CLIs'
    # base URL is `{agent tap}{base_path}/v1`
    base_path: str | None = None
    routing_header: str | None = None  # the engine-leg header carrying the session (None: it sends none)
    open: tuple[Call, ...] = ()  # before a session's first call (create it; reset a previous run's)
    drop: tuple[Call, ...] = ()  # `tito`'s drop

    def __post_init__(self) -> None:
        try:
            parse_session_from(self.session_from)
        except SessionFromError as exc:
            raise ValueError(f"from: {str(exc).removeprefix('--session-from ')}") from None
        if self.base_path is not None and not re.fullmatch(r"(/[^/?#\s]+)+", self.base_path):
            raise ValueError(f"base_path must be a path like /sessions/{{id}}, got {self.base_path!r}")


class CallsMap(Strict):
    """The body holds one entry per engine call: where, and where each entry keeps its ids and logprobs (dotted
    paths; `[*]` steps into every item of a list; `where` keeps the entries whose fields equal these values)."""

    items: str  # the list of calls in the body: `[*]` for a top-level list, `data.calls[*]`
    prompt_ids: str
    output_ids: str
    logprobs: str | None = None
    where: dict[str, Any] = {}


class RowsMap(Strict):
    """The body holds ready samples: where, and their fields (dotted paths into each)."""

    items: str
    tokens: str
    response_length: str
    loss_mask: str
    logprobs: str


class SamplesSpec(Strict):
    """Where a session's samples come from at its finish."""

    before: tuple[Call, ...] = ()  # calls made first (post the reward, close the rollout)
    request: Call | None = None  # the call whose JSON body holds them
    calls: CallsMap | None = None  # per-call ids, merged into samples by `merge`
    # prefix: a call whose prompt starts with the running sample's whole sequence extends it (its new prompt
    # tokens masked, logprob 0), any other opens a sample (Agent Lightning's and rllm's trainers); per-call: one
    # sample per call
    merge: Literal["prefix", "per-call"] = "prefix"
    rows: RowsMap | None = None  # ready samples
    function: str | None = None  # `module:function(body, reward)` returning samples in tito's layout

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.calls, self.rows, self.function)) != 1:
            raise ValueError("give exactly one of calls, rows, function")
        if (self.calls is not None or self.rows is not None) and self.request is None:
            raise ValueError("calls and rows read the body of request: give request")
        if self.function is not None and ":" not in self.function:
            raise ValueError(f"function must be module:function, got {self.function!r}")


class Profile(Strict):
    """A gateway profile, format version 1."""

    profile: Literal[1]  # the format's version
    name: str
    start: Start
    sessions: Sessions = msgspec.field(default_factory=Sessions)
    description: str = ""
    version: str | tuple[str, ...] | None = None  # the gateway's version, or a command printing it
    python: PythonSpec | None = None
    vars: dict[str, str] = {}
    setup: tuple[Call, ...] = ()  # once the gateway is ready (register the engine as a model)
    samples: SamplesSpec | None = None  # None: the gateway offers no samples (replies and engine calls only)
    volatile: tuple[str, ...] = ()  # reply fields it fills with values no replay can pin
    # between replays: every `tito record` and `tito replay` starts the gateway afresh (`restart`), and
    # `sessions.open` runs before each session's first call
    reset: Literal["restart"] = "restart"

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", self.name):
            raise ValueError(f"name must be a plain name (letters, digits, _.-), got {self.name!r}")


def parse_profile(data: Any, where: str = "") -> Profile:
    """`data` (parsed YAML) as a Profile; `ProfileError` naming where."""
    if isinstance(data, dict) and data.get("profile") not in (None, FORMAT_VERSION):
        raise ProfileError(
            f"{where}profile: format version {data.get('profile')!r} is not known (this tito reads {FORMAT_VERSION})"
        )
    try:
        return validate(data, Profile, where="")
    except ScenarioError as exc:
        raise ProfileError(f"{where}{exc}") from None


def load_profile(path: str | Path) -> Profile:
    """The profile in file `path`, checked; `ProfileError` (one line) otherwise."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"{path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not YAML: {' '.join(str(exc).split())}") from None
    return parse_profile(data, where=f"{path}: ")


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The profile as plain data (what the cassette's header keeps), defaults included."""
    return msgspec.to_builtins(profile)  # type: ignore[no-any-return]


def profile_schema() -> dict[str, Any]:
    """The JSON Schema of a profile file, made from the Structs above."""
    (top,), components = msgspec.json.schema_components([Profile], ref_template="#/$defs/{name}")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **components[Profile.__name__],
        "title": "tito gateway profile",
        "$defs": components,
    }


def is_profile_path(text: str) -> bool:
    """Whether a `--target` value names a profile file (`.yaml`/`.yml`/`.json`, or an existing file)."""
    return text.endswith((".yaml", ".yml", ".json")) or Path(text).is_file()
