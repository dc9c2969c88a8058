"""The rules' shared vocabulary: the table of rule ids, what a finding is (a count per session, its kinds, its
first examples with both sides' decoded text), a session's token figures, and decoding for examples. How a rule
family is fed the cassette is `traffic.RuleFamily`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
EXAMPLES = 3  # first examples kept per rule and cassette: enough to act on, few enough to read

# Each rule's id and one line on what it says; the order is the report's.
RULES: dict[str, str] = {
    "coverage": "emitted tokens not trained exactly once with the engine's logprob (a session's coverage below 1)",
    "trained-twice": "an emitted token, or a turn, trained more than once",
    "never-trained": "an emitted token of an agent turn no sample trains",
    "trained-not-emitted": "a trained token the engine never sampled: context trained as if the model said it",
    "logprob-mismatch": "a trained token whose logprob is not the one the engine returned",
    "missing-logprobs": "a generation, or a trained token, without the engine's logprob",
    "prefix-break": "an engine prompt that does not extend the prompt and output it follows",
    "stop-token-leak": "a special token (<|im_end|>...) in text the agent reads",
    "tool-call-lost": "the engine output holds more tool calls than the reply carries",
    "text-dropped": "the engine output holds text the reply does not carry",
    "sampling-override": "the client's max tokens, temperature, top_p or stop changed on the way to the engine",
    "status-changed": "an engine error reaches the agent as another class of status",
    "regenerated-retry": "an identical re-send of an answered request generated again",
    # the per-token channels (`audit.channels`): expert routes, top-p kept sets, weight versions
    "routes-never-asked": "a generation that did not ask for expert routes from an engine that serves them",
    "routes-missing": "expert routes the engine sent (or was asked for) missing from the answer or the sample",
    "routes-misaligned": "route rows not one per token but the last (len(tokens) - 1, from routed_experts_start_len)",
    "routes-differ": "a sample's route row other than the engine's for that token",
    "routes-invalid": "a route row with an expert id out of range or repeated, or expert 0 padding where -1 is meant",
    "kept-set-invalid": "top-p kept-set offsets not response length + 1, or a sampled token outside its kept set",
    "stale-tokens": "a sample whose tokens span more weight versions than --max-staleness allows",
    "version-uncovered": "an output token no weight-version span covers",
    "aborted-by-update": "a generation aborted by a weight update (abort_all_requests), a session's or engine-wide",
    "version-not-current": "an output token of a weight version other than the one the recorded updates made current",
}
# What a rule's count counts (`RuleResult.total`, and the summary's figures).
UNITS: dict[str, str] = {
    "coverage": "token(s)",
    "trained-twice": "token(s)",
    "never-trained": "token(s)",
    "trained-not-emitted": "token(s)",
    "logprob-mismatch": "token(s)",
    "missing-logprobs": "token(s)",
    "prefix-break": "engine prompt(s)",
    "stop-token-leak": "reply(ies)",
    "tool-call-lost": "tool call(s)",
    "text-dropped": "reply(ies)",
    "sampling-override": "override(s)",
    "status-changed": "reply(ies)",
    "regenerated-retry": "re-send(s)",
    "routes-never-asked": "engine call(s)",
    "routes-missing": "route row(s)",
    "routes-misaligned": "route array(s)",
    "routes-differ": "route row(s)",
    "routes-invalid": "route row(s)",
    "kept-set-invalid": "kept set(s)",
    "stale-tokens": "sample(s)",
    "version-uncovered": "token(s)",
    "aborted-by-update": "aborted call(s)",
    "version-not-current": "token(s)",
}
# The channel rules are listed in a report (JSON, text, HTML) once a cassette of it carries a channel
# (`Findings.channels`): a report of recordings without any is the same bytes as before these rules existed.
CHANNEL_RULES = tuple(RULES)[tuple(RULES).index("routes-never-asked") :]
DEFAULT_FAIL_ON = ("trained-twice", "trained-not-emitted", "logprob-mismatch")


@dataclass
class Side:
    """One side of an example: what it is (`engine output`, `reply text`, `sample`...) and its decoded text."""

    label: str
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "text": self.text}


@dataclass
class Example:
    """Where a finding is: the session, the agent exchange (index among the session's agent exchanges) or
    None, the record's seq, the token index (in the engine output, the prompt or the sample it names), and what
    each side holds there."""

    session: str
    exchange: int | None
    seq: int | None
    token: int | None
    detail: str
    sides: list[Side] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "exchange": self.exchange,
            "seq": self.seq,
            "token": self.token,
            "detail": self.detail,
            "sides": [s.to_dict() for s in self.sides],
        }


@dataclass
class RuleResult:
    """One rule over one cassette: its count in all and per session, its first examples, and its kinds (a
    prefix break's kind, a never-trained token's reason) where it has them."""

    rule: str
    total: int = 0
    sessions: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    examples: list[Example] = field(default_factory=list)
    allowed: str | None = None  # the allowlist's reason, when this cassette expects the rule

    @property
    def fired(self) -> bool:
        return self.total > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "total": self.total,
            "sessions": dict(self.sessions),
            "kinds": dict(sorted(self.kinds.items())),
            "allowed": self.allowed,
            "examples": [e.to_dict() for e in self.examples],
        }


@dataclass
class SessionFigures:
    """A session's token accounting: what the engine emitted for its turns, what was trained exactly once with
    the engine's logprob, and what is set aside (side requests, aborted calls, a dropped session)."""

    session: str
    exchanges: int = 0
    engine_calls: int = 0
    finished: bool = False
    emitted: int = 0
    covered: int = 0
    side_tokens: int = 0
    aborted_tokens: int = 0
    dropped_tokens: int = 0

    @property
    def coverage(self) -> float | None:
        return self.covered / self.emitted if self.finished and self.emitted else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "exchanges": self.exchanges,
            "engine_calls": self.engine_calls,
            "finished": self.finished,
            "emitted": self.emitted,
            "covered": self.covered,
            "coverage": self.coverage,
            "side_tokens": self.side_tokens,
            "aborted_tokens": self.aborted_tokens,
            "dropped_tokens": self.dropped_tokens,
        }


