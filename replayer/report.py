"""How replay results read on a terminal: a line per session, and under a failing one its first difference
or its golden diff. Shared by `tito replay` and the pytest plugin, so both say the same thing."""

from __future__ import annotations

from replayer.goldens import update_command
from replayer.results import CassetteResult, SessionResult


def session_details(session: SessionResult) -> list[str]:
    lines: list[str] = []
    for label, found in (("first difference", session.differences),
                         ("differs from the recording (accepted by --update-goldens)", session.accepted)):
        if not found:
            continue
        first = found[0]
        where = first.where()
        lines.append(f"{label}: {first.summary}" + (f" ({where})" if where else ""))
        lines += ["  " + d for d in first.detail]
        if len(found) > 1:
            lines.append(f"… and {len(found) - 1} more difference(s)")
    lines += [f"note: {n}" for n in session.notes]
    if session.golden == "missing":
        lines.append(f"golden missing: create it with `{update_command(session.cassette)}` "
                     "(or pytest --update-goldens)")
    if session.golden in ("changed", "updated"):
        lines.append(f"golden {session.golden}:")
        lines += ["  " + d for d in session.golden_diff]
    return lines


def session_report(result: CassetteResult, session: SessionResult) -> str:
    """A failing session's whole report: where, the one-line summary, then the details."""
    return "\n".join([f"{result.path} :: {session.line()}", *("    " + d for d in session_details(session))])
