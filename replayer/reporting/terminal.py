"""How replay results read on a terminal: a line per session, and under a failing one its first difference
or its golden diff. Shared by `tito replay` and the pytest plugin, so both say the same thing.

`verbosity` 0 shows the first difference of each kind with its detail; 1 (`-v`) every difference, each with
its detail. Golden diffs are drawn by `tito_rl.replayer.goldens.diff_view` in the caller's `DiffStyle` (colour, cut).
"""

from __future__ import annotations

from tito_rl.replayer.comparison.differences import Difference
from tito_rl.replayer.goldens.diff_view import PLAIN, DiffStyle, render
from tito_rl.replayer.goldens.files import update_command
from tito_rl.replayer.replay.results import CassetteResult, SessionResult


def session_details(session: SessionResult, verbosity: int = 0, style: DiffStyle = PLAIN) -> list[str]:
    every = verbosity >= 1
    lines: list[str] = []
    for i, found in enumerate(session.differences if every else session.differences[:1]):
        lines += _difference("first difference" if i == 0 else "difference", found, detail=True)
    prompts = [d for d in session.accepted if d.kind == "engine-request"]
    for i, changed in enumerate(prompts):  # a what-if replay's changed prompts, each with its first divergence
        lines += _difference("warning", changed, detail=every or i == 0)
    others = [d for d in session.accepted if d.kind != "engine-request"]
    for other in others if every else others[:1]:
        lines += _difference("differs from the recording (noted, not failed)", other, detail=every or not prompts)
    if len(others) > 1 and not every:
        lines.append(f"… and {len(others) - 1} more such difference(s); the golden decides (-v shows them)")
    lines += [f"note: {n}" for n in session.notes]
    if session.golden == "missing":
        lines.append(
            f"golden missing: create it with `{update_command(session.cassette)}` (or pytest --update-goldens)"
        )
    if session.golden in ("changed", "updated"):
        lines.append(f"golden {session.golden}:")
        lines += ["  " + d for d in render(session.golden_diff, style)]
    return lines


def _difference(label: str, found: Difference, detail: bool) -> list[str]:
    where = found.where()
    lines = [f"{label}: {found.summary}" + (f" ({where})" if where else "")]
    return lines + (["  " + d for d in found.detail] if detail else [])


def session_report(result: CassetteResult, session: SessionResult, verbosity: int = 0, style: DiffStyle = PLAIN) -> str:
    """A failing session's whole report: where, the one-line summary, then the details."""
    return "\n".join(
        [f"{result.path} :: {session.line()}", *("    " + d for d in session_details(session, verbosity, style))]
    )
