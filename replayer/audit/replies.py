"""What the agent reads against what the engine said: `stop-token-leak`, `tool-call-lost`, `text-dropped`,
`status-changed`.

The reply is read as the agent reads it (`replayer/comparison/reply_meaning.py`, every wire); the engine output
is parsed as tito's parsers split it (Qwen3 reasoning in `<think>`, Qwen2.5 tool calls in `<tool_call>` JSON), or
taken as the engine's own parse where the engine rendered the chat (messages-in dialects).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tito_rl.replayer.audit.protocol import SPECIAL_IDS, Example, Findings, Side, clip, decode, special_texts
from tito_rl.replayer.audit.traffic import Call, Exchange, RuleFamily, SessionState
from tito_rl.replayer.comparison.reply_meaning import Meaning, meaning

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
THINK = re.compile(r"^.*?</think>|<think>.*?</think>", re.DOTALL)
SPACE = re.compile(r"\s+")


@dataclass
class Parsed:
    """An engine output as an agent should get it: content text and tool calls (name, arguments)."""

    text: str
    tool_calls: list[tuple[str, Any]] = field(default_factory=list)


def parse_output(call: Call, specials: tuple[str, ...]) -> Parsed:
    view = call.view
    if view.messages_in and (view.tool_calls is not None or view.text is not None):
        calls = [
            (str((c.get("function") or c).get("name")), (c.get("function") or c).get("arguments"))
            for c in view.tool_calls or []
        ]
        return Parsed(_plain(view.text or "", specials), calls)
    text = view.text if view.text is not None else decode(call.output)
    if "</think>" in text:
        text = THINK.sub("", text, count=1)
    elif "<think>" in text:  # cut inside its reasoning (a `length` stop): all reasoning, no content
        text = text[: text.index("<think>")]
    calls = []
    for body in TOOL_CALL.findall(text):
        try:
            value = json.loads(body)
        except ValueError:
            continue  # a malformed call stays text, as the parser leaves it
        if isinstance(value, dict) and isinstance(value.get("name"), str):
            calls.append((value["name"], value.get("arguments")))
            text = text.replace(f"<tool_call>{body}</tool_call>", "", 1)
    text = TOOL_CALL.sub(lambda m: "" if _parses(m.group(1)) else m.group(0), text)
    return Parsed(_plain(text, specials), calls)


def _parses(body: str) -> bool:
    try:
        value = json.loads(body)
    except ValueError:
        return False
    return isinstance(value, dict) and isinstance(value.get("name"), str)


def _plain(text: str, specials: tuple[str, ...]) -> str:
    for special in specials:
        text = text.replace(special, "")
    return text.strip()


CLIENT_GONE = 499  # what a recording says of an exchange whose agent hung up before its reply


def status_class(status: int) -> str:
    """What a client does with a status: retry it as overload, give up on it as an error, and so on."""
    if status == 0:
        return "no answer"
    if 200 <= status < 300:
        return "success"
    if status in (429, 503, 529):
        return "overloaded"
    if status in (408, 504):
        return "timeout"
    if 400 <= status < 500:
        return "client error"
    return "server error"


class Replies(RuleFamily):
    rules = ("stop-token-leak", "tool-call-lost", "text-dropped", "status-changed")

    def __init__(self, findings: Findings) -> None:
        self.findings = findings
        self._specials: tuple[str, ...] | None = None
        self._first_chars: frozenset[str] = frozenset()  # the specials' first characters, read with them

    @property
    def specials(self) -> tuple[str, ...]:
        if self._specials is None:
            self._specials = special_texts()
            self._first_chars = frozenset(s[0] for s in self._specials if s)
        return self._specials

    def exchange(self, state: SessionState, exchange: Exchange) -> None:
        record = exchange.record
        assert record is not None
        self._status(state, exchange)
        if record.status != 200 or record.method != "POST":
            return
        read = meaning(record.path, record.status, record.reply_body, record.reply_events)
        self._leak(state, exchange, read)
        answer = exchange.answer
        if answer is None:
            return
        parsed = parse_output(answer, self.specials)
        lost = len(parsed.tool_calls) - len(read.tool_calls)
        if lost > 0:
            self.findings.add(
                "tool-call-lost",
                state.name,
                lost,
                None,
                self._example(
                    "tool-call-lost",
                    state,
                    exchange,
                    answer,
                    f"the engine output holds {len(parsed.tool_calls)} tool call(s), the reply {len(read.tool_calls)}",
                    _calls(parsed.tool_calls),
                    _calls(read.tool_calls),
                ),
            )
        if parsed.text and SPACE.sub(" ", parsed.text) not in SPACE.sub(" ", _plain(read.text, self.specials)):
            self.findings.add(
                "text-dropped",
                state.name,
                1,
                None,
                self._example(
                    "text-dropped",
                    state,
                    exchange,
                    answer,
                    "the engine output's text is not in the reply",
                    clip(parsed.text),
                    clip(read.text),
                ),
            )

    def _leak(self, state: SessionState, exchange: Exchange, read: Meaning) -> None:
        shown = [read.text, read.reasoning, *(json.dumps(a, ensure_ascii=False) for _, a in read.tool_calls)]
        specials = self.specials  # reads `_first_chars` with them
        if not any(c in text for c in self._first_chars for text in shown):  # most replies: one scan each
            return
        found = [s for s in specials if any(s in text for text in shown)]
        if not found:
            return
        example = None
        if self.findings.wants_example("stop-token-leak"):
            answer = exchange.answer
            text = next(t for t in shown if any(s in t for s in found))
            at = text.index(found[0])
            index, engine = None, ""
            if answer is not None:
                hits = np.flatnonzero(np.isin(answer.output, np.array(SPECIAL_IDS, dtype=answer.output.dtype)))
                index = int(hits[0]) if len(hits) else None
                engine = clip(decode(answer.output[max(0, (index or 0) - 16) : (index or 0) + 1]), tail=True)
            example = Example(
                state.name,
                exchange.index,
                exchange.seq,
                index,
                f"the reply shows {', '.join(found)}"
                + (f" (engine output token {index})" if index is not None else ""),
                [
                    Side("engine output", engine),
                    Side("reply text", clip(text[max(0, at - 60) : at + len(found[0])], tail=True)),
                ],
            )
        self.findings.add("stop-token-leak", state.name, 1, found[0], example)

    def _status(self, state: SessionState, exchange: Exchange) -> None:
        generating = [c for c in exchange.calls if c.generates]
        if not generating or not generating[-1].failed or exchange.record is None:
            return
        engine = generating[-1]
        agent = exchange.record.status
        if agent == CLIENT_GONE or status_class(engine.status) == status_class(agent):
            return  # an agent that went away got no status; its call dropped (vLLM's abort) is no engine error
        example = None
        if self.findings.wants_example("status-changed"):
            body = (exchange.record.reply_body or b"")[:80].decode("utf-8", "replace")
            example = Example(
                state.name,
                exchange.index,
                exchange.seq,
                None,
                f"engine {engine.status} ({status_class(engine.status)}) reaches the agent as {agent} "
                f"({status_class(agent)})",
                [
                    Side("engine", f"{engine.status} {clip(engine.error or '')}".strip()),
                    Side("agent", f"{agent} {clip(body)}".strip()),
                ],
            )
        self.findings.add("status-changed", state.name, 1, f"{engine.status} → {agent}", example)

    def _example(
        self, rule: str, state: SessionState, exchange: Exchange, answer: Call, detail: str, engine: str, reply: str
    ) -> Example | None:
        if not self.findings.wants_example(rule):
            return None
        return Example(
            state.name,
            exchange.index,
            exchange.seq,
            None,
            detail,
            [Side(f"engine output (seq {answer.seq})", engine), Side("reply", reply)],
        )


def _calls(calls: list[tuple[str, Any]]) -> str:
    return (
        "[" + ", ".join(f"{n}({clip(json.dumps(a, ensure_ascii=False, sort_keys=True), 50)})" for n, a in calls) + "]"
    )
