"""A run's recording as a folder of cassettes: a new one every N sessions or SIZE bytes, each closed (with its
index) once the sessions it holds have ended, and a cap on the bytes the whole recording may take.

A session is never split across cassettes while it is live: a cassette is *sealed* when it reaches its number of
sessions or bytes, the next new session opens the next cassette, and the sealed one stays open only for the
sessions it already holds. It is closed when the last of them finishes or is dropped, or at the latest once
`KEEP_SEALED` later cassettes have been sealed (a session that outlives that many rotations goes on in the newest
cassette, as a session of its own there), so at most `KEEP_SEALED + 1` cassettes are ever open and each closed
one reads on its own. Each
cassette has a redactor of its own: what it learned of one cassette's sessions is let go with it, so memory
follows the sessions live, not the days recorded.

The cap (`CappedTap`) counts the bytes of every cassette written; past it, every open cassette is closed and
nothing more is written, and the writer says so once. The proxy keeps serving (`writer_process`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tito_rl.cassette.format.records import Header
from tito_rl.cassette.writer import CASSETTE_SUFFIX, CassetteWriter, RecordObserver
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange

PART_PREFIX = "part-"
KEEP_SEALED = 4  # sealed cassettes kept open for their live sessions at most
PART_RE = re.compile(rf"^{PART_PREFIX}(\d+){re.escape(CASSETTE_SUFFIX)}$")


@dataclass(frozen=True)
class Rotation:
    """When a cassette is sealed: after `sessions` sessions started in it, or `bytes` written to it (None: never)."""

    sessions: int | None = None
    bytes: int | None = None

    def reached(self, sessions: int, written: int) -> bool:
        """Whether a cassette holding `sessions` sessions and `written` bytes is sealed (never an empty one)."""
        return sessions > 0 and (
            (self.sessions is not None and sessions >= self.sessions)
            or (self.bytes is not None and written >= self.bytes)
        )


@dataclass
class _Part:
    writer: CassetteWriter
    started: int = 0  # sessions started in it
    live: set[str] = field(default_factory=set)  # live session ids not yet finished or dropped
    closed: bool = False
    sealed_at: int = 0  # the rotation that sealed it


def next_part_number(folder: Path) -> int:
    """The number after the folder's highest `part-N.tito`: a second recording into a folder never overwrites."""
    found = [int(m.group(1)) for p in folder.iterdir() if (m := PART_RE.match(p.name))] if folder.is_dir() else []
    return max(found, default=0) + 1


