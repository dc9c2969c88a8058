"""Golden files: `cassettes/<name>.golden` beside `cassettes/<name>.tito`, one section per session.

A golden pins what the replay of a cassette produced (stats, tree, decisions, samples: see
`tito_rl.trajectory.golden.render_session`), as plain text meant to be reviewed in a diff. A check compares each
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
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tito_rl.replayer.replay.results import CassetteResult, SessionResult
from tito_rl.trajectory.golden import GoldenFinish, TokenNames, render_session

GOLDEN_SUFFIX = ".golden"
CASSETTE_SUFFIX = ".tito"
SECTION = "== session "
_SECTION_BYTES = SECTION.encode()


def golden_path(cassette: str | os.PathLike[str]) -> Path:
    return Path(cassette).with_suffix(GOLDEN_SUFFIX)


def update_command(cassette: str | os.PathLike[str]) -> str:
    return f"tito replay {cassette} --update-goldens"


def preamble(cassette: str | os.PathLike[str]) -> str:
    name = Path(cassette).name
    return (
        f"# tito golden for {name}: how each session replays (stats, tree, decisions, samples).\n"
        f"# Trained tokens are [bracketed]; long runs show their ends, a count and a digest.\n"
        f"# Regenerate after an intended change: {update_command(name)}\n"
    )


def section(result: SessionResult, names: TokenNames) -> str:
    finishes = [
        GoldenFinish(f.reward, None if f.live is None else len(f.live), f.linearization, f.tree)
        for f in result.finishes
    ]
    return render_session(
        result.session, finishes, names, result.drops, result.wire_events, result.unsampled_finishes, result.exchanges
    )


def parse(text: str) -> tuple[str, dict[str, str]]:
    """(preamble, sections by session name, in file order). Lines end at newlines only (as `StoredSections`
    reads them): a section header is a line of its own."""
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.split("\n"):
        line += "\n"
        if line.startswith(SECTION):
            name = _section_name(line)
            current = sections[name] = [line]
        elif current is None:
            head.append(line)
        else:
            current.append(line)
    return "".join(head)[:-1] if not sections else "".join(head), {
        k: "".join(v).rstrip("\n") + "\n" for k, v in sections.items()
    }


def _section_name(header: str) -> str:
    return header[len(SECTION) :].strip().removesuffix("==").strip()


class StoredSections(Mapping[str, str]):
    """A golden file's sections by session name, each read from the file when it is looked up (as `parse` gives
    it): checking thousands of sessions does not hold their golden in memory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._spans: dict[str, tuple[int, int]] = {}
        name, start, offset = None, 0, 0
        with open(path, "rb") as handle:
            for line in handle:
                if line.startswith(_SECTION_BYTES):
                    if name is not None:
                        self._spans[name] = (start, offset)
                    name, start = _section_name(line.decode("utf-8")), offset
                offset += len(line)
        if name is not None:
            self._spans[name] = (start, offset)

    def __getitem__(self, name: str) -> str:
        start, end = self._spans[name]
        with open(self.path, "rb") as handle:
            handle.seek(start)
            return handle.read(end - start).decode("utf-8").rstrip("\n") + "\n"

    def __iter__(self) -> Iterator[str]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)


def compose(cassette: str | os.PathLike[str], sections: dict[str, str], order: Sequence[str]) -> str:
    ordered = [sections[n] for n in order if n in sections]
    return preamble(cassette) + "".join("\n" + s for s in ordered)


def unified_diff(old: str, new: str, label: str) -> list[str]:
    """The whole diff; `tito_rl.replayer.goldens.diff_view` marks, colours and cuts it for display."""
    return list(
        difflib.unified_diff(
            old.splitlines(), new.splitlines(), f"{label} (golden)", f"{label} (replay)", lineterm="", n=2
        )
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock per golden file, outside the cassette folder (no lock files beside goldens), removed by
    its holder before it lets go, so that a run leaves nothing in the temp folder. A waiter may then hold a lock
    on the removed file while a newcomer creates a fresh one: so the lock counts only once the file locked is
    still the one at the path, else it is taken again."""
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    lock = Path(tempfile.gettempdir()) / f"tito-golden-{key}.lock"
    while True:
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                if not _same_file(handle.fileno(), lock):
                    continue  # removed (or replaced) by the holder before us: take the one there now
                try:
                    yield
                finally:
                    lock.unlink(missing_ok=True)
                return
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _same_file(fd: int, path: Path) -> bool:
    try:
        there = path.stat()
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


class GoldenBook:
    """One cassette's golden file, read once, checked session by session; with `update`, the sections rendered
    are kept and `write` puts them in the file. Replaying thousands of sessions of one cassette reads and writes
    the file once, not once per session."""

    def __init__(self, cassette: str | os.PathLike[str], update: bool = False) -> None:
        self.cassette = str(cassette)
        self.path = golden_path(cassette)
        self.update = update
        self.existed = self.path.is_file()
        self.sections: Mapping[str, str] = StoredSections(self.path) if self.existed else {}
        self.rendered: dict[str, str] = {}

    def check(self, session: SessionResult, names: TokenNames) -> str | None:
        """Sets the session's `golden` (ok, missing, changed, updated, written) and `golden_diff`; returns the
        section rendered, or None for a session not checked: one skipped, or (unless updating) one that
        stopped at a difference, whose replay is incomplete."""
        if session.skipped or (session.differences and not self.update):
            return None
        new = section(session, names)
        self.add(session, new)
        return new

    def add(self, session: SessionResult, new: str) -> None:
        """Judge a section rendered elsewhere (a worker process) as `check` does."""
        old = self.sections.get(session.session)
        if self.update:
            self.rendered[session.session] = new
        if old == new:
            session.golden = "ok"
            return
        if self.update:
            session.golden = "written" if old is None else "updated"
        else:
            session.golden = "missing" if old is None else "changed"
        if old is not None:
            session.golden_diff = unified_diff(old, new, session.session)

    def unused(self, all_sessions: Sequence[str]) -> list[str]:
        """The file's sections for sessions the cassette (`all_sessions`) no longer has, in file order."""
        wanted = set(all_sessions)
        return [n for n in self.sections if n not in wanted]

    def write(self, all_sessions: Sequence[str]) -> None:
        """Write the rendered sections (updating), keep the others of sessions in `all_sessions`, remove the
        rest. The file is read again under the lock: parallel workers may have written their sections."""
        if not self.update or not (self.rendered or (self.existed and self.unused(all_sessions))):
            return
        with _locked(self.path):
            existed = self.path.is_file()
            _, sections = parse(self.path.read_text(encoding="utf-8")) if existed else ("", {})
            kept = {n: t for n, t in sections.items() if n in all_sessions}
            text = compose(self.cassette, {**kept, **self.rendered}, sorted(all_sessions))
            if not existed or self.path.read_text(encoding="utf-8") != text:
                _write(self.path, text)


def check(result: CassetteResult, all_sessions: Sequence[str], names: TokenNames, update: bool = False) -> None:
    """Sets each checked session's `golden` (ok, missing, changed, updated, written) and `golden_diff`, and
    the result's `unused_sections` (sections for sessions the cassette no longer has; an update drops them).

    Sessions that stopped at a difference are not checked (their replay is incomplete), unless updating.
    `all_sessions`: every session of the cassette. The file lists them by name, not in cassette order: that
    order is arrival order, which concurrent sessions change from one recording to the next.
    """
    book = GoldenBook(result.path, update)
    result.golden_path = str(book.path)
    result.unused_sections = book.unused(all_sessions)
    for session in result.sessions:
        book.check(session, names)
    book.write(all_sessions)


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
