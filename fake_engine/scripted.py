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
A top-level `client:` key is ignored here: a corpus scenario (`cassettes/scenarios/`) keeps the scripted
agent client's side in the same file (`recorder/scripted/script.py`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fake_engine.faults import FaultSpec
from fake_engine.logprobs import logprobs_for
from fake_engine.policy import GenerateRequest, Generation, PolicyError
from fake_engine.prompt_tools import WORKDIR, offered_tools, resolve_call, with_workdir, workdir_of
from fake_engine.qwen3_output import EOS_ID, ToolCall, render_ids
from fake_engine.sessions import IM_END, assistant_turns_after, last_user_start, opening_end, prompt_digest

TURN_KEYS = {"reasoning", "text", "tool_calls", "ids", "finish", "length", "faults", "fault_attempts"}
SESSION_KEYS = {"match", "turns"}
MATCH_KEYS = {"routing_key", "prompt_contains", "last_user_contains"}
SCENARIO_KEYS = {"name", "seed", "after_last", "sessions", "turns", "description", "client"}


@dataclass(frozen=True)
class ScriptedTurn:
    reasoning: str | None = None
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    ids: tuple[int, ...] | None = None
    finish: str = "stop"
    length: int | None = None  # finish length / abort: how many tokens are kept
    faults: FaultSpec | None = None
    fault_attempts: int | None = None  # faults and a cut finish only on the turn's first N requests (None: all)


@dataclass(frozen=True)
class ScriptedSession:
    turns: tuple[ScriptedTurn, ...]
    routing_key: str | None = None
    prompt_contains: str | None = None
    last_user_contains: str | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    sessions: tuple[ScriptedSession, ...]
    seed: str = ""
    after_last: str = "repeat"  # repeat the last turn, or "error"
    extra: dict[str, Any] = field(default_factory=dict)


def strict_mapping(where: str, data: Any, allowed: set[str]) -> dict[str, Any]:
    """`data` as a mapping with only `allowed` keys, else a ValueError naming `where`: scenario files (the
    engine's script and the client: sections in recorder/) are parsed strictly, so a typo is an error."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")
    return data


def _parse_turn(where: str, data: Any) -> ScriptedTurn:
    if isinstance(data, str):
        data = {"text": data}
    d = strict_mapping(where, data, TURN_KEYS)
    calls = []
    for j, c in enumerate(d.get("tool_calls") or []):
        c = strict_mapping(f"{where}.tool_calls[{j}]", c, {"name", "arguments"})
        if not isinstance(c.get("name"), str):
            raise ValueError(f"{where}.tool_calls[{j}]: name must be a string")
        args = c.get("arguments") or {}
        if not isinstance(args, dict):
            raise ValueError(f"{where}.tool_calls[{j}]: arguments must be a mapping")
        calls.append(ToolCall(c["name"], args))
    ids = d.get("ids")
    if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids)):
        raise ValueError(f"{where}.ids: must be a list of non-negative integers")
    finish = d.get("finish", "stop")
    if finish not in ("stop", "length", "abort"):
        raise ValueError(f"{where}.finish: must be stop, length or abort, got {finish!r}")
    reasoning = d.get("reasoning")
    attempts = d.get("fault_attempts")
    if attempts is not None and (not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1):
        raise ValueError(f"{where}.fault_attempts: must be a positive integer, got {attempts!r}")
    return ScriptedTurn(
        reasoning=None if reasoning is None else str(reasoning), text=str(d.get("text") or ""),
        tool_calls=tuple(calls), ids=None if ids is None else tuple(ids), finish=finish,
        length=d.get("length"), faults=FaultSpec.from_dict(d.get("faults")) if d.get("faults") else None,
        fault_attempts=attempts,
    )


def parse_scenario(data: Any, default_name: str = "scenario") -> Scenario:
    d = strict_mapping("scenario", data, SCENARIO_KEYS)
    raw_sessions = d.get("sessions")
    if raw_sessions is None and "turns" in d:
        raw_sessions = [{"turns": d["turns"]}]
    if not raw_sessions:
        raise ValueError("scenario: needs `sessions` (or a top-level `turns` list)")
    sessions = []
    for i, s in enumerate(raw_sessions):
        s = strict_mapping(f"sessions[{i}]", s, SESSION_KEYS)
        match = strict_mapping(f"sessions[{i}].match", s.get("match") or {}, MATCH_KEYS)
        turns = s.get("turns")
        if not isinstance(turns, list) or not turns:
            raise ValueError(f"sessions[{i}].turns: needs at least one turn")
        sessions.append(ScriptedSession(
            turns=tuple(_parse_turn(f"sessions[{i}].turns[{j}]", t) for j, t in enumerate(turns)),
            routing_key=match.get("routing_key"), prompt_contains=match.get("prompt_contains"),
            last_user_contains=match.get("last_user_contains")))
    after_last = d.get("after_last", "repeat")
    if after_last not in ("repeat", "error"):
        raise ValueError(f"scenario.after_last: must be repeat or error, got {after_last!r}")
    name = str(d.get("name") or default_name)
    return Scenario(name=name, sessions=tuple(sessions), seed=str(d.get("seed") or name), after_last=after_last)


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    return parse_scenario(data, default_name=path.stem)


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
        for i, s in enumerate(self.scenario.sessions):
            if s.routing_key is not None and s.routing_key != req.routing_key:
                continue
            if s.prompt_contains is not None and s.prompt_contains not in opening:
                continue
            if s.last_user_contains is not None:
                start = last_user_start(req.input_ids)
                if start is None or s.last_user_contains not in self._last_user_text(req.input_ids, start):
                    continue
                return i, s, assistant_turns_after(req.input_ids, start)
            return i, s, req.turn_index
        raise PolicyError(f"scenario {self.scenario.name!r}: no session matches this prompt", status=400)

    def _last_user_text(self, input_ids: list[int], start: int) -> str:
        try:
            end = input_ids.index(IM_END, start)
        except ValueError:
            end = len(input_ids)
        return self.tokenizer.decode(input_ids[start:end])

    def _ids(self, index: tuple[int, int], turn: ScriptedTurn, opening: str) -> list[int]:
        if turn.ids is not None:
            return list(turn.ids)
        offered = offered_tools(opening) if turn.tool_calls else []
        workdir = workdir_of(opening) if turn.tool_calls and WORKDIR in json.dumps(
            [c.arguments for c in turn.tool_calls]) else None
        try:
            calls = [ToolCall(*resolve_call(c.name, with_workdir(c.arguments, workdir), offered))
                     for c in turn.tool_calls]
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
                raise PolicyError(f"scenario {self.scenario.name!r}: session {s_index} has no turn {t_index} "
                                  f"(it scripts {len(session.turns)})", status=400)
            t_index = len(session.turns) - 1
        turn = session.turns[t_index]
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
            keep = turn.length if turn.length is not None else (len(ids) if finish == "length"
                                                                 else len(ids) // 2)
            ids = ids[:keep]
        lps_key = (req.session_key, req.turn_index, tuple(ids))
        lps = self._logprobs.get(lps_key)
        if lps is None:
            lps = logprobs_for(self.scenario.seed, req.session_key, req.turn_index, ids)
            self._logprobs[lps_key] = lps
            if len(self._logprobs) > 4096:
                self._logprobs.popitem(last=False)
        lps = list(lps)
        return Generation(output_ids=ids, logprobs=lps, finish=finish,  # type: ignore[arg-type]
                          faults=faults)
