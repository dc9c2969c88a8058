"""Token ids, logprobs and masks as packed little-endian arrays: how a cassette stores a 150k-token prompt in
4 bytes a token, and compares two of them at memcmp speed."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from tito_rl.cassette.format.budget import DecodeBudget
from tito_rl.cassette.format.errors import CorruptCassetteError

U32_MAX = 0xFFFFFFFF
BIG_ENDIAN = sys.byteorder == "big"
_U32 = struct.Struct("<I")


def pack_array(values: Any, typecode: str) -> bytes:
    arr = values if isinstance(values, array) and values.typecode == typecode else array(typecode, values)
    if BIG_ENDIAN:
        arr = array(typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def unpack_array(data: bytes, typecode: str, what: str) -> list[Any]:
    arr = array(typecode)
    if len(data) % arr.itemsize:
        raise CorruptCassetteError(f"packed {what} array of {len(data)} bytes is not a multiple of {arr.itemsize}")
    arr.frombytes(data)
    if BIG_ENDIAN:
        arr.byteswap()
    return arr.tolist()


def pack_u32(values: list[int] | array[int]) -> bytes:
    return pack_array(values, "I")


def unpack_u32(data: bytes) -> list[int]:
    return unpack_array(data, "I", "uint32")


def pack_f64(values: list[float]) -> bytes:
    return pack_array(values, "d")


def unpack_f64(data: bytes) -> list[float]:
    return unpack_array(data, "d", "float64")


class PackedIds(Sequence[int]):
    """A recorded prompt's token ids left packed (4 bytes a token, as the cassette holds them), for a reader that
    only counts, compares and slices them. A session's prompts each hold its whole history: the 39 of a
    109k-token session are 2M ids, 70 MB as Python ints and 0.1 s to build, 8 MB packed. It equals the list it
    stands for; `tolist()` builds that list."""

    __slots__ = ("packed",)
    __hash__ = None  # type: ignore[assignment]  # equal to a list, which is unhashable

    def __init__(self, packed: bytes) -> None:
        if len(packed) % 4:
            raise CorruptCassetteError(f"packed uint32 array of {len(packed)} bytes is not a multiple of 4")
        self.packed = packed

    def tolist(self) -> list[int]:
        return unpack_u32(self.packed)

    def __len__(self) -> int:
        return len(self.packed) // 4

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return self.tolist()[index]
            return unpack_u32(self.packed[4 * start : 4 * max(start, stop)])
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError("token index out of range")
        return _U32.unpack_from(self.packed, 4 * i)[0]

    def __iter__(self) -> Iterator[int]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedIds):
            return self.packed == other.packed
        if isinstance(other, list):
            return len(other) == len(self) and packed_token_list(other) == self.packed
        return NotImplemented

    def __repr__(self) -> str:
        return f"PackedIds({len(self)} ids)"


class PackedColumn(Sequence[Any]):
    """A sample's loss mask or logprobs left as the cassette stores them, for a reader that views them as arrays
    (the audit, with numpy): a sample's columns span its whole response, tens of thousands of values each, and a
    list of them is built only to be converted back. `kind`: "f64" (packed little-endian float64s) or "mask" (a
    0/1 first value, then packed uint32 run lengths). It equals the list it stands for; `tolist()` builds it."""

    __slots__ = ("kind", "packed", "_length")
    __hash__ = None  # type: ignore[assignment]  # equal to a list, which is unhashable

    def __init__(self, kind: str, packed: bytes, budget: DecodeBudget | None = None) -> None:
        if kind == "f64":
            if len(packed) % 8:
                raise CorruptCassetteError(f"packed float64 array of {len(packed)} bytes is not a multiple of 8")
            self._length = len(packed) // 8
        elif kind == "mask":
            if not packed or packed[0] not in (0, 1):
                raise CorruptCassetteError("bad run-length mask")
            self._length = sum(unpack_u32(packed[1:]))
            if budget is not None:
                budget.spend(4 * self._length, "a run-length mask")  # what building it would cost: bombs still stop
        else:
            raise ValueError(f"unknown packed column kind {kind!r}")
        self.kind, self.packed = kind, packed

    def tolist(self) -> list[Any]:
        return unpack_f64(self.packed) if self.kind == "f64" else mask_unrle(self.packed)

    def runs(self) -> tuple[int, list[int]]:
        """A mask's first value and its run lengths."""
        if self.kind != "mask":
            raise TypeError("only a mask has runs")
        return self.packed[0], unpack_u32(self.packed[1:])

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: Any) -> Any:
        return self.tolist()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedColumn):
            return self.tolist() == other.tolist()
        if isinstance(other, list):
            return len(other) == len(self) and self.tolist() == other
        return NotImplemented

    def __repr__(self) -> str:
        return f"PackedColumn({self.kind}, {len(self)} values)"


def packed_token_list(value: Any) -> bytes | None:
    """Packed bytes when `value` is a list of uint32 token ids, else None (then it is stored verbatim).

    The check runs at C speed (array conversion), which matters on 150k-token prompts; the price is
    that booleans would pass as 0/1, which never happens in JSON token arrays.
    """
    if isinstance(value, PackedIds):
        return value.packed
    if not isinstance(value, list):
        return None
    try:
        return pack_u32(value)
    except (TypeError, OverflowError):
        return None


def is_float_list(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is float for v in value)


def common_prefix_bytes(a: bytes, b: bytes) -> int:
    """Longest common prefix by halving: slice comparisons run at memcmp speed."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def token_prefix_len(a: list[int], b: list[int]) -> int:
    """Common prefix of two token lists, fast on long prompts (compares packed bytes)."""
    return common_prefix_bytes(pack_u32(a), pack_u32(b)) // 4


def packed_prefix_len(a: bytes, b: bytes) -> int:
    return common_prefix_bytes(a, b) // 4


def mask_rle(mask: list[int]) -> bytes:
    runs: list[int] = []
    current, count = (mask[0] if mask else 0), 0
    for v in mask:
        if v == current:
            count += 1
        else:
            runs.append(count)
            current, count = v, 1
    runs.append(count)
    return bytes([mask[0] if mask else 0]) + pack_u32(runs)


def mask_unrle(data: bytes, budget: DecodeBudget | None = None) -> list[int]:
    if not data or data[0] not in (0, 1):
        raise CorruptCassetteError("bad run-length mask")
    runs = unpack_u32(data[1:])
    if budget is not None:
        budget.spend(4 * sum(runs), "a run-length mask")  # checked before the mask is built
    value, out = data[0], []
    for run in runs:
        out.extend([value] * run)
        value ^= 1
    return out
