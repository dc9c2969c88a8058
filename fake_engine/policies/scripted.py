"""Scripted policy: a scenario file says what the model "says" per session and turn.

Scenario format (YAML or JSON; see docs/fake-engine.md):

    name: claude_tool_loop
    sessions:
      - match: {prompt_contains: "list the files"}   # optional; also routing_key, last_user_contains
        turns:
          - reasoning: The user wants a listing.
            text: Let me list the files.
            tool_calls: [{name: shell, arguments: {command: ls}}]
          - text: There are two files.
            finish: stop                             # stop | length | abort
            faults: {status: 529}
            fault_attempts: 1                        # faults hit only the first attempt: a retry succeeds

A top-level `turns:` list is shorthand for one session that matches every prompt. A turn may give raw
`ids` instead. `fault_attempts: N` limits a turn's faults and its cut finish (length, abort) to the
turn's first N requests: a client that drops a cut reply and asks again (Claude Code after a cut in its
reasoning) gets the whole turn. Sessions are matched in order; the first whose `match` holds wins (no
`match`: any).
`prompt_contains` looks at the prompt's opening (system prompt and first user message); `last_user_contains`
at the last user message, for a request that is told apart by what it asks last (Claude Code's compaction
request is the whole history plus "summarise"): such a session counts its turns from that message on.
A top-level `client:` key is ignored here: a corpus scenario (`cassettes/scenarios/`) keeps the client's
side in the same file (`recorder/scenario_file.py` checks the whole file). The model below is the format: an
unknown key or a wrong type is an error with its path (`fake_engine/scenario_model.py`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from tito_rl.fake_engine.channels.moe import MoeShape
from tito_rl.fake_engine.faults import FaultSpec
from tito_rl.fake_engine.logprobs import logprobs_for
from tito_rl.fake_engine.policies.prompt_tools import WORKDIR, offered_tools, resolve_call, with_workdir, workdir_of
from tito_rl.fake_engine.policies.qwen3_output import EOS_ID, ToolCall, render_ids
from tito_rl.fake_engine.policy import GenerateRequest, Generation, PolicyError
from tito_rl.fake_engine.scenario_model import FrozenStrict, NonNegInt, PosInt, ScenarioError, Strict, validate
from tito_rl.fake_engine.sessions import IM_END, assistant_turns_after, last_user_start, opening_end, prompt_digest


class ToolCallSpec(FrozenStrict, frozen=True):
    """A tool call: a role (`shell`, `read`, ...) or one client's tool name, with Claude Code's argument names."""

    name: str
    arguments: dict[str, Any] = {}


class ScriptedTurn(Strict):
    """What the model says in one turn (a bare string is shorthand for `text:`)."""

    reasoning: str | None = None
    text: str = ""
    tool_calls: tuple[ToolCallSpec, ...] = ()
    ids: tuple[NonNegInt, ...] | None = None  # raw token ids instead of reasoning, text and calls
    finish: Literal["stop", "length", "abort"] = "stop"
    length: NonNegInt | None = None  # finish length / abort: how many tokens are kept
    faults: FaultSpec | None = None
    fault_attempts: PosInt | None = None  # faults and a cut finish only on the turn's first N requests (None: all)


Turns = Annotated[tuple[str | ScriptedTurn, ...], msgspec.Meta(min_length=1)]


class SessionMatch(FrozenStrict, frozen=True):
    """When a scripted session plays a request (every given key must hold; none: any request)."""

    routing_key: str | None = None  # X-SMG-Routing-Key
    prompt_contains: str | None = None  # in the prompt's opening (system prompt and first user message)
    last_user_contains: str | None = None  # in the last user message; turns then count from it


class ScriptedSession(Strict):
    turns: Turns
    match: SessionMatch = msgspec.field(default_factory=SessionMatch)

    def __post_init__(self) -> None:
        self.turns = tuple(ScriptedTurn(text=t) if isinstance(t, str) else t for t in self.turns)


class Scenario(Strict):
    """The engine's script: what the model says, per session and turn."""

    name: str = ""  # default: the file's stem; also seeds the logprobs unless `seed:` is given
    description: str = ""
    seed: str = ""
    after_last: Literal["repeat", "error"] = "repeat"  # a turn past the script: repeat the last one, or a 400
    sessions: Annotated[tuple[ScriptedSession, ...], msgspec.Meta(min_length=1)] | None = None
    turns: Turns | None = None  # shorthand for one session that matches every prompt
    client: dict[str, Any] | None = None  # the client's side of a corpus scenario: not the engine's
    moe: str | None = None  # the model's MoE shape, `LAYERS,TOP_K,EXPERTS` (as --moe; the flag wins)

    def __post_init__(self) -> None:
        if self.moe is not None:
            MoeShape.parse(self.moe)  # a ValueError: reported at `moe`
        if self.turns is not None:
            if self.sessions is not None:
                raise ValueError("either `sessions` or a top-level `turns` list, not both")
            self.sessions, self.turns = (ScriptedSession(turns=self.turns),), None
        if self.sessions is None:
            raise ValueError("needs `sessions` (or a top-level `turns` list)")
        self.seed = self.seed or self.name

    @property
    def moe_shape(self) -> MoeShape | None:
        return None if self.moe is None else MoeShape.parse(self.moe)

    @property
    def played(self) -> tuple[ScriptedSession, ...]:
        """The sessions as played: `__post_init__` made the shorthand one, so there is always at least one."""
        return self.sessions or ()


def parse_scenario(data: Any, default_name: str = "scenario") -> Scenario:
    """The engine's side of a scenario (its `client:` section is only checked to be a mapping here)."""
    if isinstance(data, dict) and not data.get("name"):
        data = {**data, "name": default_name}
    return validate(data, Scenario)


