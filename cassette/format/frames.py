"""Frames: one record each, a small self-checking header and a msgpack payload, zlib-compressed when that
pays. A crash leaves at most one incomplete frame at the end (a truncated tail); flipped bytes anywhere fail a
check instead of decoding into nonsense."""

from __future__ import annotations

import functools
import struct
import zlib
from typing import Any

import msgpack

from tito_rl.cassette.format.budget import MAX_INFLATE_RATIO, DecodeBudget
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.extensions import decode_ext, encode_ext

MAGIC = b"TITOCAS\n"
# Frame header: payload length (u32), flags (u8), header check (u16), payload CRC32 (u32), little-endian.
FRAME_HEADER = struct.Struct("<IBHI")
FLAG_ZLIB = 0x01
MAX_FRAME_BYTES = 1 << 30  # a payload, stored or decompressed
COMPRESS_MIN_BYTES = 512


def _header_check(length: int, flags: int) -> int:
    return zlib.crc32(struct.pack("<IB", length, flags)) & 0xFFFF


def encode_frame(record: dict[str, Any]) -> bytes:
    payload = msgpack.packb(record, default=encode_ext, use_bin_type=True)
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"record of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    flags = 0
    if len(payload) >= COMPRESS_MIN_BYTES:
        packed = zlib.compress(payload, 6)
        if len(packed) < len(payload) * 0.9 and len(payload) <= MAX_INFLATE_RATIO * len(packed):
            payload, flags = packed, FLAG_ZLIB
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"record of {len(payload)} bytes exceeds the {MAX_FRAME_BYTES}-byte frame limit")
    return FRAME_HEADER.pack(len(payload), flags, _header_check(len(payload), flags), zlib.crc32(payload)) + payload


def decode_frame_header(data: bytes, offset: int) -> tuple[int, int, int]:
    """(payload length, flags, crc); raises CorruptCassetteError when the header's own check fails."""
    length, flags, check, crc = FRAME_HEADER.unpack(data)
    if check != _header_check(length, flags) or flags & ~FLAG_ZLIB or length > MAX_FRAME_BYTES:
        raise CorruptCassetteError(f"corrupt cassette: bad frame header at byte {offset}")
    return length, flags, crc


def decode_payload(payload: bytes, flags: int, crc: int, offset: int,
                   budget: DecodeBudget | None = None, ext_hook: Any = None) -> dict[str, Any]:
    """The record map of one frame. `budget` bounds what it decompresses to (a zlib bomb fails, it is never
    inflated whole); without one, a frame may decompress to `MAX_FRAME_BYTES`. `ext_hook`: how to decode
    extension values (default: this format's, into lists and deltas)."""
    if zlib.crc32(payload) != crc:
        raise CorruptCassetteError(f"corrupt cassette: checksum mismatch in the record at byte {offset}")
    try:
        if flags & FLAG_ZLIB:
            limit = min(MAX_INFLATE_RATIO * len(payload), MAX_FRAME_BYTES if budget is None else budget.left())
            payload = inflate(payload, limit)
        if budget is not None:
            budget.spend(len(payload), "a record")
        hook = ext_hook or (decode_ext if budget is None else functools.partial(decode_ext, budget=budget))
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


def inflate(payload: bytes, limit: int) -> bytes:
    """zlib-decompressed `payload`, or a CorruptCassetteError as soon as it passes `limit` bytes."""
    inflater = zlib.decompressobj()
    data = inflater.decompress(payload, limit + 1)
    if len(data) > limit:
        raise CorruptCassetteError(f"corrupt cassette: a compressed record decompresses to more than {limit} bytes")
    if not inflater.eof:
        raise CorruptCassetteError("corrupt cassette: a compressed record ends early")
    return data
