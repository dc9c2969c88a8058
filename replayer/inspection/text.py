"""`tito inspect`'s text view: per session the exchanges as recorded (turn, token counts, finish reason,
timing), then per finish the manager's stats, the message tree, every decision with the sample token it
lands on, and a line per sample. Everything shown comes from the cassette or the replay, never the wall
clock, so two runs print the same bytes.
"""

from __future__ import annotations

from tito_rl.replayer.inspection.gather import (
    ExchangeRow,
    Inspection,
    SessionView,
    describe_finish,
    header_facts,
    place_events,
    sample_line,
)
from tito_rl.trajectory.events import SessionStats, coverage_text
from tito_rl.trajectory.golden import TokenNames, channel_lines, render_tree

COLUMNS = ("#", "turn", "status", "prompt", "output", "finish", "started_s", "agent_s", "engine_s")


def render_text(inspection: Inspection) -> str:
    lines = [f"cassette {inspection.path}"]
    lines += [f"{key}: {value}" for key, value in header_facts(inspection.header)]
    if inspection.truncated:
        lines.append("truncated: yes (the recorder stopped mid-write; everything before the cut is shown)")
    for session in inspection.sessions:
        lines.append("")
        lines += session_lines(session, inspection.names)
    return "\n".join(lines) + "\n"


def session_lines(session: SessionView, names: TokenNames) -> list[str]:
    lines = [f"== session {session.name} =="]
    lines.append("exchanges:")
    lines += ["  " + line for line in exchange_table(session.exchanges)] or ["  none"]
    lines += session.notes()
    for n, finish in enumerate(session.finishes, 1):
        lin = finish.linearization
        lines.append(f"finish {n} of {len(session.finishes)}: {describe_finish(finish)}")
        lines.append("  stats: " + stats_line(lin.stats))
        lines.append("  tree:")
        lines += ["    " + line for line in render_tree(finish.tree.get("nodes", []))] or ["    (empty)"]
        lines.append("  decisions:")
        for placement in place_events(lin):
            event = lin.events[placement.event]
            if placement.sample is None:
                where = "no sample's tokens"
            elif placement.token is None:
                where = f"sample {placement.sample}"
            else:
                token = lin.samples[placement.sample].tokens[placement.token]
                where = f"sample {placement.sample}, token {placement.token} {names(token)!r}"
            lines.append(f"    {event.describe()}  -> {where}")
        if not lin.events:
            lines.append("    none")
        lines.append("  samples:")
        for i, s in enumerate(lin.samples):
            lines.append(f"    {sample_line(i, s, lin.spans[i] if i < len(lin.spans) else [])}")
            lines += ["    " + line for line in channel_lines(s)]  # routes, kept sets, versions, as goldens
        if not lin.samples:
            lines.append("    none")
    return lines


def exchange_table(rows: list[ExchangeRow]) -> list[str]:
    if not rows:
        return []
    table = [list(COLUMNS) + ["notes"]]
    for r in rows:
        table.append(
            [
                str(r.index),
                _opt(r.turn),
                str(r.status),
                _opt(r.prompt_tokens),
                _opt(r.output_tokens),
                r.finish or "-",
                f"{r.started_s:.3f}",
                f"{r.duration_s:.3f}",
                "-" if r.engine_s is None else f"{r.engine_s:.3f}",
                ", ".join(r.notes),
            ]
        )
    widths = [max(len(row[c]) for row in table) for c in range(len(COLUMNS))]
    left = {"finish"}
    return [
        "  ".join(
            cell.ljust(w) if name in left else cell.rjust(w)
            for cell, w, name in zip(row, widths, COLUMNS, strict=False)
        ).rstrip()
        + ("  " + row[-1] if row[-1] else "")
        for row in table
    ]


def stats_line(stats: SessionStats) -> str:
    parts = []
    for key, value in stats.to_dict().items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items()) or "none"
        parts.append(f"{key.replace('_', ' ')} {value}")
    parts.append(f"coverage {coverage_text(stats.trained_tokens, stats.emitted_tokens)}")
    return ", ".join(parts)


def _opt(value: int | None) -> str:
    return "-" if value is None else str(value)
