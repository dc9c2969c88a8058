"""Reading cassettes: one frame at a time, so a multi-gigabyte recording never sits in memory at once.

An incomplete last frame is what a crash of the recorder leaves behind: the reader stops there, sets
`truncated`, and everything before it replays. Anything else that is wrong (bad magic, checksums, a header
cut short, another format version, another tokenizer) raises its own `CassetteError` subclass.

`open_cassette` gives a cassette whose sessions are read from the file one at a time, when asked for: each
session's frames are found through the cassette's index (`tito_rl.cassette.format.index`, version 2), or through
one scan of the file where it has none or where every frame must be checked first (`verify`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from tito_rl.cassette.format.budget import DecodeBudget
from tito_rl.cassette.format.codec import SessionCodec
from tito_rl.cassette.format.errors import (
    CassetteError,
    CorruptCassetteError,
    TokenizerMismatchError,
    TruncatedHeaderError,
)
from tito_rl.cassette.format.extensions import decode_ext
from tito_rl.cassette.format.fastzlib import crc32
from tito_rl.cassette.format.frames import FRAME_HEADER, MAGIC, decode_frame_header, decode_payload, located
from tito_rl.cassette.format.index import INDEX, INDEX_AT, INDEX_AT_BYTES, SessionIndex, decode_index, decode_index_at
from tito_rl.cassette.format.records import (
    ENGINE_WIDE,
    AgentRecord,
    DropRecord,
    EngineEvent,
    EngineRecord,
    Header,
    Record,
    SamplesRecord,
    SessionStart,
    decode_header,
)

_INDEX_TYPES = (INDEX, INDEX_AT)


class CassetteReader:
    """Open, validate the header, then iterate `records()`; `truncated` is known once iteration ends."""

    def __init__(self, source: str | os.PathLike[str] | BinaryIO, tokenizer_fingerprint: str | None = None) -> None:
        """`source`: a path, or an open binary stream (which `close()` leaves open)."""
        self.truncated = False
        self.reading_at = 0  # the frame `records_at` reads (where a damaged one was met)
        self._index_end = 0
        self.budget = DecodeBudget()  # a hostile file's bombs stop early (format/budget.py)
        self._offset = 0
        if isinstance(source, str | os.PathLike):
            self.path: Path | str = Path(source)
            self._owned = True
            self._file: BinaryIO = open(self.path, "rb")  # noqa: SIM115 - closed by close()
        else:
            self.path, self._owned, self._file = "<stream>", False, source
        try:
            self.header = self._read_header()
            if tokenizer_fingerprint is not None:
                check_tokenizer(self.header, tokenizer_fingerprint, self.path)
        except BaseException:
            self.close()
            raise

    def _read_header(self) -> Header:
        magic = self._file.read(len(MAGIC))
        if magic != MAGIC:
            if MAGIC.startswith(magic):
                raise TruncatedHeaderError(f"{self.path}: truncated cassette header ({len(magic)} bytes)")
            raise CorruptCassetteError(f"{self.path}: not a tito cassette (bad magic bytes)")
        frame = self._read_frame()
        if frame is None:
            raise TruncatedHeaderError(f"{self.path}: truncated cassette header (the file ends inside it)")
        return decode_header(frame)

    def _read_frame(self, raw: bool = False, packed_columns: bool = False) -> dict[str, Any] | None:
        """The next record map; None at a clean end or at a truncated tail (then `truncated` is set).
        `raw`: extension values (token arrays, deltas) left undecoded, for a scan that only reads the keys.
        `packed_columns`: samples' logprobs and loss masks left packed (`PackedColumn`)."""
        offset = self._file.tell()
        head = self._file.read(FRAME_HEADER.size)
        if not head:
            return None
        if len(head) < FRAME_HEADER.size:
            self.truncated = True
            return None
        length, flags, crc = decode_frame_header(head, offset)
        payload = self._file.read(length)
        if len(payload) < length:
            self.truncated = True
            return None
        self.budget.read(FRAME_HEADER.size + length)
        self._offset = offset
        hook = (
            _raw_ext
            if raw
            else functools.partial(decode_ext, budget=self.budget, packed_columns=True)
            if packed_columns
            else None
        )
        return decode_payload(payload, flags, crc, offset, self.budget, ext_hook=hook)

    def records(
        self, packed_prompts: bool = False, packed_samples: bool = False, release_finished: bool = False
    ) -> Iterator[Record]:
        """The records in file order. `packed_prompts`: /generate prompts as `PackedIds`; `packed_samples`: samples'
        token ids as `PackedIds`, their loss masks and logprobs as `PackedColumn`s: for a pass that views them as
        arrays (each holds the session's whole history or response). `release_finished`: a session's
        delta bases let go at its finish or drop, as the writer does (`SessionCodec.release`), so memory follows
        the sessions live at once, not the cassette's length; a record of a session after its finish is then
        resolved as the writer stored it, whole."""
        codec = SessionCodec(self.budget, packed_prompts, packed_samples)
        while (frame := self._read_frame(packed_columns=packed_samples)) is not None:
            if frame["t"] not in _INDEX_TYPES:  # the index at the end holds no session's record
                record = decode_at(codec, frame, self._offset)
                yield record
                if release_finished and isinstance(record, SamplesRecord | DropRecord):
                    codec.release(record.session)

    def records_at(
        self, entries: Iterable[SessionIndex], packed_prompts: bool = False, packed_samples: bool = False
    ) -> Iterator[tuple[int, Record]]:
        """The records of the sessions `entries` index, in file order, each with its byte offset, decoded as
        `records(...)` decodes them (a session's delta bases let go at its finish or drop), no other session's
        frame read: a work unit's sessions (`tito_rl.replayer.units`)."""
        frames = sorted((offset, entry.session) for entry in entries for offset in entry.frames)
        codec = SessionCodec(self.budget, packed_prompts, packed_samples)
        for offset, session in frames:
            self.reading_at = offset
            self._file.seek(offset)
            frame = self._read_frame(packed_columns=packed_samples)
            if frame is None or frame.get("session") != session:
                raise CorruptCassetteError(
                    f"corrupt cassette: no record of session {session!r} at byte {offset}, where its index says one is"
                )
            record = decode_at(codec, frame, offset)
            yield offset, record
            if isinstance(record, SamplesRecord | DropRecord):
                codec.release(record.session)

    def scan(self) -> dict[str, SessionIndex]:
        """Every frame after the header read and checked (checksums, record maps), each session's frame offsets
        and counts kept, nothing decoded beyond the keys: the index of a cassette that has none."""
        sessions: dict[str, SessionIndex] = {}
        while True:
            offset = self._file.tell()
            frame = self._read_frame(raw=True)
            if frame is None:
                return sessions
            kind = frame["t"]
            if kind in _INDEX_TYPES:
                continue
            name = frame.get("session")
            if not isinstance(name, str):
                raise CorruptCassetteError(f"corrupt cassette: the {kind} record at byte {offset} has no session")
            entry = sessions.get(name)
            if entry is None:
                entry = sessions[name] = SessionIndex(name)
            entry.frames.append(offset)
            if kind == "agent":
                entry.agent += 1
            elif kind == "engine":
                entry.engine += 1
            elif kind == "samples" and isinstance(frame.get("samples"), list):
                entry.samples += len(frame["samples"])

    @property
    def bytes_read(self) -> int:
        """How far into the file reading has got: a long pass's progress (`tito audit`'s bar)."""
        return self._file.tell()

    def records_end(self) -> int:
        """Where the records end: at the stored index, or at the end of the file when there is none."""
        position = self._file.tell()
        if self.stored_index() is not None:
            return self._index_end
        self._file.seek(0, os.SEEK_END)
        end = self._file.tell()
        self._file.seek(position)
        return end

    def stored_index(self) -> dict[str, SessionIndex] | None:
        """The index a clean close wrote at the end of the file; None when there is none (or it does not check
        out: then the cassette is read by scanning). Leaves the file position where it was."""
        position = self._file.tell()
        try:
            self._file.seek(0, os.SEEK_END)
            size = self._file.tell()
            if size < position + INDEX_AT_BYTES:
                return None
            self._file.seek(size - INDEX_AT_BYTES)
            at = self._read_frame()
            end = None if at is None else decode_index_at(at)
            if end is None or not position <= end < size - INDEX_AT_BYTES:
                return None
            self._file.seek(end)
            index = self._read_frame()
            if index is None or self._file.tell() != size - INDEX_AT_BYTES:
                return None
            entries = decode_index(index, end)
            self._index_end = end
            return None if entries is None else {e.session: e for e in entries}
        except CassetteError:
            return None
        finally:
            self.truncated = False
            self._file.seek(position)

    def check_frames(self, end: int, index: dict[str, SessionIndex] | None = None, checksums: bool = True) -> None:
        """Every frame's header check and checksum up to byte `end` (the stored index), nothing decoded; with
        `index`, also that its offsets are the frames' starts (a file re-framed under an old index is refused).
        `checksums=False`: the frame headers alone (their own check), each payload skipped: for a reader that
        checks each payload's checksum as it reads it (a work unit)."""
        starts = []
        while self._file.tell() < end:
            offset = self._file.tell()
            starts.append(offset)
            head = self._file.read(FRAME_HEADER.size)
            if len(head) < FRAME_HEADER.size:
                raise CorruptCassetteError(f"corrupt cassette: the file ends at byte {offset}, before its index")
            length, _, crc = decode_frame_header(head, offset)
            if not checksums:
                self._file.seek(length, os.SEEK_CUR)
            elif crc32(self._file.read(length)) != crc:
                raise CorruptCassetteError(f"corrupt cassette: checksum mismatch in the record at byte {offset}")
        if index is not None and sorted(o for e in index.values() for o in e.frames) != starts:
            raise CorruptCassetteError("corrupt cassette: its index does not match its records")

    def session_index(self) -> dict[str, SessionIndex]:
        """Each session's frames: from the stored index, its offsets checked against the frames' starts (payloads
        not read: a reader checks each checksum as it reads the frame), or from a scan (every frame checked, and
        `truncated` known) where there is none or it does not match them. Call right after opening."""
        start = self._file.tell()
        index = self.stored_index()
        if index is not None:
            try:
                self.check_frames(self._index_end, index, checksums=False)
                return index
            except CassetteError:
                self._file.seek(start)
        return self.scan()

    def read_session(self, entry: SessionIndex, packed_prompts: bool = False) -> SessionLog:
        """One session's records, read at its frames' offsets (deltas never cross sessions). `packed_prompts`:
        /generate input_ids as `PackedIds`."""
        codec = SessionCodec(self.budget, packed_prompts)
        log = SessionLog(entry.session)
        for offset in entry.frames:
            self._file.seek(offset)
            frame = self._read_frame()
            if frame is None or frame.get("session") != entry.session:
                raise CorruptCassetteError(
                    f"corrupt cassette: no record of session {entry.session!r} at byte "
                    f"{offset}, where its index says one is"
                )
            record = decode_at(codec, frame, offset)
            if isinstance(record, SessionStart):
                log.source = record.source
            log.records.append(record)
        return log

    def close(self) -> None:
        if self._owned:
            self._file.close()

    def __enter__(self) -> CassetteReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def decode_at(codec: SessionCodec, frame: dict[str, Any], offset: int) -> Record:
    """The frame's record; a record the format does not allow names its byte offset, as a bad frame does."""
    try:
        return codec.decode(frame)
    except CorruptCassetteError as exc:
        raise located(exc, offset) from None


