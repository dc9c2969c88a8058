"""`tito inspect --html`: one self-contained page (inline CSS and JS, nothing fetched) for reading a cassette's
sessions in a browser.

Per session: the exchanges table, and per finish the stats, the message tree (the golden's `render_tree`
lines, each node linked to its samples and its decisions), every decision, and each sample as a strip of
tokens coloured prompt / context / masked / trained. Hovering a token shows its text, id, logprob, turn and
index. A decision is a marker in the strip right before the token it landed on, linked both ways with the
decision list and listed beside the strip. Long prompt and context runs fold to their ends with the middle as
plain text in a `<details>`, so a 150k-token session stays a few megabytes; masked and trained tokens are
always shown one by one. All text is escaped: token text holds `<`, `&` and quotes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from html import escape

from tito_rl.replayer.inspection.gather import (
    ExchangeRow,
    Inspection,
    Placement,
    SessionView,
    TokenRun,
    channel_tip,
    describe_finish,
    header_facts,
    logprob_at,
    place_events,
    sample_line,
    token_runs,
)
from tito_rl.replayer.inspection.text import COLUMNS, stats_line
from tito_rl.replayer.replay.results import FinishResult
from tito_rl.trajectory.events import Event
from tito_rl.trajectory.golden import TokenNames, render_tree
from tito_rl.trajectory.records import Sample

FOLD_RUN = 48  # a prompt or context run longer than this shows FOLD_ENDS tokens at each end, the rest folded
FOLD_ENDS = 12
KINDS = ("prompt", "context", "masked", "trained")
KIND_HELP = {
    "prompt": "the first turn's prompt (before the response region)",
    "context": "loss 0: later prompts' new tokens (tool results, template)",
    "masked": "loss 0: an engine reply carried untrained (trained by another sample, or realigned)",
    "trained": "loss 1: the engine's own output, with its logprobs",
}
NODE_LINE = re.compile(r"^([│├└─ ]*)(n(\d+) .*)$")

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:16px 24px;color:#1d232a;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ccd}
h3{font-size:15px;margin:18px 0 6px}h4{font-size:13px;margin:10px 0 4px;color:#445}
code,.mono,.strip,.tree{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:0 12px;margin:6px 0;font-size:13px}
dl.facts dt{color:#667}dl.facts dd{margin:0}
.legend span.tok{margin-right:4px}.legend{margin:8px 0;font-size:13px}
.legend li{list-style:none;display:inline-block;margin-right:18px}.legend ul{padding:0;margin:0}
table.exchanges{border-collapse:collapse;font-size:12px}
table.exchanges th,table.exchanges td{padding:2px 8px;border-bottom:1px solid #e3e6ea;text-align:right}
table.exchanges td.l,table.exchanges th.l{text-align:left}
.stats{font-size:12px;color:#445}.note{color:#8a4b00}
.cols{display:flex;gap:24px;align-items:flex-start;flex-wrap:wrap}
.tree{font-size:12px;white-space:pre;overflow-x:auto;max-width:100%}
.node .branch{color:#99a}.node.gen .label{color:#0b5d1e}.node a{margin-left:6px;font-size:11px}
ol.decisions{margin:0;padding-left:22px;font-size:12px}ol.decisions li{margin:2px 0}
.sample{margin:14px 0;border:1px solid #e3e6ea;border-radius:6px;padding:6px 10px}
.row{display:flex;gap:16px;align-items:flex-start}
.strip{flex:1;font-size:12px;line-height:1.9;min-width:0}
aside.touch{flex:0 0 260px;font-size:12px;border-left:3px solid #c62828;padding-left:8px}
aside.touch.empty{border-left-color:#e3e6ea;color:#889}
aside.touch ul{margin:0;padding-left:16px}
.tok{display:inline-block;white-space:pre;padding:0 2px;margin:0 1px 1px 0;border-radius:3px;cursor:default}
.tok.prompt{background:#dbe6f5}.tok.context{background:#e6e8eb;color:#3d4650}
.tok.masked{background:#ffcf8f}.tok.trained{background:#9fe0ad}
.tok.realigned{outline:1px dashed #b35c00}
.tok:hover{outline:2px solid #1d232a}
details.fold{display:inline;font-size:11px;color:#556}
details.fold summary{display:inline-block;cursor:pointer;background:#f2f3f5;border:1px dashed #aab;
border-radius:3px;padding:0 4px;margin:0 2px}
details.fold[open] .foldtext{display:block;white-space:pre-wrap;background:#f5f6f8;padding:4px;margin:2px 0}
a.mark{display:inline-block;background:#c62828;color:#fff;font-size:11px;border-radius:3px;padding:0 5px;
margin:0 3px;text-decoration:none;line-height:1.5}
:target{outline:2px solid #c62828;outline-offset:1px}
#tip{position:absolute;z-index:10;background:#1d232a;color:#fff;font:12px/1.5 ui-monospace,monospace;
padding:4px 8px;border-radius:4px;white-space:pre-wrap;pointer-events:none;max-width:80ch}
"""

