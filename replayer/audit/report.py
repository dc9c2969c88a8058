"""An audit as text (the default) and as JSON (`--json`, schema below; `docs/audit.md` documents it).

JSON, `"schema": "tito-audit"`, `"version": 1`:
- `fail_on` (rule ids), `failed` (bool: a rule of `fail_on` fired somewhere and is not allowed there),
  `rules`: per rule id its `description`, `total` over all cassettes, `cassettes` (how many it fired in);
  the per-token channel rules (`protocol.CHANNEL_RULES`) are listed once a cassette of the report carries channels;
- `cassettes`: per cassette `path`, `target`, `sessions`, `truncated`, `emitted`, `covered`, `coverage` (null:
  nothing emitted in a finished session), `failing` (rule ids), `allowed` (rule id -> reason), `rules` (per rule
  id: `total`, `sessions` (session -> count), `kinds` (kind or reason -> count), `allowed`, `examples`: each
  `session`, `exchange`, `seq`, `token`, `detail`, `sides` (`label`, `text`)), and `session_figures`: per session
  `session`, `exchanges`, `engine_calls`, `finished`, `emitted`, `covered`, `coverage`, `side_tokens`,
  `aborted_tokens`, `dropped_tokens`, `rules` (rule id -> count, fired rules only).
Counts are tokens for the coverage family (coverage: tokens not covered) and events for the others (prefix
breaks, replies, engine calls, retries).
"""

from __future__ import annotations

from typing import Any

from tito_rl.replayer.audit.protocol import RULES, SCHEMA_VERSION, UNITS, RuleResult
from tito_rl.replayer.audit.runner import AuditReport, CassetteAudit

SESSION_LINES = 20  # sessions a cassette's text lists (those with findings first); --json has them all


def to_json(report: AuditReport) -> dict[str, Any]:
    shown = report.rules
    return {
        "schema": "tito-audit",
        "version": SCHEMA_VERSION,
        "fail_on": list(report.fail_on),
        "failed": report.failed,
        "rules": {
            rule: {
                "description": text,
                "total": sum(c.findings.rules[rule].total for c in report.cassettes),
                "cassettes": sum(1 for c in report.cassettes if c.findings.rules[rule].fired),
            }
            for rule, text in RULES.items()
            if rule in shown
        },
        "cassettes": [_cassette_json(c, report.fail_on, shown) for c in report.cassettes],
    }


def _cassette_json(audit: CassetteAudit, fail_on: tuple[str, ...], shown: tuple[str, ...]) -> dict[str, Any]:
    figures = []
    for figure in audit.findings.figures.values():
        counts = {
            r: res.sessions[figure.session] for r, res in audit.findings.rules.items() if figure.session in res.sessions
        }
        figures.append({**figure.to_dict(), "rules": counts})
    return {
        "path": audit.path,
        "target": audit.target,
        "sessions": audit.sessions,
        "truncated": audit.truncated,
        "emitted": audit.emitted,
        "covered": audit.covered,
        "coverage": audit.coverage,
        "failing": audit.failing(fail_on),
        "allowed": dict(audit.allowed),
        "rules": {rule: _rule_json(result) for rule, result in audit.findings.rules.items() if rule in shown},
        "session_figures": figures,
    }


def _rule_json(result: RuleResult) -> dict[str, Any]:
    out = result.to_dict()
    del out["rule"]
    return out


def coverage_text(covered: int, emitted: int) -> str:
    if not emitted:
        return "-"
    if covered == emitted:
        return "1.0"
    return f"{int(1000 * covered / emitted) / 1000:.3f}"  # rounded down: 0.9996 is not shown as 1.0


def render_text(report: AuditReport) -> str:
    lines: list[str] = []
    for audit in report.cassettes:
        lines += _cassette_text(audit, report.fail_on, report.rules)
    failing = sorted({r for c in report.cassettes for r in c.failing(report.fail_on)}, key=list(RULES).index)
    sessions = sum(c.sessions for c in report.cassettes)
    fired = [_fired_text(report, r) for r in RULES if any(c.findings.rules[r].fired for c in report.cassettes)]
    lines.append(
        f"audited {len(report.cassettes)} cassette(s), {sessions} session(s); rules fired:" + ("" if fired else " none")
    )
    lines += [f"  {text}" for text in fired]
    lines.append(
        f"fail on {', '.join(report.fail_on) or 'nothing'}: "
        + (f"{', '.join(failing)} fired (exit 1)" if failing else "none fired (exit 0)")
    )
    return "\n".join(lines) + "\n"


