"""`tito audit` while the cassette is written: `tito record --metrics` counts each rule's findings as sessions
finish, with the rules, the traffic grouping and the data of `tito audit` (`traffic.Feed`), so a session's live
counts are its later audit's.

The cassette writer (`tito_rl.cassette.writer`, in the recorder's writer process) hands each record it writes to
a `LiveAudit`, one per cassette, as `tito audit` reads them back from the file; at each session's finish or drop,
and when the cassette closes (the calls after a session's last finish count then, as at the end of a file), the
counts added since the last report are reported: per rule, the emitted and covered tokens of finished sessions,
the prompt and output tokens of the engine calls. The recorder layer never imports this module: the command
table names it (`tito_rl.commands`) and the writer process loads it by that name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tito_rl.cassette.format.records import DropRecord, Header, Record, SamplesRecord
from tito_rl.replayer.audit.channels.versions import VersionRules
from tito_rl.replayer.audit.protocol import RULES, Findings
from tito_rl.replayer.audit.runner import AuditOptions, families
from tito_rl.replayer.audit.traffic import Call, Feed, RuleFamily, SessionState

Report = Callable[[dict[str, Any]], None]


class _Tokens(RuleFamily):
    """Not a rule: the prompt and output tokens of every engine call, as the audit reads them."""

    def __init__(self) -> None:
        self.prompt: dict[str, int] = {}
        self.output: dict[str, int] = {}

    def call(self, state: SessionState, call: Call, prompt: np.ndarray | None) -> None:
        self.prompt[state.name] = self.prompt.get(state.name, 0) + (call.prompt_len or 0)
        self.output[state.name] = self.output.get(state.name, 0) + len(call.output)


class LiveAudit:
    """One cassette's audit, fed as it is written; `report(event)` hears each session's new counts. `options`: the
    rules' (`tito record --max-staleness N` counts `stale-tokens` and its tokens as `tito audit --max-staleness N`
    does)."""

    def __init__(self, header: Header, report: Report, options: AuditOptions | None = None) -> None:
        self.findings = Findings()
        self.tokens = _Tokens()
        ruled = families(self.findings, options)
        self.versions = next(f for f in ruled if isinstance(f, VersionRules))
        self.feed = Feed(header, [*ruled, self.tokens], self.findings)
        self.report = report
        self._sent: dict[str, dict[str, int]] = {}  # per session: what was reported of it so far
        report({"event": "rules", "rules": list(RULES)})  # every rule's series exists from the start, at 0

    def record(self, record: Record) -> None:
        self.feed.feed(record)
        if isinstance(record, SamplesRecord | DropRecord):
            self._send(record.session, "finish")

    def close(self) -> None:
        self.feed.end()
        for session in list(self.feed.states):
            self._send(session, "end")

    def _counts(self, session: str) -> dict[str, int]:
        counts = {rule: result.sessions.get(session, 0) for rule, result in self.findings.rules.items()}
        figure = self.findings.figures.get(session)
        if figure is not None and figure.finished:  # coverage counts finished sessions, as `tito audit` does
            counts["emitted"], counts["covered"] = figure.emitted, figure.covered
        if self.versions.stale_tokens.get(session):
            counts["stale_tokens"] = self.versions.stale_tokens[session]
        counts["prompt_tokens"] = self.tokens.prompt.get(session, 0)
        counts["output_tokens"] = self.tokens.output.get(session, 0)
        return counts

    def _send(self, session: str, why: str) -> None:
        now, before = self._counts(session), self._sent.get(session, {})
        added = {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}
        self._sent[session] = now
        if added or why == "finish":
            self.report({"event": "audit", "session": session, "why": why, "added": added})


def observer(header: Header, report: Report, max_staleness: str | None = None) -> LiveAudit:
    """What the writer process loads by name (`--observer`): one cassette's `RecordObserver`
    (`tito_rl.cassette.writer`), reporting through `report`; `max_staleness`: `tito record --max-staleness`, as the
    writer process passes it on (`--observer-option max_staleness=N`)."""
    return LiveAudit(header, report, AuditOptions(None if max_staleness is None else int(max_staleness)))
