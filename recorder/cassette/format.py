"""Cassette format v1: the one place that knows how a cassette is laid out on disk.

A cassette is the 8-byte magic followed by frames. Each frame carries one msgpack map (a record) behind a
small binary header with its length, a check of that header, and a CRC32 of the payload: a crash leaves at
most one incomplete frame at the end (read as a truncated tail), while flipped bytes anywhere are caught
as corruption instead of being decoded into nonsense. The first frame is always the header record.

Token arrays are stored as packed little-endian uint32 (msgpack ext types), and each prompt as a delta
against the session's previous engine context (previous prompt + its output): a long session costs a few
bytes per new token instead of the whole history per turn. `SessionCodec` owns that per-session state;
the writer and the reader run the same codec, in the same order, so deltas resolve exactly.

Version 2 adds an index at the end of a cleanly closed cassette: an `index` record listing each session's
frame offsets and counts, then a fixed-size `index_at` frame pointing at it, so a reader finds one session, or
every session's counts, without decoding the rest. A cassette without them (version 1, or a recorder that was
killed) is read by scanning, as before.
Spec for humans: `cassettes/FORMAT.md` (keep the two in step).
"""

from __future__ import annotations

import functools
import math
import re
import reprlib
import struct
import sys
import types
import zlib
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Union, get_args, get_origin, get_type_hints

import msgpack

MAGIC = b"TITOCAS\n"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # 2 = 1 + the optional index at the end
# Frame header: payload length (u32), flags (u8), header check (u16), payload CRC32 (u32), little-endian.
FRAME_HEADER = struct.Struct("<IBHI")
FLAG_ZLIB = 0x01
MAX_FRAME_BYTES = 1 << 30  # a payload, stored or decompressed
COMPRESS_MIN_BYTES = 512
# A cassette is untrusted input (it can come from a pull request): what its bytes may decode to is bounded.
DECODE_RATIO = 256  # decoded bytes per stored byte (the committed corpus: under 20; a delta or zlib bomb: more)
DECODE_FLOOR = 16 << 20  # decoded bytes any cassette may reach, whatever its size
MAX_INFLATE_RATIO = 64  # a compressed payload's decompressed size over its stored size (the corpus: under 7)
MAX_NESTING = 64  # lists and maps inside a record (JSON bodies: about a dozen; Python recurses ~1000 deep)

# msgpack ext type codes.
EXT_U32 = 1  # packed uint32 array -> list[int]
EXT_F64 = 2  # packed float64 array -> list[float]
EXT_TOKEN_DELTA = 3  # u32 common-prefix length + packed uint32 tail, against the session's context
EXT_BYTES_DELTA = 4  # u32 prefix length + u32 suffix length + middle bytes, against the previous body
EXT_MASK_RLE = 5  # u8 first value + packed uint32 run lengths of a 0/1 mask -> list[int]
EXT_LOGPROB_COLUMN = 6  # packed float64 logprobs of `[[lp, output_ids[i], None], ...]`

_U32_MAX = 0xFFFFFFFF
_BIG_ENDIAN = sys.byteorder == "big"
_U32 = struct.Struct("<I")


class CassetteError(Exception):
    """Base class: every way a cassette can be unreadable has its own subclass and message."""


class CorruptCassetteError(CassetteError):
    """Bytes that are not what the writer wrote (bad magic, failed checksum, undecodable record)."""


class TruncatedHeaderError(CassetteError):
    """The file ends before its header record is complete: nothing in it can be trusted."""


class UnsupportedVersionError(CassetteError):
    """A cassette written in a format version this tito cannot read."""


class TokenizerMismatchError(CassetteError):
    """Replaying token ids with a different tokenizer than the recording's would silently diverge."""


# --- packed arrays ---------------------------------------------------------------------------------------