def check_tokenizer(header: Header, fingerprint: str, path: Path | str = "cassette") -> None:
    if header.tokenizer_fingerprint != fingerprint:
        raise TokenizerMismatchError(
            f"{path}: recorded with tokenizer {header.tokenizer_fingerprint}, but replaying with {fingerprint}; "
            "token ids would not mean the same text. Replay with the recording's tokenizer (--tokenizer)."
        )


def read_header(path: str | os.PathLike[str]) -> Header:
    with CassetteReader(path) as reader:
        return reader.header


@dataclass
class SessionLog:
    """One session's records, in the order they were written, split by kind for convenience."""

    name: str
    source: str = ""
    records: list[Record] = field(default_factory=list)

    @property
    def agent(self) -> list[AgentRecord]:
        return [r for r in self.records if isinstance(r, AgentRecord)]

    @property
    def engine(self) -> list[EngineRecord]:
        return [r for r in self.records if isinstance(r, EngineRecord)]

    @property
    def finishes(self) -> list[SamplesRecord]:
        return [r for r in self.records if isinstance(r, SamplesRecord)]

    @property
    def samples(self) -> list[dict[str, Any]]:
        return [s for f in self.finishes for s in f.samples]


@dataclass
class Cassette:
    header: Header
    sessions: Mapping[str, SessionLog]  # in cassette order (of each session's first record)
    truncated: bool
    # engine calls of no session (version 7: a trainer's weight updates, pauses, aborts), in the order written
    events: list[EngineEvent] = field(default_factory=list)


