"""The msgpack extension types a cassette stores packed arrays and deltas as (`cassettes/FORMAT.md`, "msgpack
conventions"): their codes, how each is written, and how each is read back."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from tito_rl.cassette.format.budget import DecodeBudget
from tito_rl.cassette.format.deltas import BytesDelta, LogprobColumn, TokenDelta
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.packing import PackedColumn, mask_rle, mask_unrle, pack_f64, unpack_f64, unpack_u32
from tito_rl.cassette.format.routes import B64Ints, IntArray

# msgpack ext type codes.
EXT_U32 = 1  # packed uint32 array -> list[int]
EXT_F64 = 2  # packed float64 array -> list[float]
EXT_TOKEN_DELTA = 3  # u32 common-prefix length + packed uint32 tail, against the session's context
EXT_BYTES_DELTA = 4  # u32 prefix length + u32 suffix length + middle bytes, against the previous body
EXT_MASK_RLE = 5  # u8 first value + packed uint32 run lengths of a 0/1 mask -> list[int]
EXT_LOGPROB_COLUMN = 6  # packed float64 logprobs of `[[lp, output_ids[i], None], ...]`
EXT_B64_INTS = 7  # a base64 string of integers (routes, kept sets) as its items; routes a delta on earlier ones
EXT_INT_ARRAY = 8  # a sample's routes: u8 itemsize, u8 ndim, u32 shape each, then signed little-endian items


def encode_ext(obj: Any) -> Any:
    if isinstance(obj, TokenDelta):
        return msgpack.ExtType(EXT_TOKEN_DELTA, struct.pack("<I", obj.prefix) + obj.tail)
    if isinstance(obj, BytesDelta):
        return msgpack.ExtType(EXT_BYTES_DELTA, struct.pack("<II", obj.prefix, obj.suffix) + obj.middle)
    if isinstance(obj, LogprobColumn):
        return msgpack.ExtType(EXT_LOGPROB_COLUMN, pack_f64(obj.values))
    if isinstance(obj, PackedExt):
        return msgpack.ExtType(obj.code, obj.data)
    if isinstance(obj, B64Ints):
        return msgpack.ExtType(EXT_B64_INTS, obj.payload())
    if isinstance(obj, IntArray):
        return msgpack.ExtType(EXT_INT_ARRAY, obj.payload())
    raise TypeError(f"cannot store {type(obj).__name__} in a cassette")


@dataclass(frozen=True)
class PackedExt:
    code: int
    data: bytes


def decode_ext(code: int, data: bytes, budget: DecodeBudget | None = None, packed_columns: bool = False) -> Any:
    """An extension value decoded. `packed_columns`: packed float64 arrays and run-length masks (a sample's
    logprobs and loss mask) left packed, as `PackedColumn`s."""
    if packed_columns and code == EXT_F64:
        return PackedColumn("f64", bytes(data))
    if packed_columns and code == EXT_MASK_RLE:
        return PackedColumn("mask", bytes(data), budget)
    if code in (EXT_U32, EXT_F64, EXT_MASK_RLE):
        values = (
            unpack_u32(data) if code == EXT_U32 else unpack_f64(data) if code == EXT_F64 else mask_unrle(data, budget)
        )
        return values if budget is None else budget.built_here(values, float if code == EXT_F64 else int)
    if code == EXT_TOKEN_DELTA:
        if len(data) < 4:
            raise CorruptCassetteError("short token delta")
        if (len(data) - 4) % 4:
            raise CorruptCassetteError("token delta tail is not a whole number of uint32")
        return TokenDelta(struct.unpack_from("<I", data)[0], bytes(data[4:]))
    if code == EXT_BYTES_DELTA:
        if len(data) < 8:
            raise CorruptCassetteError("short bytes delta")
        prefix, suffix = struct.unpack_from("<II", data)
        return BytesDelta(prefix, suffix, bytes(data[8:]))
    if code == EXT_LOGPROB_COLUMN:
        return LogprobColumn(unpack_f64(data))
    if code == EXT_B64_INTS:
        return B64Ints.from_payload(data)
    if code == EXT_INT_ARRAY:
        return IntArray.from_payload(data)
    raise CorruptCassetteError(f"unknown msgpack ext type {code}")


def packed_floats(values: list[float]) -> PackedExt:
    return PackedExt(EXT_F64, pack_f64(values))


def packed_mask(values: list[int]) -> PackedExt:
    return PackedExt(EXT_MASK_RLE, mask_rle(values))