def load_scenario(path: str | Path) -> Scenario:
    """The engine's side of a scenario file, or a ScenarioError `PATH: where: what` (one line)."""
    try:
        return parse_scenario(read_scenario_data(path), default_name=Path(path).stem)
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: {exc.strerror or exc}") from None


def read_scenario_data(path: str | Path) -> Any:
    """A scenario file's data (YAML, or JSON by its suffix); a file that does not parse is a ScenarioError."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ScenarioError(f"not valid JSON: {exc}") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"not valid YAML: {' '.join(str(exc).split())}") from None


class ScriptedPolicy:
    """Plays a Scenario; renders each turn in Qwen3's native format with the given tokenizer."""

    def __init__(self, scenario: Scenario, tokenizer: Any) -> None:
        self.scenario = scenario
        self.tokenizer = tokenizer
        self._openings: OrderedDict[str, str] = OrderedDict()  # opening digest -> decoded opening
        self._rendered: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()
        self._logprobs: OrderedDict[tuple[Any, ...], list[float]] = OrderedDict()
        self._attempts: dict[tuple[Any, ...], int] = {}  # (opening, session, turn) -> requests seen

    def _opening_text(self, req: GenerateRequest) -> str:
        # Keyed by the opening itself, not the session key: one routing key (the adapter's session id)
        # carries a sub-agent's or a compacted history's prompts too, and their openings differ.
        key = prompt_digest(req.input_ids)
        text = self._openings.get(key)
        if text is None:
            text = self.tokenizer.decode(req.input_ids[: opening_end(req.input_ids)])
            self._openings[key] = text
            if len(self._openings) > 4096:
                self._openings.popitem(last=False)
        return text

    def _session(self, req: GenerateRequest, opening: str) -> tuple[int, ScriptedSession, int]:
        """The session, its index and the request's turn in it."""
        for i, s in enumerate(self.scenario.played):
            match = s.match
            if match.routing_key is not None and match.routing_key != req.routing_key:
                continue
            if match.prompt_contains is not None and match.prompt_contains not in opening:
                continue
            if match.last_user_contains is not None:
                start = last_user_start(req.input_ids)
                if start is None or match.last_user_contains not in self._last_user_text(req.input_ids, start):
                    continue
                return i, s, assistant_turns_after(req.input_ids, start)
            return i, s, req.turn_index
        raise PolicyError(f"scenario {self.scenario.name!r}: no session matches this prompt", status=400)

    def _last_user_text(self, input_ids: list[int], start: int) -> str:
        try:
            end = input_ids.index(IM_END, start)
        except ValueError:
            end = len(input_ids)
        text: str = self.tokenizer.decode(input_ids[start:end])
        return text

    def _ids(self, index: tuple[int, int], turn: ScriptedTurn, opening: str) -> list[int]:
        if turn.ids is not None:
            return list(turn.ids)
        offered = offered_tools(opening) if turn.tool_calls else []
        workdir = (
            workdir_of(opening)
            if turn.tool_calls and WORKDIR in json.dumps([c.arguments for c in turn.tool_calls])
            else None
        )
        try:
            calls = [
                ToolCall(*resolve_call(c.name, with_workdir(c.arguments, workdir), offered)) for c in turn.tool_calls
            ]
        except ValueError as exc:
            raise PolicyError(f"scenario {self.scenario.name!r}: {exc}", status=400) from None
        key = (*index, tuple((c.name, json.dumps(c.arguments, sort_keys=True)) for c in calls))
        ids = self._rendered.get(key)
        if ids is None:
            ids = render_ids(self.tokenizer, turn.reasoning, turn.text, calls, stop=True)
            self._rendered[key] = ids
            if len(self._rendered) > 4096:
                self._rendered.popitem(last=False)
        return list(ids)

    def generate(self, req: GenerateRequest) -> Generation:
        opening = self._opening_text(req)
        s_index, session, t_index = self._session(req, opening)
        if t_index >= len(session.turns):
            if self.scenario.after_last == "error":
                raise PolicyError(
                    f"scenario {self.scenario.name!r}: session {s_index} has no turn {t_index} "
                    f"(it scripts {len(session.turns)})",
                    status=400,
                )
            t_index = len(session.turns) - 1
        turn = session.turns[t_index]
        assert isinstance(turn, ScriptedTurn)  # ScriptedSession.__post_init__ made every text one
        faults, finish = turn.faults, turn.finish
        if turn.fault_attempts is not None:
            key = (prompt_digest(req.input_ids), s_index, req.turn_index)
            self._attempts[key] = seen = self._attempts.get(key, 0) + 1
            if seen > turn.fault_attempts:  # a cut finish is a fault too: the re-request gets the whole turn
                faults, finish = None, "stop"
        ids = self._ids((s_index, t_index), turn, opening)
        if finish != "stop":
            if ids and ids[-1] == EOS_ID:
                ids = ids[:-1]
            keep = turn.length if turn.length is not None else (len(ids) if finish == "length" else len(ids) // 2)
            ids = ids[:keep]
        lps_key = (req.session_key, req.turn_index, tuple(ids))
        lps = self._logprobs.get(lps_key)
        if lps is None:
            lps = logprobs_for(self.scenario.seed, req.session_key, req.turn_index, ids)
            self._logprobs[lps_key] = lps
            if len(self._logprobs) > 4096:
                self._logprobs.popitem(last=False)
        lps = list(lps)
        return Generation(output_ids=ids, logprobs=lps, finish=finish, faults=faults)