# Hover: a token's title moves into a styled tooltip (so the native one does not show twice).
JS = """
const tip=document.getElementById('tip');
document.addEventListener('mouseover',e=>{
  const t=e.target.closest&&e.target.closest('.tok[data-i]');
  if(!t){tip.hidden=true;return;}
  if(t.title){t.dataset.tip=t.title;t.removeAttribute('title');}
  tip.textContent=t.dataset.tip;tip.hidden=false;
  const r=t.getBoundingClientRect();
  tip.style.left=(r.left+window.scrollX)+'px';tip.style.top=(r.bottom+window.scrollY+4)+'px';
});
"""


def render_html(inspection: Inspection) -> str:
    out: list[str] = [
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">',
        f"<title>tito inspect: {_e(inspection.path)}</title><style>{CSS}</style></head><body>",
        f'<h1>tito inspect</h1><div class="mono">{_e(inspection.path)}</div><dl class="facts">',
    ]
    for key, value in header_facts(inspection.header):
        out.append(f"<dt>{_e(key)}</dt><dd>{_e(str(value))}</dd>")
    out.append("</dl>")
    if inspection.truncated:
        out.append('<p class="note">The cassette ends in a cut record (the recorder stopped mid-write).</p>')
    out.append('<div class="legend"><ul>')
    for kind in KINDS:
        out.append(f'<li><span class="tok {kind}">{kind}</span>{_e(KIND_HELP[kind])}</li>')
    out.append('<li><a class="mark">decision</a>before the token it landed on</li></ul></div>')
    out.append(
        "<nav>sessions: "
        + ", ".join(f'<a href="#s{i}">{_e(s.name)}</a>' for i, s in enumerate(inspection.sessions))
        + "</nav>"
    )
    for i, session in enumerate(inspection.sessions):
        _session(out, f"s{i}", session, inspection.names)
    out.append(f'<div id="tip" hidden></div><script>{JS}</script></body></html>\n')
    return "".join(out)


def _session(out: list[str], sid: str, session: SessionView, names: TokenNames) -> None:
    out.append(f'<section class="session" id="{sid}"><h2>session {_e(session.name)}</h2>')
    out.append(_exchanges(session.exchanges))
    out += [f'<p class="note">{_e(n)}</p>' for n in session.notes()]
    outputs = session.outputs()
    for n, finish in enumerate(session.finishes, 1):
        _finish(out, f"{sid}f{n}", n, len(session.finishes), finish, outputs, names)
    out.append("</section>")


