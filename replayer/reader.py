"""Reading cassettes: one frame at a time, so a multi-gigabyte recording never sits in memory at once.

An incomplete last frame is what a crash of the recorder leaves behind: the reader stops there, sets
`truncated`, and everything before it replays. Anything else that is wrong (bad magic, checksums, a header
cut short, another format version, another tokenizer) raises its own `CassetteError` subclass.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from recorder.cassette.format import (
    FRAME_HEADER,
    MAGIC,
    AgentRecord,
    CorruptCassetteError,
    DecodeBudget,
    EngineRecord,
    Header,
    Record,
    SamplesRecord,
    SessionCodec,
    SessionStart,
    TokenizerMismatchError,
    TruncatedHeaderError,
    decode_frame_header,
    decode_header,
    decode_payload,
    located,
)


class CassetteReader:
    """Open, validate the header, then iterate `records()`; `truncated` is known once iteration ends."""

    def __init__(self, source: str | os.PathLike[str] | BinaryIO, tokenizer_fingerprint: str | None = None) -> None:
        """`source`: a path, or an open binary stream (which `close()` leaves open)."""
        self.truncated = False
        self.budget = DecodeBudget()  # a hostile file's bombs stop early (recorder/cassette/format.py)
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

    def _read_frame(self) -> dict[str, Any] | None:
        """The next record map; None at a clean end or at a truncated tail (then `truncated` is set)."""
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
        return decode_payload(payload, flags, crc, offset, self.budget)

    def records(self) -> Iterator[Record]:
        codec = SessionCodec(self.budget)
        while (frame := self._read_frame()) is not None:
            yield decode_at(codec, frame, self._offset)

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
    sessions: dict[str, SessionLog]
    truncated: bool


def read_cassette(path: str | os.PathLike[str], tokenizer_fingerprint: str | None = None) -> Cassette:
    """Everything in memory, grouped by session: for tests and small cassettes; stream `records()` otherwise."""
    sessions: dict[str, SessionLog] = {}
    with CassetteReader(path, tokenizer_fingerprint) as reader:
        for record in reader.records():
            log = sessions.setdefault(record.session, SessionLog(record.session))
            if isinstance(record, SessionStart):
                log.source = record.source
            log.records.append(record)
        return Cassette(reader.header, sessions, reader.truncated)


@dataclass
class SessionSummary:
    session: str
    agent_exchanges: int = 0
    engine_exchanges: int = 0
    samples: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"session": self.session, "agent_exchanges": self.agent_exchanges,
                "engine_exchanges": self.engine_exchanges, "samples": self.samples}


@dataclass
class CassetteSummary:
    header: Header
    sessions: list[SessionSummary]
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        return {"header": self.header.to_dict(), "sessions": [s.to_dict() for s in self.sessions],
                "truncated": self.truncated}


def summarize(path: str | os.PathLike[str]) -> CassetteSummary:
    """Counts per session in first-seen order, holding no records."""
    counts: dict[str, SessionSummary] = {}
    with CassetteReader(path) as reader:
        for record in reader.records():
            summary = counts.setdefault(record.session, SessionSummary(record.session))
            if isinstance(record, AgentRecord):
                summary.agent_exchanges += 1
            elif isinstance(record, EngineRecord):
                summary.engine_exchanges += 1
            elif isinstance(record, SamplesRecord):
                summary.samples += len(record.samples)
        return CassetteSummary(reader.header, list(counts.values()), reader.truncated)