def sessions_only(index: dict[str, SessionIndex]) -> tuple[dict[str, SessionIndex], SessionIndex | None]:
    """A cassette's index without its engine-wide events' entry (`ENGINE_WIDE`, version 7), and that entry."""
    events = index.get(ENGINE_WIDE)
    if events is None:
        return index, None
    return {name: entry for name, entry in index.items() if name != ENGINE_WIDE}, events


def read_events(reader: CassetteReader, entry: SessionIndex | None) -> list[EngineEvent]:
    """The engine-wide events at the frames `entry` indexes (none for None)."""
    if entry is None:
        return []
    log = reader.read_session(entry)
    return [r for r in log.records if isinstance(r, EngineEvent)]


class StoredSessions(Mapping[str, SessionLog]):
    """A cassette's sessions by name, each read from the file when it is looked up (never kept)."""

    def __init__(
        self, path: str | os.PathLike[str], index: dict[str, SessionIndex], packed_prompts: bool = False
    ) -> None:
        self.path = path
        self.index = index
        self.packed_prompts = packed_prompts

    def __getitem__(self, name: str) -> SessionLog:
        entry = self.index[name]
        with CassetteReader(self.path) as reader:
            return reader.read_session(entry, self.packed_prompts)

    def __iter__(self) -> Iterator[str]:
        return iter(self.index)

    def __len__(self) -> int:
        return len(self.index)