def _exchanges(rows: list[ExchangeRow]) -> str:
    if not rows:
        return "<p>no agent exchanges</p>"
    head = "".join(f"<th{' class=l' if c == 'finish' else ''}>{_e(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows:
        cells = [r.index, r.turn, r.status, r.prompt_tokens, r.output_tokens]
        tds = "".join(f"<td>{'-' if c is None else c}</td>" for c in cells)
        engine = "-" if r.engine_s is None else f"{r.engine_s:.3f}"
        tds += (
            f"<td class=l>{_e(r.finish or '-')}</td><td>{r.started_s:.3f}</td><td>{r.duration_s:.3f}</td>"
            f"<td>{engine}</td><td class=l>{_e(', '.join(r.notes))}</td>"
        )
        body.append(f"<tr>{tds}</tr>")
    return (
        f'<table class="exchanges"><thead><tr>{head}<th class=l>notes</th></tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def _finish(
    out: list[str],
    fid: str,
    n: int,
    total: int,
    finish: FinishResult,
    outputs: dict[int, ExchangeRow],
    names: TokenNames,
) -> None:
    lin = finish.linearization
    placements = place_events(lin)
    out.append(f'<div class="finish" id="{fid}"><h3>finish {n} of {total}: {_e(describe_finish(finish))}</h3>')
    out.append(f'<p class="stats">{_e(stats_line(lin.stats))}</p><div class="cols">')
    out.append(f'<div><h4>tree</h4><div class="tree">{_tree(fid, finish, placements)}</div></div>')
    out.append(f"<div><h4>decisions</h4>{_decisions(fid, lin.events, placements)}</div></div>")
    for k, sample in enumerate(lin.samples):
        spans = lin.spans[k] if k < len(lin.spans) else []
        here = [p for p in placements if p.sample == k]
        runs = token_runs(sample, spans, outputs, (p.token for p in here if p.token is not None))
        out.append(
            f'<div class="sample" id="{fid}x{k}"><h4>{_e(sample_line(k, sample, spans))}</h4>'
            '<div class="row"><div class="strip">'
        )
        _strip(out, fid, k, sample, runs, here, lin.events, names)
        out.append("</div>")
        out.append(_aside(fid, here, lin.events))
        out.append("</div></div>")
    if not lin.samples:
        out.append("<p>no samples</p>")
    out.append("</div>")


def _tree(fid: str, finish: FinishResult, placements: Sequence[Placement]) -> str:
    nodes = {node["id"]: node for node in finish.tree.get("nodes", [])}
    events = finish.linearization.events
    lines = []
    for line in render_tree(list(nodes.values())):
        match = NODE_LINE.match(line)
        if match is None:
            lines.append(f"<div>{_e(line)}</div>")
            continue
        prefix, label, node_id = match.group(1), match.group(2), int(match.group(3))
        node = nodes.get(node_id, {})
        classes = "node" + (" gen" if node.get("generated") else "") + (" leaf" if node.get("leaf") else "")
        links = "".join(f'<a href="#{fid}x{k}">sample {k}</a>' for k in node.get("samples") or [])
        if node.get("generated") and node.get("turn") is not None:
            links += "".join(
                f'<a class="mark" href="#{fid}d{p.event}">{_e(events[p.event].kind)}</a>'
                for p in placements
                if events[p.event].turn == node["turn"]
            )
        lines.append(
            f'<div class="{classes}" id="{fid}n{node_id}" data-node="{node_id}">'
            f'<span class="branch">{_e(prefix)}</span><span class="label">{_e(label)}</span>{links}</div>'
        )
    return "".join(lines) or "(empty)"


def _decisions(fid: str, events: Sequence[Event], placements: Sequence[Placement]) -> str:
    if not events:
        return "<p>none</p>"
    items = []
    for p in placements:
        event = events[p.event]
        if p.sample is None:
            where = "touches no sample's tokens"
        elif p.token is None:
            where = f'<a href="#{fid}x{p.sample}">sample {p.sample}</a>'
        else:
            where = f'<a href="#{fid}m{p.event}">sample {p.sample}, token {p.token}</a>'
        items.append(
            f'<li id="{fid}d{p.event}" data-kind="{_e(event.kind)}"><code>{_e(event.describe())}</code> → {where}</li>'
        )
    return f'<ol class="decisions">{"".join(items)}</ol>'


def _aside(fid: str, here: Sequence[Placement], events: Sequence[Event]) -> str:
    if not here:
        return '<aside class="touch empty">no decisions on this sample</aside>'
    items = []
    for p in here:
        target = f"#{fid}m{p.event}" if p.token is not None else f"#{fid}d{p.event}"
        at = f" at token {p.token}" if p.token is not None else ""
        items.append(f'<li><a href="{target}">{_e(events[p.event].describe())}</a>{at}</li>')
    return f'<aside class="touch"><h4>decisions here</h4><ul>{"".join(items)}</ul></aside>'


def _strip(
    out: list[str],
    fid: str,
    k: int,
    sample: Sample,
    runs: Sequence[TokenRun],
    here: Sequence[Placement],
    events: Sequence[Event],
    names: TokenNames,
) -> None:
    marks: dict[int, list[int]] = {}
    for p in here:
        if p.token is not None:
            marks.setdefault(p.token, []).append(p.event)
    for run in runs:
        for e in marks.get(run.start, []):
            out.append(
                f'<a class="mark" id="{fid}m{e}" href="#{fid}d{e}" data-token="{run.start}" '
                f'title="{_e(events[e].describe())}">{_e(events[e].kind)}</a>'
            )
        length = run.end - run.start
        if run.kind in ("prompt", "context") and length > FOLD_RUN:
            _tokens(out, k, sample, run, run.start, run.start + FOLD_ENDS, names)
            middle = sample.tokens[run.start + FOLD_ENDS : run.end - FOLD_ENDS]
            text = "".join(names(t) for t in middle).replace("↵", "↵\n")
            out.append(
                f'<details class="fold"><summary>… {len(middle)} tokens of {_e(run.label)}</summary>'
                f'<span class="foldtext">{_e(text)}</span></details>'
            )
            _tokens(out, k, sample, run, run.end - FOLD_ENDS, run.end, names)
        else:
            _tokens(out, k, sample, run, run.start, run.end, names)


def _tokens(out: list[str], k: int, sample: Sample, run: TokenRun, start: int, end: int, names: TokenNames) -> None:
    classes = f"tok {run.kind}" + (" realigned" if run.realigned else "")
    for i in range(start, end):
        token = sample.tokens[i]
        name = names(token)
        lp = logprob_at(sample, i)
        logprob = "none (prompt)" if lp is None else f"{lp:.6g}"
        tip = f"{name}\nid {token} · logprob {logprob}\n{run.kind}: {run.label}\ntoken {i} of sample {k}"
        channels = channel_tip(sample, i, run.turn, run.kind in ("trained", "masked"))
        if channels:
            tip += "\n" + "\n".join(channels)
        out.append(f'<span class="{classes}" data-i="{i}" title="{_e(tip)}">{_e(name)}</span>')
        if "↵" in name:
            out.append("<br>")


def _e(text: str) -> str:
    return escape(text, quote=True)