def _fired_text(report: AuditReport, rule: str) -> str:
    """What a rule's counts count, summed over the cassettes: findings, the sessions and cassettes they are in."""
    results = [c.findings.rules[rule] for c in report.cassettes]
    findings = sum(r.total for r in results)
    sessions = sum(len(r.sessions) for r in results)
    cassettes = sum(1 for r in results if r.fired)
    return f"{rule}: {findings} {UNITS[rule]} in {sessions} session(s) of {cassettes} cassette(s)"


def _cassette_text(audit: CassetteAudit, fail_on: tuple[str, ...], shown: tuple[str, ...]) -> list[str]:
    findings = audit.findings
    set_aside = {
        k: sum(getattr(f, k) for f in findings.figures.values())
        for k in ("side_tokens", "aborted_tokens", "dropped_tokens")
    }
    lines = [
        f"{audit.path} (target {audit.target}, {audit.sessions} session(s)"
        + (", truncated" if audit.truncated else "")
        + ")",
        f"  coverage {coverage_text(audit.covered, audit.emitted)}: {audit.covered} of {audit.emitted} emitted "
        "token(s) trained exactly once with the engine's logprob"
        + (
            " (set aside: " + ", ".join(f"{v} {k.split('_')[0]}" for k, v in set_aside.items() if v) + ")"
            if any(set_aside.values())
            else ""
        ),
    ]
    quiet = []
    for rule, result in findings.rules.items():
        if not result.fired:
            if rule in shown:
                quiet.append(rule)
            continue
        mark = "FAIL " if rule in fail_on and rule not in audit.allowed else ""
        kinds = (": " + ", ".join(f"{k} {n}" for k, n in sorted(result.kinds.items()))) if result.kinds else ""
        lines.append(f"  {mark}{rule}: {result.total} {UNITS[rule]} in {len(result.sessions)} session(s){kinds}")
        if result.allowed:
            lines.append(f"    allowed: {result.allowed}")
        for example in result.examples:
            where = [
                f"exchange {example.exchange}" if example.exchange is not None else None,
                f"seq {example.seq}" if example.seq is not None else None,
                f"token {example.token}" if example.token is not None else None,
            ]
            lines.append(f"    {example.session} {', '.join(w for w in where if w)}: {example.detail}")
            width = max((len(s.label) for s in example.sides), default=0)
            lines += [f"      {s.label + ':':<{width + 1}} {s.text!r}" for s in example.sides]
    if quiet:
        lines.append(f"  not fired: {', '.join(quiet)}")
    lines += _sessions_text(audit)
    return lines


def _sessions_text(audit: CassetteAudit) -> list[str]:
    rows = []
    for figure in audit.findings.figures.values():
        fired = [
            (r, res.sessions[figure.session])
            for r, res in audit.findings.rules.items()
            if figure.session in res.sessions
        ]
        rows.append((not fired, figure, fired))
    rows.sort(key=lambda row: row[0])  # sessions with findings first, each group in cassette order
    lines = ["  sessions: exchanges, engine calls, coverage (covered/emitted), rules fired"]
    for _, figure, fired in rows[:SESSION_LINES]:
        lines.append(
            f"    {figure.session}: {figure.exchanges}, {figure.engine_calls}, "
            + (
                f"{coverage_text(figure.covered, figure.emitted)} ({figure.covered}/{figure.emitted})"
                if figure.finished
                else "no finish recorded"
            )
            + (", " + ", ".join(f"{r} {n}" for r, n in fired) if fired else "")
        )
    if len(rows) > SESSION_LINES:
        lines.append(f"    … {len(rows) - SESSION_LINES} more session(s) (--json lists every one)")
    return lines
