"""The index at the end of a cleanly closed cassette (format version 2 on): each session's frame offsets and
counts, and the fixed-size frame pointing at them, so a reader finds one session, or every session's counts,
without decoding the rest."""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field
from typing import Any

from tito_rl.cassette.format.frames import encode_frame
from tito_rl.cassette.format.packing import BIG_ENDIAN, pack_array
from tito_rl.cassette.format.records import AgentRecord, EngineRecord, SamplesRecord

INDEX = "index"
INDEX_AT = "index_at"
_OFFSET = struct.Struct("<Q")


@dataclass
class SessionIndex:
    """Where one session's frames are (byte offsets, in order) and what they hold."""

    session: str
    frames: array[int] = field(default_factory=lambda: array("Q"))
    agent: int = 0
    engine: int = 0
    samples: int = 0  # sample maps over all its finishes

    def count(self, record: Any) -> None:
        if isinstance(record, AgentRecord):
            self.agent += 1
        elif isinstance(record, EngineRecord):
            self.engine += 1
        elif isinstance(record, SamplesRecord):
            self.samples += len(record.samples)


def encode_index(sessions: list[SessionIndex], end: int) -> bytes:
    """The `index` frame (written at byte `end`, right after the last record) and the `index_at` frame."""
    entries = [
        {
            "session": s.session,
            "agent": s.agent,
            "engine": s.engine,
            "samples": s.samples,
            "frames": pack_array(s.frames, "Q"),
        }
        for s in sessions
    ]
    return encode_frame({"t": INDEX, "end": end, "sessions": entries}) + encode_index_at(end)


def encode_index_at(offset: int) -> bytes:
    """Always `INDEX_AT_BYTES` long (the offset is 8 fixed bytes), so a reader finds it from the file's end."""
    return encode_frame({"t": INDEX_AT, "offset": _OFFSET.pack(offset)})


INDEX_AT_BYTES = len(encode_index_at(0))


def decode_index_at(record: dict[str, Any]) -> int | None:
    offset = record.get("offset")
    if record.get("t") != INDEX_AT or not isinstance(offset, bytes) or len(offset) != _OFFSET.size:
        return None
    at: int = _OFFSET.unpack(offset)[0]
    return at


def decode_index(record: dict[str, Any], end: int) -> list[SessionIndex] | None:
    """The sessions of an `index` record written at byte `end`; None when it is not one (then scan)."""
    if record.get("t") != INDEX or record.get("end") != end or not isinstance(record.get("sessions"), list):
        return None
    out = []
    for entry in record["sessions"]:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("session"), str)
            or not isinstance(entry.get("frames"), bytes)
            or len(entry["frames"]) % _OFFSET.size
        ):
            return None
        counts = [entry.get(k) for k in ("agent", "engine", "samples")]
        agent, engine, samples = (c if isinstance(c, int) and c >= 0 else -1 for c in counts)
        if min(agent, engine, samples) < 0:
            return None
        frames = array("Q")
        frames.frombytes(entry["frames"])
        if BIG_ENDIAN:
            frames.byteswap()
        if any(offset >= end for offset in frames[-1:]):
            return None
        out.append(SessionIndex(entry["session"], frames, agent, engine, samples))
    return out