def _pack(values: Any, typecode: str) -> bytes:
    arr = values if isinstance(values, array) and values.typecode == typecode else array(typecode, values)
    if _BIG_ENDIAN:
        arr = array(typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def _unpack(data: bytes, typecode: str, what: str) -> list[Any]:
    arr = array(typecode)
    if len(data) % arr.itemsize:
        raise CorruptCassetteError(f"packed {what} array of {len(data)} bytes is not a multiple of {arr.itemsize}")
    arr.frombytes(data)
    if _BIG_ENDIAN:
        arr.byteswap()
    return arr.tolist()


def pack_u32(values: list[int] | array) -> bytes:
    return _pack(values, "I")


def unpack_u32(data: bytes) -> list[int]:
    return _unpack(data, "I", "uint32")


def pack_f64(values: list[float]) -> bytes:
    return _pack(values, "d")


def unpack_f64(data: bytes) -> list[float]:
    return _unpack(data, "d", "float64")


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
            return unpack_u32(self.packed[4 * start:4 * max(start, stop)])
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


@dataclass(frozen=True)
class TokenDelta:
    """A token array as `prefix` tokens of the session's context plus a packed tail (all packed bytes)."""

    prefix: int
    tail: bytes

    def apply(self, base: bytes) -> bytes:
        if 4 * self.prefix > len(base):
            raise CorruptCassetteError(f"token delta keeps {self.prefix} tokens of a {len(base) // 4}-token context")
        return base[: 4 * self.prefix] + self.tail


@dataclass(frozen=True)
class BytesDelta:
    prefix: int
    suffix: int
    middle: bytes

    def apply(self, base: bytes) -> bytes:
        if self.prefix + self.suffix > len(base):
            raise CorruptCassetteError("bytes delta keeps more than its base holds")
        return base[: self.prefix] + self.middle + base[len(base) - self.suffix :]


@dataclass(frozen=True)
class LogprobColumn:
    values: list[float]

    def apply(self, output_ids: list[int]) -> list[list[Any]]:
        if len(output_ids) != len(self.values):
            raise CorruptCassetteError("logprob column and output_ids differ in length")
        return [[lp, tid, None] for lp, tid in zip(self.values, output_ids, strict=True)]


def token_delta(base: bytes, tokens: bytes) -> TokenDelta:
    prefix = packed_prefix_len(base, tokens)
    return TokenDelta(prefix, tokens[4 * prefix :])


def bytes_delta(base: bytes, data: bytes) -> BytesDelta:
    prefix = common_prefix_bytes(base, data)
    rest_base, rest_data = base[prefix:], data[prefix:]
    suffix = common_prefix_bytes(rest_base[::-1], rest_data[::-1])
    return BytesDelta(prefix, suffix, rest_data[: len(rest_data) - suffix])


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


def _default(obj: Any) -> Any:
    if isinstance(obj, TokenDelta):
        return msgpack.ExtType(EXT_TOKEN_DELTA, struct.pack("<I", obj.prefix) + obj.tail)
    if isinstance(obj, BytesDelta):
        return msgpack.ExtType(EXT_BYTES_DELTA, struct.pack("<II", obj.prefix, obj.suffix) + obj.middle)
    if isinstance(obj, LogprobColumn):
        return msgpack.ExtType(EXT_LOGPROB_COLUMN, pack_f64(obj.values))
    if isinstance(obj, _Packed):
        return msgpack.ExtType(obj.code, obj.data)
    raise TypeError(f"cannot store {type(obj).__name__} in a cassette")


@dataclass(frozen=True)
class _Packed:
    code: int
    data: bytes


def _ext_hook(code: int, data: bytes, budget: DecodeBudget | None = None) -> Any:
    if code in (EXT_U32, EXT_F64, EXT_MASK_RLE):
        values = unpack_u32(data) if code == EXT_U32 else unpack_f64(data) if code == EXT_F64 else mask_unrle(
            data, budget)
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
    raise CorruptCassetteError(f"unknown msgpack ext type {code}")


def packed_floats(values: list[float]) -> _Packed:
    return _Packed(EXT_F64, pack_f64(values))


def packed_mask(values: list[int]) -> _Packed:
    return _Packed(EXT_MASK_RLE, mask_rle(values))


# --- frames ----------------------------------------------------------------------------------------------


def _header_check(length: int, flags: int) -> int:
    return zlib.crc32(struct.pack("<IB", length, flags)) & 0xFFFF


def encode_frame(record: dict[str, Any]) -> bytes:
    payload = msgpack.packb(record, default=_default, use_bin_type=True)
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
        hook = ext_hook or (_ext_hook if budget is None else functools.partial(_ext_hook, budget=budget))
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


@dataclass
class DecodeBudget:
    """How much one reader's cassette may decode to: `DECODE_RATIO` bytes per byte read so far (and at least
    `DECODE_FLOOR`), counting decompressed records, delta-resolved prompts and bodies and expanded masks. A
    zlib bomb or a delta bomb (many tiny records each re-using a huge context) stops with one error early,
    in bounded memory and time, instead of decoding without end."""

    stored: int = 0
    decoded: int = 0
    built: dict[int, Any] = field(default_factory=dict)  # id of a list this frame's decoding built -> its items

    def read(self, n: int) -> None:
        self.stored += n
        self.built = {}

    def built_here(self, values: list[Any], items: Any) -> list[Any]:
        """`values`, a list the decoder made from packed bytes, all of type `items` (int, float, or Any for
        data such as logprob triples): known, so not walked again by the record checks."""
        self.built[id(values)] = items
        return values

    def left(self) -> int:
        return max(0, max(DECODE_FLOOR, DECODE_RATIO * self.stored) - self.decoded)

    def spend(self, n: int, what: str) -> None:
        if n > self.left():
            raise CorruptCassetteError(
                f"corrupt cassette: {what} decodes past {DECODE_RATIO}x the {self.stored} bytes read "
                f"({self.decoded + n} bytes; a decompression bomb?)")
        self.decoded += n


# --- records ---------------------------------------------------------------------------------------------


def utc_now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tito_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tito")
    except PackageNotFoundError:
        return "0+unknown"


# `Header.adapter` keys whose absence does not mean today's default but the behaviour from before the setting
# existed: a cassette without `splice` was recorded with every prompt rendered, so it replays unspliced.
# Any other missing key counts as its default (replay builds `AdapterSettings` from the header).
ABSENT_ADAPTER_SETTINGS: dict[str, Any] = {"splice": False}


@dataclass
class Header:
    """What a replay must agree with: the tokenizer, the parsers, the adapter's settings, the engine."""

    tokenizer_fingerprint: str
    created: str = field(default_factory=utc_now_iso)  # pin it for byte-identical cassettes
    format_version: int = FORMAT_VERSION
    tito_version: str = field(default_factory=tito_version)
    parsers: dict[str, Any] = field(default_factory=dict)  # {"reasoning": "qwen3", "tool_call": "qwen25"}
    adapter: dict[str, Any] = field(default_factory=dict)  # adapter settings (threshold, reward policy...)
    agent: dict[str, Any] | None = None  # {"client": "claude-code", "version": "2.1.330"} when known
    engine: dict[str, Any] | None = None  # the engine's /model_info body
    extra: dict[str, Any] = field(default_factory=dict)
    # The system under test between the legs; None: tito's own adapter (every cassette before targets existed).
    target: dict[str, Any] | None = None  # {"kind": "tito"|"http"|"driver", "name", "version", "volatile", ...}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SessionStart:
    """First record of a session: its on-disk name and where the live id came from."""

    session: str
    source: str
    seq: int = 0


@dataclass
class AgentRecord:
    session: str
    seq: int
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    status: int
    reply_headers: dict[str, str]
    reply_body: bytes | None = None
    reply_events: list[str] | None = None
    started_s: float = 0.0
    duration_s: float = 0.0
    side: bool = False
    retry_of: int | None = None
    turn_index: int | None = None


@dataclass
class EngineRecord:
    session: str
    seq: int
    method: str
    path: str
    request: dict[str, Any] | None
    status: int
    response: Any = None
    error: str | None = None
    headers: dict[str, str | list[str]] = field(default_factory=dict)  # a list: vcrpy's repeated header
    started_s: float = 0.0
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. vcrpy's url and response headers


@dataclass
class SamplesRecord:
    """The samples the live run produced at session finish, so a replay can prove it reproduces them."""

    session: str
    seq: int
    reward: float
    samples: list[dict[str, Any]]


@dataclass
class DropRecord:
    """The session was dropped through the session API: forgotten, no samples."""

    session: str
    seq: int


Record = SessionStart | AgentRecord | EngineRecord | SamplesRecord | DropRecord
RECORD_TYPES: dict[str, type] = {
    "session": SessionStart, "agent": AgentRecord, "engine": EngineRecord, "samples": SamplesRecord,
    "drop": DropRecord,
}
_TYPE_NAMES = {cls: name for name, cls in RECORD_TYPES.items()}


def encode_header(header: Header) -> bytes:
    data = header.to_dict()
    if data.get("target") is None:  # tito's own adapter: the header as every cassette before targets had it
        del data["target"]
    return encode_frame({"t": "header", **data})


def decode_header(record: dict[str, Any]) -> Header:
    """Version first: a future format may change everything except the header's `format_version` key."""
    if record.get("t") != "header":
        raise CorruptCassetteError("corrupt cassette: the first record is not a header")
    version = record.get("format_version")
    if version not in READABLE_VERSIONS:
        raise UnsupportedVersionError(
            f"cassette format version {version!r} is not supported (this tito reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        )
    known = {f.name for f in fields(Header)}
    try:
        header = Header(**{k: v for k, v in record.items() if k in known})
    except TypeError as exc:
        raise CorruptCassetteError(f"corrupt cassette: bad header: {exc}") from exc
    check_fields(header, "header")
    return header


# --- what a decoded record may hold ----------------------------------------------------------------------
# Checked once its deltas are resolved, so the code that reads records never meets another type than the
# dataclasses declare; `Any` is msgpack data (str-keyed maps, lists, str, bytes, numbers, bool, nil) nested at
# most MAX_NESTING deep. The values below are the format's own invariants (FORMAT.md).

NON_NEGATIVE = ("seq", "retry_of", "turn_index", "response_length")
TIMINGS = ("started_s", "duration_s")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_LINE_BREAK = re.compile(r"[\r\n\x00]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # in a session name: it is printed to terminals as it is


class TokenId(int):
    """A token id in the record checks: a uint32, as the format packs them (a tokenizer refuses others)."""


# Keys of a /generate request and response, and of a sample, that replay and inspect read: typed too.
REQUEST_KEYS: dict[str, Any] = {"input_ids": list[TokenId], "sampling_params": dict[str, Any]}
RESPONSE_KEYS: dict[str, Any] = {"output_ids": list[TokenId], "meta_info": dict[str, Any]}
SAMPLE_KEYS: dict[str, Any] = {"tokens": list[TokenId], "response_length": int, "loss_mask": list[int],
                               "rollout_log_probs": list[float], "reward": float, "metadata": dict[str, Any]}


def check_fields(record: Any, kind: str, built: Built | None = None) -> None:
    """A CorruptCassetteError naming the first field of `record` (a dataclass) that has another type than
    declared, or breaks a value rule of the format. `built`: the lists the decoder made, by id, with the type
    of their items."""
    built = built or {}
    for name, hint in _hints(type(record)).items():
        value = getattr(record, name)
        if not _fits(value, hint, 0, built):
            raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r}: expected {_named(hint)}, "
                                       f"got {_shown(value)}")
        if name in NON_NEGATIVE and value is not None and value < 0:
            raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r} is negative ({value})")
        if name in TIMINGS and not (math.isfinite(value) and value >= 0):
            raise CorruptCassetteError(f"corrupt cassette: {kind} record field {name!r} is not a time ({value})")
        if name == "status" and not 0 <= value <= 999:
            raise CorruptCassetteError(f"corrupt cassette: {kind} record status {value} is not an HTTP status")
        if name == "session" and _CONTROL.search(value):
            raise CorruptCassetteError(f"corrupt cassette: a session name holds control characters: {value!r}"[:160])
        if name in ("headers", "reply_headers"):
            _check_headers(value, f"{kind} record field {name!r}")
        if name == "method" and not _HEADER_NAME.match(value):  # replay sends it: an HTTP method is a token
            raise CorruptCassetteError(f"corrupt cassette: {kind} record field 'method': not an HTTP method: "
                                       f"{value!r}"[:200])
    parts = [(f"sample {i}", sample, SAMPLE_KEYS) for i, sample in enumerate(getattr(record, "samples", None) or [])]
    for name, keys in (("request", REQUEST_KEYS), ("response", RESPONSE_KEYS)):
        if isinstance(getattr(record, name, None), dict):
            parts.append((name, getattr(record, name), keys))
    for where, part, keys in parts:
        for key, hint in keys.items():
            if key in part and not _fits(part[key], hint, 1, built):
                raise CorruptCassetteError(f"corrupt cassette: {kind} record {where} {key!r}: expected "
                                           f"{_named(hint)}, got {_shown(part[key])}")


