"""How replay results read on a terminal: a line per session, and under a failing one its first difference
or its golden diff. Shared by `tito replay` and the pytest plugin, so both say the same thing."""

from __future__ import annotations

from replayer.differences import Difference
from replayer.goldens import update_command
from replayer.results import CassetteResult, SessionResult


def session_details(session: SessionResult) -> list[str]:
    lines: list[str] = []
    if session.differences:
        lines += _difference("first difference", session.differences[0], detail=True)
    prompts = [d for d in session.accepted if d.kind == "engine-request"]
    for i, changed in enumerate(prompts):  # a what-if replay's changed prompts, each with its first divergence
        lines += _difference("warning", changed, detail=i == 0)
    others = [d for d in session.accepted if d.kind != "engine-request"]
    if others:
        lines += _difference("differs from the recording (noted, not failed)", others[0], detail=not prompts)
        if len(others) > 1:
            lines.append(f"… and {len(others) - 1} more such difference(s); the golden decides")
    lines += [f"note: {n}" for n in session.notes]
    if session.golden == "missing":
        lines.append(f"golden missing: create it with `{update_command(session.cassette)}` "
                     "(or pytest --update-goldens)")
    if session.golden in ("changed", "updated"):
        lines.append(f"golden {session.golden}:")
        lines += ["  " + d for d in session.golden_diff]
    return lines


def _difference(label: str, found: Difference, detail: bool) -> list[str]:
    where = found.where()
    lines = [f"{label}: {found.summary}" + (f" ({where})" if where else "")]
    return lines + (["  " + d for d in found.detail] if detail else [])


def session_report(result: CassetteResult, session: SessionResult) -> str:
    """A failing session's whole report: where, the one-line summary, then the details."""
    return "\n".join([f"{result.path} :: {session.line()}", *("    " + d for d in session_details(session))])