def shown_rules(channels: bool) -> tuple[str, ...]:
    """The rules a report lists: every one, the channel rules only where a cassette of it carries channels."""
    return tuple(RULES) if channels else tuple(r for r in RULES if r not in CHANNEL_RULES)


class Findings:
    """Every rule's result for one cassette, and its sessions' figures; rules add to it as the file streams."""

    def __init__(self) -> None:
        self.rules = {rule: RuleResult(rule) for rule in RULES}
        self.figures: dict[str, SessionFigures] = {}
        self.channels = False  # a per-token channel was seen (routes, kept sets, a weight update...)

    def figure(self, session: str) -> SessionFigures:
        found = self.figures.get(session)
        if found is None:
            found = self.figures[session] = SessionFigures(session)
        return found

    def wants_example(self, rule: str) -> bool:
        """Whether an example of `rule` would be kept: decoding text costs, so a rule asks before it decodes."""
        return len(self.rules[rule].examples) < EXAMPLES

    def add(self, rule: str, session: str, count: int, kind: str | None = None, example: Example | None = None) -> None:
        result = self.rules[rule]
        if count <= 0:
            return
        if rule in CHANNEL_RULES:
            self.channels = True
        result.total += count
        result.sessions[session] = result.sessions.get(session, 0) + count
        if kind is not None:
            result.kinds[kind] = result.kinds.get(kind, 0) + count
        if example is not None and len(result.examples) < EXAMPLES:
            result.examples.append(example)


SPECIAL_IDS = range(151643, 151657)  # Qwen's special tokens: <|endoftext|>, <|im_start|>, <|im_end|>, ...
STOP_IDS = (151643, 151645)  # <|endoftext|>, <|im_end|>