def _check_headers(headers: dict[str, Any], where: str) -> None:
    """HTTP header names are tokens and values hold no line break: what was on the wire (replay re-sends them)."""
    for key, value in headers.items():
        values = value if isinstance(value, list) else [value]
        if not _HEADER_NAME.match(key) or any(_LINE_BREAK.search(v) for v in values):
            raise CorruptCassetteError(f"corrupt cassette: {where}: {key!r} is not an HTTP header"[:200])


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


Built = dict[int, Any]
Check = Callable[[Any, int, Built], bool]


def _fits(value: Any, hint: Any, depth: int, built: Built) -> bool:
    return _checker(hint)(value, depth, built)


@functools.cache
def _checker(hint: Any) -> Check:
    """A function telling whether a value is of type `hint`, built once per annotation (reading is hot)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return _is_data
    if origin in (Union, types.UnionType):
        options = tuple(_checker(option) for option in args)
        return lambda v, d, b: any(fits(v, d, b) for fits in options)
    if hint is type(None):
        return lambda v, d, b: v is None
    if hint is float:
        return lambda v, d, b: type(v) is float or type(v) is int
    if hint is TokenId:
        return lambda v, d, b: type(v) is int and 0 <= v <= _U32_MAX
    if origin is dict:
        key, item = _checker(args[0]), _checker(args[1])
        return lambda v, d, b: type(v) is dict and d < MAX_NESTING and all(
            key(k, d, b) and item(x, d + 1, b) for k, x in v.items())
    if origin is list:
        item, number = _checker(args[0]), args[0] if args[0] in (int, float, TokenId) else None
        known = {int: (int,), TokenId: (int,), float: (int, float)}.get(args[0], ())  # built lists whose items fit
        if args[0] is TokenId:  # or a prompt left packed: the format's own uint32 array
            return lambda v, d, b: type(v) is PackedIds or type(v) is list and d < MAX_NESTING and (
                b.get(id(v)) in known or _numbers(v, TokenId) or all(item(x, d + 1, b) for x in v))
        return lambda v, d, b: type(v) is list and d < MAX_NESTING and (
            b.get(id(v)) in known or (number is not None and _numbers(v, number)) or all(item(x, d + 1, b) for x in v))
    return lambda v, d, b: type(v) is hint


def _is_data(value: Any, depth: int, built: Built) -> bool:
    kind = type(value)
    if kind in (str, int, float, bool, bytes, PackedIds) or value is None:
        return True
    if depth >= MAX_NESTING:
        return False
    if kind is list:
        return id(value) in built or _numbers(value, float) or all(_is_data(v, depth + 1, built) for v in value)
    return kind is dict and all(type(k) is str and _is_data(v, depth + 1, built) for k, v in value.items())


def _numbers(values: list[Any], item: Any) -> bool:
    """A list of ints (or, for floats, of numbers) checked at C speed: token lists hold 150k of them."""
    try:
        array({int: "q", TokenId: "I", float: "d"}[item], values)
    except (TypeError, OverflowError):
        return False
    return True


def _named(hint: Any) -> str:
    if get_origin(hint) is None and isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "").replace(f"{__name__}.", "")


def _shown(value: Any) -> str:
    """A short, safe picture of a value: a hostile one can be nested too deep for repr()."""
    shown = reprlib.Repr()
    shown.maxlevel, shown.maxstring, shown.maxother = 3, 40, 40
    return f"{type(value).__name__} {shown.repr(value)}"


def _record_from_dict(record: dict[str, Any]) -> Record:
    cls = RECORD_TYPES.get(record["t"])
    if cls is None:
        raise CorruptCassetteError(f"corrupt cassette: unknown record type {record['t']!r}")
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in record.items() if k in known})
    except TypeError as exc:
        raise CorruptCassetteError(f"corrupt cassette: bad {record['t']} record: {exc}") from exc


# --- the index (version 2) ------------------------------------------------------------------------------

INDEX = "index"
INDEX_AT = "index_at"
_OFFSET = struct.Struct("<Q")


@dataclass
class SessionIndex:
    """Where one session's frames are (byte offsets, in order) and what they hold."""

    session: str
    frames: array = field(default_factory=lambda: array("Q"))
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
    entries = [{"session": s.session, "agent": s.agent, "engine": s.engine, "samples": s.samples,
                "frames": _pack(s.frames, "Q")} for s in sessions]
    return encode_frame({"t": INDEX, "end": end, "sessions": entries}) + encode_index_at(end)


