"""The cassette writer: a `TrafficTap` that appends every completed exchange to a cassette file.

Crash safety comes from the layout, not from cleanup: the file is opened for appending, each record is
one self-checking frame handed to the OS in a single unbuffered write as soon as its exchange is complete,
so a `kill -9` loses at most the exchange in flight and leaves a tail the reader recognizes as truncated.
Nothing is written before redaction (`tito_rl.cassette.redaction`). A clean `close()` appends the index
(each session's frame offsets and counts, `tito_rl.cassette.format.index`); a cassette without one reads as well.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol, overload

from tito_rl.cassette.answer_bytes import answer_wire
from tito_rl.cassette.format.codec import SessionCodec
from tito_rl.cassette.format.frames import MAGIC, encode_frame
from tito_rl.cassette.format.index import SessionIndex, encode_index
from tito_rl.cassette.format.records import (
    ENGINE_WIDE,
    FORMAT_VERSION,
    AgentRecord,
    DropRecord,
    EngineEvent,
    EngineRecord,
    Header,
    Record,
    SamplesRecord,
    SessionStart,
    encode_header,
)
from tito_rl.cassette.format.routes import ROUTE_MEMORY_BYTES
from tito_rl.cassette.redaction import Redactor
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange

CASSETTE_SUFFIX = ".tito"


class RecordObserver(Protocol):
    """Sees each record a cassette writer writes, once written, and the cassette's close (`tito record
    --metrics`: the live audit, `tito_rl.replayer.audit.live`)."""

    def record(self, record: Record) -> None: ...

    def close(self) -> None: ...


# The adapter's routing header carries the live session id (often the bearer token) to the engine.
ROUTING_HEADERS = frozenset({"x-smg-routing-key"})


class CassetteWriter:
    """Implements `tito_rl.trajectory.adapters.tap.TrafficTap`; give it to the adapter app to record."""

    def __init__(
        self,
        target: str | os.PathLike[str] | BinaryIO,
        header: Header,
        redactor: Redactor | None = None,
        fsync: bool = False,
        header_redacted: bool = False,
        observer: RecordObserver | None = None,
        route_memory: int | None = ROUTE_MEMORY_BYTES,
    ) -> None:
        """`target`: a new file's path, or an open binary stream (in-memory serialization, vcrpy).
        `header_redacted`: the header was read from a cassette (cut, merge) and is written as it is.
        `observer`: hears every record once written, and the close.
        `route_memory`: the most bytes of a live session's expert routes held in memory; the rest wait for the
        session's next call in an unlinked temporary file beside the cassette (a stream's: in the system's
        temporary folder; `RouteContext`; None: all in memory). The cassette's bytes are the same either way."""
        self.observer = observer
        self.redactor = redactor or Redactor()
        folder = str(Path(target).absolute().parent) if isinstance(target, str | os.PathLike) else None
        self._codec = SessionCodec(route_memory=route_memory, route_folder=folder)
        self._names: dict[str, str] = {}
        self._started: set[str] = set()
        self._lock = threading.Lock()
        self._offset = 0  # bytes written so far: where the next frame starts
        self._index: dict[str, SessionIndex] = {}
        self.header = header if header_redacted else Header(**self.redactor.scrub_json(header.to_dict()))
        self.header = dataclasses.replace(self.header, format_version=FORMAT_VERSION)  # what this writer writes
        if isinstance(target, str | os.PathLike):
            self.path: Path | None = Path(target)
            # "xb": never append to, or clobber, someone else's cassette; buffering=0: one write() per frame.
            self._file: BinaryIO = open(self.path, "xb", buffering=0)  # noqa: SIM115 - closed by close()
            self.fsync = fsync
        else:
            self.path, self._file = None, target
            self.fsync = False
        self._write(MAGIC + encode_header(self.header))

    # TrafficTap

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self.redactor.learn_headers(headers, scope=self._session(session, source))

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        r = self.redactor
        name = self._session(session, source)
        r.learn_headers(exchange.headers, scope=name)
        self._append(
            AgentRecord(
                session=name,
                seq=self._codec.next_seq(name),
                method=exchange.method,
                path=r.scrub_text(exchange.path, name),
                query=r.scrub_query(exchange.query, name),
                headers=self._headers(exchange.headers, name),
                body=r.scrub_bytes(bytes(exchange.body), name),
                status=exchange.status,
                reply_headers=self._headers(exchange.reply_headers, name),
                reply_body=None if exchange.reply_body is None else r.scrub_bytes(bytes(exchange.reply_body), name),
                reply_events=None
                if exchange.reply_events is None
                else [r.scrub_text(e, name) for e in exchange.reply_events],
                started_s=float(exchange.started_s),
                duration_s=float(exchange.duration_s),
                side=exchange.side,
                retry_of=exchange.retry_of,
                turn_index=exchange.turn_index,
            )
        )

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        r = self.redactor
        name = self._session(session, source)
        self.write_engine(
            EngineRecord(
                session=name,
                seq=0,
                method=exchange.method,
                path=r.scrub_text(exchange.path, name),
                request=r.scrub_json(exchange.request, name),
                status=exchange.status,
                response=r.scrub_json(exchange.response, name),
                error=None if exchange.error is None else r.scrub_text(exchange.error, name),
                headers=dict(self._headers(exchange.headers, name)),
                started_s=float(exchange.started_s),
                duration_s=float(exchange.duration_s),
                dialect=exchange.dialect,
                wire=r.scrub_json(answer_wire(exchange.raw, exchange.response, exchange.content_type), name),
                order=None if exchange.order is None else [int(n) for n in exchange.order],
            ),
            redacted=True,
        )

    def engine_event(self, exchange: EngineExchange) -> None:
        """An engine call of no session (a trainer's weight update, pause or abort), written as it is answered
        under `ENGINE_WIDE`, its `order` its place among the sessions' calls (`EngineEvent`)."""
        r = self.redactor
        self._append(
            EngineEvent(
                session=ENGINE_WIDE,
                seq=self._codec.next_seq(ENGINE_WIDE),
                method=exchange.method,
                path=r.scrub_text(exchange.path),
                request=r.scrub_json(exchange.request),
                status=exchange.status,
                response=r.scrub_json(exchange.response),
                error=None if exchange.error is None else r.scrub_text(exchange.error),
                order=[int(n) for n in exchange.order or ()],
                dialect=exchange.dialect,
            )
        )

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        name = self._session(session, source)
        self._append(
            SamplesRecord(
                session=name,
                seq=self._codec.next_seq(name),
                reward=float(reward),
                samples=[self.redactor.scrub_json(dict(s), name) for s in samples],
            )
        )

    def session_dropped(self, session: str, source: str) -> None:
        name = self._session(session, source)
        self._append(DropRecord(session=name, seq=self._codec.next_seq(name)))

    # for in-process integrations (vcrpy) that build engine records themselves

    def write_engine(self, record: EngineRecord, redacted: bool = False) -> None:
        """Append an engine record under its (already safe) session name; the writer assigns `seq`."""
        if not redacted:
            r, name = self.redactor, record.session
            record.request, record.response = r.scrub_json(record.request, name), r.scrub_json(record.response, name)
            record.headers = self._headers(record.headers, name)
            record.extra = r.scrub_json(record.extra, name)
            record.wire = r.scrub_json(record.wire, name)
        self._ensure_started(record.session, "named")
        record.seq = self._codec.next_seq(record.session)
        self._append(record)

    # for tools that copy records between cassettes (cut, merge)

    def append_redacted(self, record: Record) -> None:
        """Append a record read from a cassette as it is, its session name and `seq` kept: it was redacted
        when first written, and a second pass could alter bodies that replay re-sends byte for byte. Deltas
        are re-encoded against the records this writer has written for the session, so a session's records
        must all come, in their order, through here."""
        if isinstance(record, SessionStart):
            self._started.add(record.session)
        self._append(record)

    def close(self) -> None:
        """Write the index, and close the file (a stream target is left open, without an index: vcrpy takes
        its bytes as they are)."""
        with self._lock:
            if self.path is not None and not self._file.closed:
                self._write(encode_index(list(self._index.values()), self._offset))
                self._file.close()
                self._codec.close()  # nothing more is written: live sessions' route files go too
                if self.observer is not None:
                    self.observer.close()

    @property
    def bytes_written(self) -> int:
        """The file's size so far (its index included once closed)."""
        return self._offset

    def __enter__(self) -> CassetteWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # internals

    def _session(self, session: str, source: str) -> str:
        # Keyed by the live id alone: the adapter reports a bearer session's finish with source "api".
        name = self._names.get(session)
        if name is None:
            name = self._names[session] = self.redactor.session_name(session, source)
            self._ensure_started(name, source)
        return name

    def _ensure_started(self, name: str, source: str) -> None:
        if name not in self._started:
            self._started.add(name)
            self._append(SessionStart(session=name, source=source, seq=self._codec.next_seq(name)))

    @overload
    def _headers(self, headers: dict[str, str], session_name: str) -> dict[str, str]: ...

    @overload
    def _headers(self, headers: dict[str, str | list[str]], session_name: str) -> dict[str, str | list[str]]: ...

    def _headers(self, headers: dict[str, Any], session_name: str) -> dict[str, Any]:
        out = self.redactor.headers(headers, session_name)
        for k in out:
            if k.lower() in ROUTING_HEADERS:
                out[k] = session_name
        return out

    def _append(self, record: Record) -> None:
        with self._lock:
            frame = encode_frame(self._codec.encode(record))
            entry = self._index.get(record.session)
            if entry is None:
                entry = self._index[record.session] = SessionIndex(record.session)
            entry.frames.append(self._offset)
            entry.count(record)
            self._write(frame)
            if self.observer is not None:
                self.observer.record(record)

    def _write(self, data: bytes) -> None:
        if self._file.closed:
            raise ValueError(f"cassette {self.path} is closed")
        self._offset += len(data)
        view = memoryview(data)
        while view:  # an unbuffered write may be partial; loop until the whole frame is handed over
            written = self._file.write(view)
            view = view[len(view) if written is None else written :]
        if self.fsync:
            os.fsync(self._file.fileno())


class PerSessionTap:
    """One cassette per session, in a folder: `<session name>.tito`, named as the cassette names it."""

    def __init__(
        self,
        folder: Path,
        header: Header,
        redactor: Redactor | None = None,
        observer: Callable[[Header], RecordObserver] | None = None,
    ) -> None:
        self.folder = folder
        self.header = header
        self.redactor = redactor or Redactor()
        self.observer = observer
        self.writers: dict[str, CassetteWriter] = {}
        self._ended: set[str] = set()
        folder.mkdir(parents=True, exist_ok=True)

    def _writer(self, session: str, source: str) -> CassetteWriter:
        writer = self.writers.get(session)
        if writer is None:
            name = self.redactor.session_name(session, source)
            writer = self.writers[session] = CassetteWriter(
                self.folder / f"{name}{CASSETTE_SUFFIX}", self.header, self.redactor
            )
            if self.observer is not None:
                writer.observer = self.observer(writer.header)
        return writer

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self._writer(session, source).agent_request(session, source, headers)

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        self._writer(session, source).agent_exchange(session, source, exchange)

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        self._writer(session, source).engine_exchange(session, source, exchange)

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self._writer(session, source).session_finished(session, source, reward, samples)
        self._ended.add(session)

    def session_dropped(self, session: str, source: str) -> None:
        self._writer(session, source).session_dropped(session, source)
        self._ended.add(session)

    def engine_event(self, exchange: EngineExchange) -> None:
        """Into the cassette of every session not yet finished: those its update may have touched."""
        for session, writer in self.writers.items():
            if session not in self._ended:
                writer.engine_event(exchange)

    @property
    def bytes_written(self) -> int:
        return sum(w.bytes_written for w in self.writers.values())

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


def open_writer(
    out: Path, header: Header, per_session: bool, observer: Callable[[Header], RecordObserver] | None = None
) -> CassetteWriter | PerSessionTap:
    """The tap that writes `out`: one cassette file, or a folder of one cassette per session; `observer(header)`
    makes each cassette's observer from the header that cassette has."""
    if per_session:
        return PerSessionTap(out, header, observer=observer)
    writer = CassetteWriter(out, header)
    if observer is not None:
        writer.observer = observer(writer.header)
    return writer
