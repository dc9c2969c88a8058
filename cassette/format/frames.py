"""Frames: one record each, a small self-checking header and a msgpack payload, zlib-compressed when that
pays. A crash leaves at most one incomplete frame at the end (a truncated tail); flipped bytes anywhere fail a
check instead of decoding into nonsense."""

from __future__ import annotations

import functools
import struct
import zlib
from typing import Any

import msgpack

from tito_rl.cassette.format.budget import DecodeBudget
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.extensions import decode_ext, encode_ext
from tito_rl.cassette.format.fastzlib import crc32, decompressobj

MAGIC = b"TITOCAS\n"
# Frame header: payload length (u32), flags (u8), header check (u16), payload CRC32 (u32), little-endian.
FRAME_HEADER = struct.Struct("<IBHI")
FLAG_ZLIB = 0x01
MAX_FRAME_BYTES = 1 << 30  # a payload, stored or decompressed
COMPRESS_MIN_BYTES = 512
INFLATE_CHUNK = 1 << 20  # a compressed record is inflated, and spent from the decode budget, this much at a time


def _header_check(length: int, flags: int) -> int:
    return zlib.crc32(struct.pack("<IB", length, flags)) & 0xFFFF


def encode_frame(record: dict[str, Any]) -> bytes:
    payload = msgpack.packb(record, default=encode_ext, use_bin_type=True)
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"record of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    flags = 0
    if len(payload) >= COMPRESS_MIN_BYTES:
        packed = zlib.compress(payload, 6)
        if len(packed) < len(payload) * 0.9:  # however well it compresses: reading is bounded (`inflate`)
            payload, flags = packed, FLAG_ZLIB
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"record of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return FRAME_HEADER.pack(len(payload), flags, _header_check(len(payload), flags), crc32(payload)) + payload


def decode_frame_header(data: bytes, offset: int) -> tuple[int, int, int]:
    """(payload length, flags, crc); raises CorruptCassetteError when the header's own check fails."""
    length, flags, check, crc = FRAME_HEADER.unpack(data)
    if check != _header_check(length, flags) or flags & ~FLAG_ZLIB or length > MAX_FRAME_BYTES:
        raise CorruptCassetteError(f"corrupt cassette: bad frame header at byte {offset}")
    return length, flags, crc


def decode_payload(
    payload: bytes | bytearray,
    flags: int,
    crc: int,
    offset: int,
    budget: DecodeBudget | None = None,
    ext_hook: Any = None,
) -> dict[str, Any]:
    """The record map of one frame. `budget` bounds what it decodes to (a reader's, over all it has read; without
    one, this frame's own): a zlib bomb fails as it passes the budget, never inflated whole. `ext_hook`: how to
    decode extension values (default: this format's, into lists and deltas)."""
    if crc32(payload) != crc:
        raise CorruptCassetteError(f"corrupt cassette: checksum mismatch in the record at byte {offset}")
    if budget is None:
        budget = DecodeBudget()
        budget.read(FRAME_HEADER.size + len(payload))
    try:
        if flags & FLAG_ZLIB:
            payload = inflate(payload, budget)
        else:
            budget.spend(len(payload), "a record")
        hook = ext_hook or functools.partial(decode_ext, budget=budget)
        record = msgpack.unpackb(payload, ext_hook=hook, raw=False, strict_map_key=False)
    except CorruptCassetteError as exc:
        raise located(exc, offset) from None
    except Exception as exc:  # zlib.error, msgpack's several exception types
        raise CorruptCassetteError(f"corrupt cassette: undecodable record at byte {offset}: {exc}") from exc
    if not isinstance(record, dict) or not isinstance(record.get("t"), str):
        raise CorruptCassetteError(f"corrupt cassette: the record at byte {offset} has no type")
    return record


def located(exc: CorruptCassetteError, offset: int) -> CorruptCassetteError:
    """The same error, saying so and naming the record's byte offset (each message is one line)."""
    text = str(exc) if str(exc).startswith("corrupt cassette") else f"corrupt cassette: {exc}"
    return CorruptCassetteError(f"{text} (the record at byte {offset})")


def inflate(payload: bytes | bytearray, budget: DecodeBudget) -> bytes | bytearray:
    """zlib-decompressed `payload`, inflated `INFLATE_CHUNK` bytes at a time, each spent from `budget` as it comes:
    a bomb fails one chunk past what the budget had left, in memory the budget bounds, however far it would
    inflate. So the writer may compress any record by any ratio. A record of one chunk (most are) is returned as
    zlib made it; a longer one is gathered in one buffer, never joined from pieces (twice its size)."""
    inflater = decompressobj()
    piece: bytes = inflater.decompress(payload, INFLATE_CHUNK)
    budget.spend(len(piece), "a compressed record")  # past the budget: raises
    if inflater.eof:
        return piece
    out = bytearray(piece)
    while not inflater.eof:
        pending = inflater.unconsumed_tail
        piece = inflater.decompress(pending, INFLATE_CHUNK)
        if not piece and not pending:
            raise CorruptCassetteError("corrupt cassette: a compressed record ends early")
        budget.spend(len(piece), "a compressed record")
        if len(out) + len(piece) > MAX_FRAME_BYTES:
            raise CorruptCassetteError(
                f"corrupt cassette: a compressed record decompresses to more than {MAX_FRAME_BYTES} bytes"
            )
        out += piece
    return out