def encode_index_at(offset: int) -> bytes:
    """Always `INDEX_AT_BYTES` long (the offset is 8 fixed bytes), so a reader finds it from the file's end."""
    return encode_frame({"t": INDEX_AT, "offset": _OFFSET.pack(offset)})


INDEX_AT_BYTES = len(encode_index_at(0))


def decode_index_at(record: dict[str, Any]) -> int | None:
    offset = record.get("offset")
    if record.get("t") != INDEX_AT or not isinstance(offset, bytes) or len(offset) != _OFFSET.size:
        return None
    return _OFFSET.unpack(offset)[0]


def decode_index(record: dict[str, Any], end: int) -> list[SessionIndex] | None:
    """The sessions of an `index` record written at byte `end`; None when it is not one (then scan)."""
    if record.get("t") != INDEX or record.get("end") != end or not isinstance(record.get("sessions"), list):
        return None
    out = []
    for entry in record["sessions"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("session"), str) \
                or not isinstance(entry.get("frames"), bytes) or len(entry["frames"]) % _OFFSET.size:
            return None
        counts = [entry.get(k) for k in ("agent", "engine", "samples")]
        if not all(isinstance(c, int) and c >= 0 for c in counts):
            return None
        frames = array("Q")
        frames.frombytes(entry["frames"])
        if _BIG_ENDIAN:
            frames.byteswap()
        if any(offset >= end for offset in frames[-1:]):
            return None
        out.append(SessionIndex(entry["session"], frames, *counts))
    return out