class RotatingTap:
    """A `TrafficTap` writing `folder/part-000001.tito`, `part-000002.tito`, ... (module docstring)."""

    def __init__(
        self,
        folder: Path,
        header: Header,
        rotation: Rotation,
        observer: Callable[[Header], RecordObserver] | None = None,
        keep_sealed: int = KEEP_SEALED,
    ) -> None:
        """`observer(header)`: each cassette's observer (`CassetteWriter.observer`), made as it opens."""
        self.folder, self.header, self.rotation, self.observer = folder, header, rotation, observer
        self.keep_sealed = keep_sealed
        folder.mkdir(parents=True, exist_ok=True)
        self._number = next_part_number(folder)
        self._current = self._open()
        self._sealed: list[_Part] = []
        self._owner: dict[str, _Part] = {}
        self._closed_bytes = 0
        self._rotations = 0
        self.cassettes: list[Path] = []  # every cassette written, in order

    @property
    def bytes_written(self) -> int:
        return self._closed_bytes + sum(p.writer.bytes_written for p in (*self._sealed, self._current) if not p.closed)

    def _open(self) -> _Part:
        path = self.folder / f"{PART_PREFIX}{self._number:06d}{CASSETTE_SUFFIX}"
        self._number += 1
        writer = CassetteWriter(path, self.header)
        if self.observer is not None:
            writer.observer = self.observer(writer.header)
        return _Part(writer)

    def _part(self, session: str) -> _Part:
        part = self._owner.get(session)
        if part is not None:
            return part
        if self.rotation.reached(self._current.started, self._current.writer.bytes_written):
            self._seal()
        part = self._owner[session] = self._current
        part.started += 1
        part.live.add(session)
        return part

    def _seal(self) -> None:
        self._rotations += 1
        if self._current.live:
            self._current.sealed_at = self._rotations
            self._sealed.append(self._current)
        else:
            self._close(self._current)
        while self._sealed and self._rotations - self._sealed[0].sealed_at >= self.keep_sealed:
            self._close(self._sealed.pop(0))  # its stragglers go on in the newest cassette
        self._current = self._open()

    def _close(self, part: _Part) -> None:
        if part.closed:
            return
        part.closed = True
        for session in part.live:
            self._owner.pop(session, None)
        part.live.clear()
        part.writer.close()
        self._closed_bytes += part.writer.bytes_written
        assert part.writer.path is not None
        self.cassettes.append(part.writer.path)

    def _ended(self, session: str) -> None:
        part = self._owner.pop(session, None)
        if part is None:
            return
        part.live.discard(session)
        if part in self._sealed and not part.live:
            self._sealed.remove(part)
            self._close(part)

    # TrafficTap

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self._part(session).writer.agent_request(session, source, headers)

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        self._part(session).writer.agent_exchange(session, source, exchange)

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        self._part(session).writer.engine_exchange(session, source, exchange)

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self._part(session).writer.session_finished(session, source, reward, samples)
        self._ended(session)

    def session_dropped(self, session: str, source: str) -> None:
        self._part(session).writer.session_dropped(session, source)
        self._ended(session)

    def engine_event(self, exchange: EngineExchange) -> None:
        """Into every cassette still open (the current one, and the sealed ones whose sessions run on)."""
        for part in [*self._sealed, self._current]:
            if not part.closed:
                part.writer.engine_event(exchange)

    def close(self) -> None:
        for part in [*self._sealed, self._current]:
            self._close(part)
        self._sealed = []


class SizedTap(Protocol):
    """A writing tap that says how many bytes it has written (`CassetteWriter`, `PerSessionTap`, `RotatingTap`)."""

    @property
    def bytes_written(self) -> int: ...

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None: ...

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None: ...

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None: ...

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None: ...

    def session_dropped(self, session: str, source: str) -> None: ...

    def engine_event(self, exchange: EngineExchange) -> None: ...

    def close(self) -> None: ...


class CappedTap:
    """Writes through `inner` until it has written `max_bytes`; then closes it (every cassette readable, indexed)
    and drops every later call. `on_cap(bytes_written)` hears it once. The record that crosses the cap is
    written whole, so a recording ends at most one record (and the indexes) past it."""

    def __init__(self, inner: SizedTap, max_bytes: int, on_cap: Callable[[int], None]) -> None:
        self.inner, self.max_bytes, self.on_cap = inner, max_bytes, on_cap
        self.capped = False
        self._final = 0

    @property
    def bytes_written(self) -> int:
        return self._final if self.capped else self.inner.bytes_written

    def _after(self) -> None:
        if not self.capped and self.inner.bytes_written >= self.max_bytes:
            self.capped = True
            self.inner.close()
            self._final = self.inner.bytes_written
            self.on_cap(self._final)

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        if not self.capped:
            self.inner.agent_request(session, source, headers)

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        if not self.capped:
            self.inner.agent_exchange(session, source, exchange)
            self._after()

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        if not self.capped:
            self.inner.engine_exchange(session, source, exchange)
            self._after()

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        if not self.capped:
            self.inner.session_finished(session, source, reward, samples)
            self._after()

    def session_dropped(self, session: str, source: str) -> None:
        if not self.capped:
            self.inner.session_dropped(session, source)
            self._after()

    def engine_event(self, exchange: EngineExchange) -> None:
        if not self.capped:
            self.inner.engine_event(exchange)
            self._after()

    def close(self) -> None:
        if not self.capped:
            self.inner.close()