def tokenizer() -> Any:
    """tito's tokenizer (the embedded Qwen3 one), loaded once when an example is first decoded."""
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    return load_tokenizer()


def decode(ids: Any) -> str:
    """Token ids as text, special tokens kept (they are often the finding)."""
    text: str = tokenizer().decode([int(i) for i in ids], skip_special_tokens=False)
    return text


def special_texts() -> tuple[str, ...]:
    return tuple(decode([i]) for i in SPECIAL_IDS)


def clip(text: str, limit: int = 80, tail: bool = False) -> str:
    """A decoded piece cut for an example: its start (or, `tail`, its end) with an ellipsis where cut."""
    if len(text) <= limit:
        return text
    return "…" + text[-limit:] if tail else text[:limit] + "…"


# ---- findings made in parts (`tito audit -j`: a cassette's sessions audited as work units) ----

Moment = tuple[int, int, int]
"""When one pass over the whole cassette would make a finding: (0, the byte offset of the record it is fed) or (1,
the byte offset of the session's first record) at the cassette's end, then its place among that moment's findings.
The merge of parts sorts by it, so what one pass decides by order (a rule's first examples, the order of its
sessions and of the sessions' figures) comes out the same."""


class TimedFindings(Findings):
    """Findings that note the `Moment` each session's figures, each rule's first count for a
    session, each kind and each example were added."""

    def __init__(self) -> None:
        super().__init__()
        self.now: tuple[int, int] = (0, 0)
        self.step = 0
        self.figure_at: dict[str, Moment] = {}
        self.session_at: dict[str, dict[str, Moment]] = {rule: {} for rule in self.rules}
        self.kind_at: dict[str, dict[str, Moment]] = {rule: {} for rule in self.rules}
        self.example_at: dict[str, list[Moment]] = {rule: [] for rule in self.rules}

    def at(self, phase: int, offset: int) -> None:
        self.now, self.step = (phase, offset), 0

    def _moment(self) -> Moment:
        self.step += 1
        return (*self.now, self.step)

    def figure(self, session: str) -> SessionFigures:
        if session not in self.figures:
            self.figure_at[session] = self._moment()
        return super().figure(session)

    def add(self, rule: str, session: str, count: int, kind: str | None = None, example: Example | None = None) -> None:
        if count <= 0:
            return
        moment = self._moment()
        result = self.rules[rule]
        self.session_at[rule].setdefault(session, moment)
        if kind is not None:
            self.kind_at[rule].setdefault(kind, moment)
        if example is not None and len(result.examples) < EXAMPLES:
            self.example_at[rule].append(moment)
        super().add(rule, session, count, kind, example)


def merge_findings(parts: list[TimedFindings]) -> Findings:
    """Parts of one cassette (each a set of whole sessions) as the findings of one pass over it. Each part kept
    every example the pass might have kept (it had seen no more of them than the pass had at that moment)."""
    merged = Findings()
    merged.channels = any(t.channels for t in parts)
    for _, session, figure in sorted((t.figure_at[s], s, f) for t in parts for s, f in t.figures.items()):
        merged.figures[session] = figure
    for rule, result in merged.rules.items():
        results = [(t, t.rules[rule]) for t in parts]
        result.total = sum(r.total for _, r in results)
        counts = sorted((t.session_at[rule][s], s, n) for t, r in results for s, n in r.sessions.items())
        result.sessions = {session: count for _, session, count in counts}
        kinds = sorted((t.kind_at[rule][k], k, n) for t, r in results for k, n in r.kinds.items())
        for _, kind, count in kinds:
            result.kinds[kind] = result.kinds.get(kind, 0) + count
        examples = sorted(
            ((at, id(e), e) for t, r in results for at, e in zip(t.example_at[rule], r.examples, strict=True)),
            key=lambda item: item[0],
        )
        result.examples = [e for _, _, e in examples[:EXAMPLES]]
    return merged