def exchange_count(cassette: Cassette, name: str) -> int:
    """How many agent exchanges session `name` holds, from the index where the cassette is read lazily."""
    sessions = cassette.sessions
    if isinstance(sessions, StoredSessions):
        return sessions.index[name].agent
    return len(sessions[name].agent)


def open_cassette(path: str | os.PathLike[str], verify: bool = True, packed_prompts: bool = False) -> Cassette:
    """The header and the session index now, each session's records when it is looked up. `verify`: check every
    frame's checksum first, so that a damaged file is refused before anything is replayed (a cassette without a
    stored index is scanned, which checks them anyway); otherwise the stored index is trusted and only the
    frames read are checked (`tito inspect --session`). `packed_prompts`: /generate input_ids read as
    `PackedIds`, for a reader that only counts, compares and slices them (replay)."""
    with CassetteReader(path) as reader:
        index = reader.stored_index()
        if index is None:
            index = reader.scan()
        elif verify:
            reader.check_frames(reader._index_end, index)
        sessions, wide = sessions_only(index)
        truncated = reader.truncated
        events = read_events(reader, wide)
        return Cassette(reader.header, StoredSessions(path, sessions, packed_prompts), truncated, events)


def read_cassette(path: str | os.PathLike[str], tokenizer_fingerprint: str | None = None) -> Cassette:
    """Everything in memory, grouped by session: for tests and small cassettes; `open_cassette` otherwise."""
    sessions: dict[str, SessionLog] = {}
    events: list[EngineEvent] = []
    with CassetteReader(path, tokenizer_fingerprint) as reader:
        for record in reader.records():
            if isinstance(record, EngineEvent):
                events.append(record)
                continue
            log = sessions.setdefault(record.session, SessionLog(record.session))
            if isinstance(record, SessionStart):
                log.source = record.source
            log.records.append(record)
        return Cassette(reader.header, sessions, reader.truncated, events)


@dataclass
class SessionSummary:
    session: str
    agent_exchanges: int = 0
    engine_exchanges: int = 0
    samples: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "agent_exchanges": self.agent_exchanges,
            "engine_exchanges": self.engine_exchanges,
            "samples": self.samples,
        }


@dataclass
class CassetteSummary:
    header: Header
    sessions: list[SessionSummary]
    truncated: bool
    events: int = 0  # engine-wide events (version 7)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "header": self.header.to_dict(),
            "sessions": [s.to_dict() for s in self.sessions],
            "truncated": self.truncated,
        }
        if self.events:  # a cassette without any reads as before version 7
            out["engine_events"] = self.events
        return out


def summarize(path: str | os.PathLike[str], verify: bool = True) -> CassetteSummary:
    """Counts per session in first-seen order, holding no records. Every record is decoded (a record the format
    does not allow is refused), except with `verify=False` on a cassette with a stored index: then the index
    answers, after every frame's checksum and its offsets are checked (`tito cassette info` on a large file)."""
    with CassetteReader(path) as reader:
        index = None if verify else reader.stored_index()
        events = 0
        if index is not None:
            reader.check_frames(reader._index_end, index)
            index, wide = sessions_only(index)
            events = len(wide.frames) if wide is not None else 0
        else:  # no index (version 1, a killed recorder): counted as the writer counts them for one
            index = {}
            for record in reader.records():
                if isinstance(record, EngineEvent):
                    events += 1
                else:
                    index.setdefault(record.session, SessionIndex(record.session)).count(record)
        sessions = [SessionSummary(e.session, e.agent, e.engine, e.samples) for e in index.values()]
        return CassetteSummary(reader.header, sessions, reader.truncated, events)


def _raw_ext(code: int, data: bytes) -> msgpack.ExtType:
    return msgpack.ExtType(code, data)
