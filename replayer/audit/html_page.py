"""`tito audit --html FILE`: the audit as one self-contained page (inline CSS, nothing fetched), in the inspect
page's style: per cassette its coverage, each rule with its counts, kinds and examples (both sides' decoded text
side by side), and the sessions' figures. All text is escaped: decoded tokens hold `<`, `&` and quotes."""

from __future__ import annotations

from html import escape

from tito_rl.replayer.audit.protocol import RULES, Example
from tito_rl.replayer.audit.report import SESSION_LINES, coverage_text
from tito_rl.replayer.audit.runner import AuditReport, CassetteAudit

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:16px 24px;color:#1d232a;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ccd}
h3{font-size:15px;margin:18px 0 6px}
code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
table{border-collapse:collapse;font-size:12px}th,td{padding:2px 8px;border-bottom:1px solid #e3e6ea;text-align:left}
td.n{text-align:right}.fail{color:#c62828;font-weight:600}.allowed{color:#8a4b00}.quiet{color:#889}
.example{margin:8px 0;border:1px solid #e3e6ea;border-radius:6px;padding:6px 10px}
.sides{display:flex;gap:16px;flex-wrap:wrap}.side{flex:1;min-width:280px}
.side pre{white-space:pre-wrap;background:#f5f6f8;padding:4px;margin:2px 0;font-size:12px}
.label{font-size:12px;color:#667}.where{font-size:12px;color:#445}
"""


def render_html(report: AuditReport) -> str:
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>tito audit</title><style>{CSS}</style>"
        "</head><body><h1>tito audit</h1>",
        f"<p>fail on: <code>{escape(', '.join(report.fail_on) or 'nothing')}</code>; "
        + ("<span class='fail'>a rule of it fired (exit 1)</span>" if report.failed else "none fired (exit 0)")
        + "</p>",
    ]
    for number, audit in enumerate(report.cassettes):
        parts += _cassette(audit, report.fail_on, number, report.rules)
    parts.append("</body></html>\n")
    return "".join(parts)


def _cassette(audit: CassetteAudit, fail_on: tuple[str, ...], number: int, shown: tuple[str, ...]) -> list[str]:
    out = [
        f"<h2>{escape(audit.path)}</h2><p>target {escape(audit.target)}, {audit.sessions} session(s)"
        + (", truncated" if audit.truncated else "")
        + f"; coverage <b>{coverage_text(audit.covered, audit.emitted)}"
        f"</b> ({audit.covered} of {audit.emitted} emitted tokens trained exactly once with the engine's "
        "logprob)</p>",
        "<table><tr><th>rule</th><th>total</th><th>sessions</th><th>kinds</th><th>status</th></tr>",
    ]
    for rule, result in audit.findings.rules.items():
        if rule not in shown:
            continue
        status = (
            "allowed: " + escape(result.allowed)
            if result.allowed and result.fired
            else "<span class='fail'>fails</span>"
            if result.fired and rule in fail_on
            else "fired"
            if result.fired
            else "<span class='quiet'>not fired</span>"
        )
        kinds = ", ".join(f"{escape(k)} {n}" for k, n in sorted(result.kinds.items()))
        out.append(
            f"<tr><td title='{escape(RULES[rule], quote=True)}'><a href='#{_anchor(number, rule)}'>{rule}"
            f"</a></td><td class='n'>{result.total}</td><td class='n'>{len(result.sessions)}</td>"
            f"<td>{kinds}</td><td>{status}</td></tr>"
        )
    out.append("</table>")
    for rule, result in audit.findings.rules.items():
        if result.fired:
            out.append(f"<h3 id='{_anchor(number, rule)}'>{rule}: {result.total}</h3><p>{escape(RULES[rule])}</p>")
            out += [_example(e) for e in result.examples]
    out.append(
        "<h3>sessions</h3><table><tr><th>session</th><th>exchanges</th><th>engine calls</th>"
        "<th>coverage</th><th>rules fired</th></tr>"
    )
    rows = sorted(
        audit.findings.figures.values(),
        key=lambda f: not any(f.session in r.sessions for r in audit.findings.rules.values()),
    )
    for figure in rows[: SESSION_LINES * 5]:
        fired = ", ".join(
            f"{r} {res.sessions[figure.session]}"
            for r, res in audit.findings.rules.items()
            if figure.session in res.sessions
        )
        cover = (
            f"{coverage_text(figure.covered, figure.emitted)} ({figure.covered}/{figure.emitted})"
            if figure.finished
            else "no finish recorded"
        )
        out.append(
            f"<tr><td class='mono'>{escape(figure.session)}</td><td class='n'>{figure.exchanges}</td>"
            f"<td class='n'>{figure.engine_calls}</td><td>{cover}</td><td>{escape(fired)}</td></tr>"
        )
    out.append("</table>")
    if len(rows) > SESSION_LINES * 5:
        out.append(f"<p class='quiet'>… {len(rows) - SESSION_LINES * 5} more session(s) (--json lists every one)</p>")
    return out


def _example(example: Example) -> str:
    where = ", ".join(
        w
        for w in (
            f"exchange {example.exchange}" if example.exchange is not None else "",
            f"seq {example.seq}" if example.seq is not None else "",
            f"token {example.token}" if example.token is not None else "",
        )
        if w
    )
    sides = "".join(
        f"<div class='side'><div class='label'>{escape(s.label)}</div><pre>{escape(s.text)}</pre></div>"
        for s in example.sides
    )
    return (
        f"<div class='example'><div class='where'><span class='mono'>{escape(example.session)}</span> {where}"
        f"</div><div>{escape(example.detail)}</div><div class='sides'>{sides}</div></div>"
    )


def _anchor(number: int, rule: str) -> str:
    return f"c{number}-{rule}"