# --- per-session delta state -----------------------------------------------------------------------------


@dataclass
class _SessionState:
    context: bytes = b""  # last engine prompt followed by its output ids, packed
    agent_body: bytes = b""
    seq: int = 0


class SessionCodec:
    """Turns records into frame maps and back, holding each session's delta bases.

    Writer and reader must see the same records in the same order; the format therefore forbids
    reordering frames, and a reader that skips a frame cannot resolve later deltas of that session.
    """

    def __init__(self, budget: DecodeBudget | None = None, packed_prompts: bool = False) -> None:
        """`budget`: what decoding may resolve deltas to (a reader's; none for the writer's own records).
        `packed_prompts`: /generate requests' input_ids decoded as `PackedIds`, not lists (replay's reading)."""
        self._sessions: dict[str, _SessionState] = {}
        self.budget = budget
        self.packed_prompts = packed_prompts

    def _state(self, session: str) -> _SessionState:
        return self._sessions.setdefault(session, _SessionState())

    def next_seq(self, session: str) -> int:
        state = self._state(session)
        seq = state.seq
        state.seq += 1
        return seq

    # encoding

    def encode(self, record: Record) -> dict[str, Any]:
        # Shallow on purpose: asdict() would deep-copy every token list of a long session.
        data = {"t": _TYPE_NAMES[type(record)], **{f.name: getattr(record, f.name) for f in fields(record)}}
        state = self._state(record.session)
        if isinstance(record, AgentRecord):
            body = bytes(record.body)
            data["body"] = bytes_delta(state.agent_body, body)
            state.agent_body = body
        elif isinstance(record, EngineRecord):
            data["request"], data["response"] = self._encode_engine(state, record.request, record.response)
        elif isinstance(record, SamplesRecord):
            data["samples"] = [self._encode_sample(state, s) for s in record.samples]
        if isinstance(record, SamplesRecord | DropRecord):
            # The session ended: its delta bases (a long session's context and last body, ~1 MB) are let go, so a
            # recorder running for days holds only what its live sessions need. A record of the session after
            # this one is stored whole (a delta on an empty base), which any reader resolves as before.
            state.context, state.agent_body = b"", b""
        return data

    def held_bytes(self) -> int:
        """The delta bases held for all sessions, in bytes."""
        return sum(len(s.context) + len(s.agent_body) for s in self._sessions.values())

    @staticmethod
    def _encode_engine(state: _SessionState, request: Any, response: Any) -> tuple[Any, Any]:
        packed_in = packed_token_list(request.get("input_ids")) if isinstance(request, dict) else None
        if packed_in is not None:
            request = {**request, "input_ids": token_delta(state.context, packed_in)}
            state.context = packed_in
        packed_out = packed_token_list(response.get("output_ids")) if isinstance(response, dict) else None
        if packed_out is not None:
            output_ids = response["output_ids"]
            if packed_in is not None:
                state.context = state.context + packed_out
            response = {**response, "output_ids": _Packed(EXT_U32, packed_out)}
            meta = response.get("meta_info")
            if isinstance(meta, dict) and _is_logprob_triples(meta.get("output_token_logprobs"), output_ids):
                column = LogprobColumn([t[0] for t in meta["output_token_logprobs"]])
                response["meta_info"] = {**meta, "output_token_logprobs": column}
        return request, response

    @staticmethod
    def _encode_sample(state: _SessionState, sample: dict[str, Any]) -> dict[str, Any]:
        out = dict(sample)
        packed = packed_token_list(sample.get("tokens"))
        if packed is not None:
            out["tokens"] = token_delta(state.context, packed)
        mask = sample.get("loss_mask")
        if isinstance(mask, list) and all(type(v) is int and v in (0, 1) for v in mask):
            out["loss_mask"] = packed_mask(mask)
        if is_float_list(sample.get("rollout_log_probs")):
            out["rollout_log_probs"] = packed_floats(sample["rollout_log_probs"])
        return out

    # decoding

    def decode(self, data: dict[str, Any]) -> Record:
        record = _record_from_dict(data)
        if not isinstance(getattr(record, "session", None), str) or type(record.seq) is not int:
            raise CorruptCassetteError("corrupt cassette: a record without a session name or seq")
        state = self._state(record.session)
        state.seq = max(state.seq, record.seq + 1)
        if isinstance(record, AgentRecord):
            if isinstance(record.body, BytesDelta):
                record.body = self._spent(record.body.apply(state.agent_body), "an agent body")
            state.agent_body = record.body if isinstance(record.body, bytes) else b""
        elif isinstance(record, EngineRecord):
            record.request, record.response = self._decode_engine(state, record.request, record.response)
        elif isinstance(record, SamplesRecord) and isinstance(record.samples, list):
            for sample in record.samples:
                if isinstance(sample, dict) and isinstance(sample.get("tokens"), TokenDelta):
                    sample["tokens"] = self._built(unpack_u32(self._spent(sample["tokens"].apply(state.context),
                                                                          "a sample")))
        check_fields(record, data["t"], self.budget.built if self.budget is not None else None)
        return record

    def _spent(self, data: bytes, what: str) -> bytes:
        if self.budget is not None:
            self.budget.spend(len(data), what)
        return data

    def _built(self, values: list[Any], items: Any = int) -> list[Any]:
        return values if self.budget is None else self.budget.built_here(values, items)

    def _decode_engine(self, state: _SessionState, request: Any, response: Any) -> tuple[Any, Any]:
        resolved = False
        if isinstance(request, dict) and isinstance(request.get("input_ids"), TokenDelta):
            state.context = self._spent(request["input_ids"].apply(state.context), "a prompt")
            request["input_ids"] = (PackedIds(state.context) if self.packed_prompts
                                    else self._built(unpack_u32(state.context)))
            resolved = True
        # Packable exactly when the writer packed them (and extended its context with them).
        packed_out = packed_token_list(response.get("output_ids")) if isinstance(response, dict) else None
        if packed_out is not None:
            if resolved:
                state.context = state.context + packed_out
            meta = response.get("meta_info")
            if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), LogprobColumn):
                triples = meta["output_token_logprobs"].apply(response["output_ids"])
                meta["output_token_logprobs"] = self._built(triples, Any)
        return request, response


def _is_logprob_triples(value: Any, output_ids: list[int]) -> bool:
    """Only the exact `[float, output_ids[i], None]` shape is stored as a column, so decoding is lossless."""
    if not isinstance(value, list) or len(value) != len(output_ids):
        return False
    return all(
        isinstance(t, list) and len(t) == 3 and type(t[0]) is float and t[1] == tid and type(t[1]) is int
        and t[2] is None
        for t, tid in zip(value, output_ids, strict=True)
    )
