"""Which agent exchange an engine call serves, when the taps sit outside the target.

tito's own adapter tells its tap exactly; a foreign gateway only forwards calls. The rule, in order:

1. The routing key. A gateway that forwards the session id in a header (`X-SMG-Routing-Key` for slime and
   SGLang's router; a driver may name another) has its calls attributed to that session. Within the session,
   with one request in flight the call is that request's; with several (a sub-agent beside the main agent,
   two sub-agents at once), by what the call carries: its prompt (the ids decoded, or its messages' text) holds
   the text of one request's messages and not of the others' (`by_content`), so the call is that request's
   whatever order a gateway's threads make the calls in. Failing that (requests alike), the oldest request in
   flight that has not had a generation yet, else the newest in flight (a retry inside one request).
2. `/abort_request {"rid"}` goes to the exchange whose `/generate` carried that rid.
3. No routing key, a generation (any dialect: `/generate`, `/v1/chat/completions`, `/v1/completions`,
   `/inference/v1/generate`): first narrowed to the requests in flight whose agent sent the `Authorization`
   the engine call carries (gateways that forward the agent's headers, as rllm's does, tie a call to its
   session that way when each agent run has its own key); then, for a messages-in call, the request whose
   body's `messages` the call carries unchanged (a gateway that forwards the agent's chat request); then, for
   a call with prompt ids, the session whose last engine context (prompt + output) the prompt extends
   furthest (within that session, by what the call carries, as in rule 1); then, among up to 16 requests in
   flight, the one whose text the call's prompt holds; then the oldest request in flight that has not had a
   generation yet. Concurrent sessions with identical first prompts and one shared key are told apart only by
   arrival order: a gateway that forwards a routing key never depends on it.
Calls of no session (health checks, `/model_info`, `/v1/models`; without a routing key, anything but a
generation and its abort) are forwarded and not recorded. An agent request that names no session (tracked
under `NO_SESSION`) is never a candidate of rule 3 but by its messages: a generation whose messages are that
request's, unchanged, is its, and is forwarded and not recorded.

Each agent exchange's engine calls are written just before it, as tito's adapter writes them, so a replay
finds each call where the live run made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tito_rl.cassette.format.packing import pack_u32, packed_prefix_len
from tito_rl.trajectory.adapters.engine import fast_json
from tito_rl.trajectory.adapters.tap import EngineExchange
from tito_rl.trajectory.dialects.registry import is_generation, view_of

MAX_REMEMBERED_RIDS = 4096
NO_SESSION = ""  # the flights of agent requests that name no session: never recorded
# Where an agent request's text is, in any wire (Anthropic, OpenAI chat and Responses, Gemini), and what is left
# out: reasoning (templates drop earlier turns' thinking), tool definitions (alike across requests), signatures.
TEXT_KEYS = frozenset({"text", "content", "system", "instructions", "input", "output", "prompt"})
NOT_TEXT_KEYS = frozenset(
    {"thinking", "reasoning", "reasoning_content", "signature", "encrypted_content", "tools", "metadata"}
)
# What says whose a call is, read cheaply on a long session: a request's first lines (its system prompt) and its
# last (its newest messages), sought in the call's first and last tokens, where a template renders them.
HEAD_LINES, TAIL_LINES = 32, 64
HEAD_TOKENS, TAIL_TOKENS = 2048, 2048
MAX_READ_FLIGHTS = 16  # without a routing key, first turns of more sessions at once go by the order rule (its cost)
Decode = Callable[[list[int]], str]


@dataclass(eq=False)
class InFlight:
    """One agent request between its arrival at the agent tap and the write of its exchange."""

    number: int
    session: str  # the live id
    source: str
    arrived: float  # monotonic
    generates: int = 0
    engine: list[EngineExchange] = field(default_factory=list)  # answered calls, in answer order
    running: set[asyncio.Future[Any]] = field(default_factory=set)  # calls still waiting on the engine
    authorization: str | None = None  # the agent's Authorization header, as a gateway may forward it
    body: bytes = b""  # the agent's request body, parsed only when a rule needs its messages or text
    _messages: Any = None
    _lines: list[str] | None = None

    def _data(self) -> Any:
        try:
            return fast_json.loads(self.body) if self.body else None
        except ValueError:
            return None

    def messages(self) -> Any:
        if self._messages is None:
            data = self._data()
            self._messages = (data.get("messages") if isinstance(data, dict) else None) or ()
        return self._messages

    def lines(self) -> list[str]:
        """The request's first and last lines of text (its system prompt, its newest messages)."""
        if self._lines is None:
            found = request_lines(self._data())
            head = min(HEAD_LINES, len(found))
            self._lines = found[:head] + found[max(head, len(found) - TAIL_LINES) :]
        return self._lines


