"""Golden files: `cassettes/<name>.golden` beside `cassettes/<name>.tito`, one section per session.

A golden pins what the replay of a cassette produced (stats, tree, decisions, samples: see
`trajectory.golden.render_session`), as plain text meant to be reviewed in a diff. A check compares each
replayed session's section with the file; an update rewrites those sections in place, keeps the others,
and removes sections of sessions the cassette no longer has. Updates take a lock, so parallel test workers
replaying sessions of one cassette each write their own section safely.

A golden nobody checks is lost coverage, so it fails as syrupy's unused snapshots do: a golden whose cassette
is gone, and a section for a session its cassette no longer has (`Unused`). `--update-goldens` deletes the one
and trims the other (`remove`).
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from replayer.results import CassetteResult, SessionResult
from trajectory.golden import GoldenFinish, TokenNames, render_session

GOLDEN_SUFFIX = ".golden"
CASSETTE_SUFFIX = ".tito"
SECTION = "== session "


def golden_path(cassette: str | os.PathLike[str]) -> Path:
    return Path(cassette).with_suffix(GOLDEN_SUFFIX)


def update_command(cassette: str | os.PathLike[str]) -> str:
    return f"tito replay {cassette} --update-goldens"


def preamble(cassette: str | os.PathLike[str]) -> str:
    name = Path(cassette).name
    return (f"# tito golden for {name}: how each session replays (stats, tree, decisions, samples).\n"
            f"# Trained tokens are [bracketed]; long runs show their ends, a count and a digest.\n"
            f"# Regenerate after an intended change: {update_command(name)}\n")


def section(result: SessionResult, names: TokenNames) -> str:
    finishes = [GoldenFinish(f.reward, None if f.live is None else len(f.live), f.linearization, f.tree)
                for f in result.finishes]
    return render_session(result.session, finishes, names, result.drops, result.wire_events)


def parse(text: str) -> tuple[str, dict[str, str]]:
    """(preamble, sections by session name, in file order)."""
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines(keepends=True):
        if line.startswith(SECTION):
            name = line[len(SECTION):].strip().removesuffix("==").strip()
            current = sections[name] = [line]
        elif current is None:
            head.append(line)
        else:
            current.append(line)
    return "".join(head), {k: "".join(v).rstrip("\n") + "\n" for k, v in sections.items()}


def compose(cassette: str | os.PathLike[str], sections: dict[str, str], order: Sequence[str]) -> str:
    ordered = [sections[n] for n in order if n in sections]
    return preamble(cassette) + "".join("\n" + s for s in ordered)


def unified_diff(old: str, new: str, label: str) -> list[str]:
    """The whole diff; `replayer.golden_diff` marks, colours and cuts it for display."""
    return list(difflib.unified_diff(old.splitlines(), new.splitlines(), f"{label} (golden)", f"{label} (replay)",
                                     lineterm="", n=2))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock per golden file, outside the cassette folder (no lock files beside goldens)."""
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"tito-golden-{key}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check(result: CassetteResult, all_sessions: Sequence[str], names: TokenNames, update: bool = False) -> None:
    """Sets each checked session's `golden` (ok, missing, changed, updated, written) and `golden_diff`, and
    the result's `unused_sections` (sections for sessions the cassette no longer has; an update drops them).

    Sessions that stopped at a difference are not checked (their replay is incomplete), unless updating.
    `all_sessions`: every session of the cassette. The file lists them by name, not in cassette order: that
    order is arrival order, which concurrent sessions change from one recording to the next.
    """
    path = golden_path(result.path)
    result.golden_path = str(path)
    checked = [s for s in result.sessions if not s.skipped and (update or not s.differences)]
    rendered = {s.session: section(s, names) for s in checked}
    with _locked(path) if update else contextlib.nullcontext():
        existed = path.is_file()
        _, sections = parse(path.read_text(encoding="utf-8")) if existed else ("", {})
        result.unused_sections = [n for n in sections if n not in all_sessions]
        for s in checked:
            old, new = sections.get(s.session), rendered[s.session]
            if old == new:
                s.golden = "ok"
                continue
            if update:
                s.golden = "written" if old is None else "updated"
            else:
                s.golden = "missing" if old is None else "changed"
            if old is not None:
                s.golden_diff = unified_diff(old, new, s.session)
        if update and (checked or (existed and result.unused_sections)):
            kept = {n: t for n, t in sections.items() if n in all_sessions}
            text = compose(result.path, {**kept, **rendered}, sorted(all_sessions))
            if not existed or path.read_text(encoding="utf-8") != text:
                _write(path, text)


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def orphans(folders: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Golden files whose cassette is gone."""
    found = []
    for folder in dict.fromkeys(Path(f) for f in folders):
        for golden in sorted(folder.glob(f"*{GOLDEN_SUFFIX}")):
            if not golden.with_suffix(CASSETTE_SUFFIX).exists():
                found.append(golden)
    return found


def unused_sections(golden: Path, sessions: Sequence[str]) -> list[str]:
    """The golden's sections for sessions not in `sessions` (the cassette's), in file order."""
    if not golden.is_file():
        return []
    return [n for n in parse(golden.read_text(encoding="utf-8"))[1] if n not in sessions]


@dataclass(frozen=True)
class Unused:
    """A golden nobody checks: a whole file whose cassette is gone, or one section (`section`) of a golden."""

    golden: Path
    section: str | None = None

    def describe(self, shown: str | None = None) -> str:
        shown = shown or str(self.golden)
        cassette = self.golden.with_suffix(CASSETTE_SUFFIX).name
        if self.section is None:
            return f"unused golden {shown}: its cassette {cassette} is gone"
        return f"unused golden section {self.section} in {shown}: {cassette} has no such session"

    def remove(self) -> bool:
        """Delete the file, or trim the section (under the golden's lock); False when it was already gone."""
        if self.section is None:
            try:
                self.golden.unlink()
            except FileNotFoundError:
                return False
            return True
        with _locked(self.golden):
            if not self.golden.is_file():
                return False
            _, sections = parse(self.golden.read_text(encoding="utf-8"))
            if sections.pop(self.section, None) is None:
                return False
            _write(self.golden, compose(self.golden.with_suffix(CASSETTE_SUFFIX), sections, list(sections)))
        return True


def fix_unused(allow_flag: str = "--allow-unused-goldens") -> str:
    return f"--update-goldens removes it; {allow_flag} makes this a warning"