@dataclass
class Owner:
    """What an engine call was attributed to: an exchange in flight, or only a session (none in flight)."""

    session: str
    source: str
    flight: InFlight | None = None


class Attribution:
    """`decode`: prompt ids to text, to tell apart a session's requests in flight by what a call carries (rule 1);
    None leaves calls with only ids to the order rule."""

    def __init__(self, routing_header: str | None, decode: Decode | None = None) -> None:
        self.routing_header = routing_header.lower() if routing_header else None
        self.decode = decode
        self._numbers = itertools.count()
        self.flights: dict[str, list[InFlight]] = {}  # live session id -> requests in flight, in arrival order
        self.sources: dict[str, str] = {}
        self._contexts: dict[str, bytes] = {}  # live session id -> packed last prompt + output
        self._rids: OrderedDict[str, Owner] = OrderedDict()

    # the agent tap's side

    def begin(self, session: str, source: str, authorization: str | None = None, body: bytes = b"") -> InFlight:
        flight = InFlight(
            next(self._numbers), session, source, time.monotonic(), authorization=authorization, body=body
        )
        self.flights.setdefault(session, []).append(flight)
        self.sources.setdefault(session, source)
        return flight

    def end(self, flight: InFlight) -> None:
        flights = self.flights.get(flight.session, [])
        if flight in flights:
            flights.remove(flight)
        if not flights:
            self.flights.pop(flight.session, None)

    # the engine tap's side

    def owner(self, path: str, headers: Mapping[str, str], body: Any) -> Owner | None:
        """The exchange (or session) an engine call serves; None for calls of no session."""
        if path.endswith("/abort_request") and isinstance(body, dict):
            found = self._rids.get(str(body.get("rid")))
            if found is not None:
                return found
        session = self._routing_key(headers)
        if session is not None and session != NO_SESSION:
            flights = self.flights.get(session, [])
            flight = self.by_content(path, body, flights) if len(flights) > 1 and is_generation(path) else None
            return Owner(session, self.sources.get(session, "bearer"), flight or self._pick(flights))
        if not is_generation(path):
            return None  # without a routing key only a generation says whose it is
        loose = self.flights.get(NO_SESSION, [])
        flights = [f for s, fs in self.flights.items() if s != NO_SESSION for f in fs]
        messages = body.get("messages") if isinstance(body, dict) else None
        if loose and isinstance(messages, list) and messages and not any(f.messages() == messages for f in flights):
            mine = [f for f in loose if f.messages() == messages]
            if mine:
                return Owner(NO_SESSION, "none", mine[0])
        authorization = header_value(headers, "authorization")
        if authorization is not None:
            flights = [f for f in flights if f.authorization == authorization] or flights
        flight = None
        if isinstance(messages, list) and messages:
            same = [f for f in flights if f.messages() == messages]
            flight = self._pick(same)
        if flight is None:
            prompt = view_of(None, path, body, None).prompt_ids if isinstance(body, dict) else None
            extended = self._by_context(prompt, flights) if prompt else None
            if extended:
                flight = (self.by_content(path, body, extended) if len(extended) > 1 else None) or self._pick(extended)
        if flight is None and 1 < len(flights) <= MAX_READ_FLIGHTS:
            flight = self.by_content(path, body, flights)
        if flight is None:
            flight = self._pick(flights, oldest_only=True)
        if flight is None:
            return None
        return Owner(flight.session, flight.source, flight)

    def generate_started(self, owner: Owner, body: Any) -> None:
        if owner.flight is not None:
            owner.flight.generates += 1
        if isinstance(body, dict) and body.get("rid") is not None:
            self._rids[str(body["rid"])] = owner
            while len(self._rids) > MAX_REMEMBERED_RIDS:
                self._rids.popitem(last=False)

    def generate_answered(self, owner: Owner, path: str, body: Any, response: Any, dialect: str | None) -> None:
        """Remember the session's engine context, for rule 3."""
        view = view_of(dialect, path, body, response)
        prompt, output = view.prompt_ids, view.output_ids
        if prompt is not None and output is not None:
            with contextlib.suppress(TypeError, OverflowError):
                self._contexts[owner.session] = pack_u32(prompt) + pack_u32(output)

    def forget(self, session: str) -> None:
        """A finished or dropped session: its context can no longer be extended."""
        self._contexts.pop(session, None)

    def _routing_key(self, headers: Mapping[str, str]) -> str | None:
        return header_value(headers, self.routing_header) if self.routing_header is not None else None

    @staticmethod
    def _pick(flights: list[InFlight], oldest_only: bool = False) -> InFlight | None:
        waiting = [f for f in flights if f.generates == 0]
        if waiting:
            return min(waiting, key=lambda f: f.number)
        if oldest_only or not flights:
            return None
        return max(flights, key=lambda f: f.number)

    def by_content(self, path: str, body: Any, flights: list[InFlight]) -> InFlight | None:
        """The one request in flight whose text the call's prompt holds: each request scores the length of its
        lines found in the prompt less the length of those not found (another conversation's system prompt and
        messages are not there); None when no request scores above zero or two score the same (alike requests:
        the order rule decides)."""
        text = self.call_text(path, body)
        if not text:
            return None
        scores = []
        for flight in flights:
            found = missing = 0
            for line in flight.lines():
                if line in text:
                    found += len(line)
                else:
                    missing += len(line)
            scores.append((found - missing, flight))
        scores.sort(key=lambda pair: -pair[0])
        if not scores or scores[0][0] <= 0 or (len(scores) > 1 and scores[1][0] == scores[0][0]):
            return None
        return scores[0][1]

    def call_text(self, path: str, body: Any) -> str | None:
        """What an engine call asks, as text: its prompt ids decoded (the first and last tokens of a long one),
        else its messages' text; None for neither."""
        if not isinstance(body, dict):
            return None
        ids = view_of(None, path, body, None).prompt_ids
        if ids is not None and self.decode is not None:
            ids = list(ids)
            parts = [ids] if len(ids) <= HEAD_TOKENS + TAIL_TOKENS else [ids[:HEAD_TOKENS], ids[-TAIL_TOKENS:]]
            try:
                return "\n".join(self.decode(part) for part in parts)
            except Exception:  # noqa: BLE001 - ids the tokenizer cannot read leave the call to the order rule
                return None
        messages = body.get("messages")
        return "\n".join(request_lines({"messages": messages})) if isinstance(messages, list) else None

    def _by_context(self, prompt: list[int], candidates: list[InFlight]) -> list[InFlight] | None:
        try:
            packed = pack_u32(prompt)
        except (TypeError, OverflowError):
            return None
        best, best_len = None, 0
        for session in dict.fromkeys(f.session for f in candidates):
            flights = self.flights.get(session)
            context = self._contexts.get(session)
            if not context or not flights:
                continue
            common = packed_prefix_len(context, packed)
            if common * 4 == len(context) and common > best_len:  # the prompt extends that session's context
                best, best_len = session, common
        return None if best is None else self.flights[best]


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value, stripped, by its name in any case; None when absent or blank."""
    name = name.lower()
    for key, value in headers.items():
        if key.lower() == name and value.strip():
            return value.strip()
    return None


def request_lines(data: Any) -> list[str]:
    """The text of an agent request (or an engine call's messages) in any wire, line by line, stripped, in order:
    the strings under `TEXT_KEYS` at any depth, reasoning, tool definitions and signatures left out."""
    lines: list[str] = []

    def walk(value: Any, text: bool) -> None:
        if isinstance(value, str):
            if text:
                lines.extend(line for line in (part.strip() for part in value.splitlines()) if line)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key not in NOT_TEXT_KEYS:
                    walk(item, key in TEXT_KEYS or (text and key == "parts"))
        elif isinstance(value, list):
            for item in value:
                walk(item, text)

    if isinstance(data, dict):
        for key in ("system", "systemInstruction", "instructions", "messages", "contents", "input"):
            if key in data:
                walk(data[key], True)
    return lines
