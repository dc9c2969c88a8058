"""Per-token channels of engine answers (expert routes, top-p kept sets) stored as the integers they encode, not
as base64 text, and routes as a delta on the rows the session already stored.

Engines send them as base64 strings: SGLang's `meta_info.routed_experts` (raw int32, `[seqlen - 1, layers, top_k]`,
every turn the whole prefix again unless `routed_experts_start_len` cut it), vLLM's `routed_experts` (a `.npy` file,
uint8 or uint16), the kept sets' `top_p_token_ids` / `top_p_token_offsets` (raw int32): text a third larger than
its bytes, 4 bytes an expert id, and a 40-turn session's first rows sent 40 times. Here each string is
stored as `B64Ints` (`cassettes/FORMAT.md`, extension 7): its `.npy` header as sent (none for raw int32), then its
items, the first `keep` of them taken from the session's route context at element `at` (a model routes a prefix
the same in every later turn) and the rest packed as narrow as their values allow. A string whose base64 or items
would not come back byte for byte (another alphabet, line breaks, non-canonical padding, a length that is no
whole number of items) is stored as it came. A row that differs from the stored one simply ends `keep` there: the
rest is stored whole, nothing is assumed."""

from __future__ import annotations

import itertools
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.packing import PackedIds

if TYPE_CHECKING:
    import numpy.typing as npt

# Where the channels sit, walked in this order by the writer and the reader alike (the route context changes as
# each is met): a /generate answer's `meta_info`, then each choice of an OpenAI-style body (vLLM's `routed_experts`,
# then SGLang's `sgl_ext` and `meta_info`), then the body's root `sglext` (SGLang 0.5.23's OpenAI routes), then (a
# stream) each chunk the same way. A place added later only stores what older writers left as text: their cassettes
# hold plain strings there, which the reader passes by.
ROUTE_KEYS = ("routed_experts",)
KEPT_KEYS = ("top_p_token_ids", "top_p_token_offsets", "top_p_kept_token_ids", "top_p_kept_token_offsets")
CHANNEL_KEYS = frozenset((*ROUTE_KEYS, *KEPT_KEYS))
_BASE64_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
MIN_CHARS = 8  # shorter strings are stored as they are: nothing to win
ITEM_SIZES = (1, 2, 4, 8)
_HEAD = struct.Struct("<BBBIII")  # flags, itemsize, width, at, keep, header length
FLAG_ROUTES = 0x01  # reads and extends the session's route context
_NPY_MAGIC = b"\x93NUMPY"
_NPY_DESCR = re.compile(rb"'descr':\s*'([<|])([ui])([1248])'")
_CHUNK = 1 << 20  # elements compared at a time: a mismatch near the start stops early


@dataclass(frozen=True)
class B64Ints:
    """A base64 string of little-endian integers as stored: `header` (a `.npy` header, or empty) then items of
    `itemsize` bytes, the first `keep` equal to the session's route context from element `at` (routes only), the
    rest in `tail`, `width` bytes each (zero-extended back to `itemsize`)."""

    routes: bool
    itemsize: int
    width: int
    at: int
    keep: int
    header: bytes
    tail: bytes

    def payload(self) -> bytes:
        head = _HEAD.pack(
            FLAG_ROUTES if self.routes else 0, self.itemsize, self.width, self.at, self.keep, len(self.header)
        )
        return head + self.header + self.tail

    @classmethod
    def from_payload(cls, data: bytes) -> B64Ints:
        if len(data) < _HEAD.size:
            raise CorruptCassetteError("short base64 integers")
        flags, itemsize, width, at, keep, header_len = _HEAD.unpack_from(data)
        if flags & ~FLAG_ROUTES or itemsize not in ITEM_SIZES or width not in ITEM_SIZES or width > itemsize:
            raise CorruptCassetteError("base64 integers with bad flags or item sizes")
        if not flags & FLAG_ROUTES and (at or keep):
            raise CorruptCassetteError("base64 integers keep route rows outside a route field")
        end = _HEAD.size + header_len
        if end > len(data) or (len(data) - end) % width:
            raise CorruptCassetteError("base64 integers whose header or items do not fit their bytes")
        return cls(
            bool(flags & FLAG_ROUTES), itemsize, width, at, keep, bytes(data[_HEAD.size : end]), bytes(data[end:])
        )

    def decoded_chars(self) -> int:
        """The length of the base64 string it stands for (what resolving it costs the decode budget)."""
        return 4 * -(-(len(self.header) + self.itemsize * (self.keep + len(self.tail) // self.width)) // 3)


ROUTE_MEMORY_BYTES = 1 << 20  # the most of a session's route context tito's writer keeps in memory (below)


@dataclass
class RouteContext:
    """A session's expert routes so far, by element (row-major `[row, layer, k]`, absolute rows from 0), held as
    narrow as their values allow; writer and reader build the same values from the same records.

    A long MoE session's context is large (107k tokens at 48 layers x top 8: 41M elements, a byte each), and a
    recorder holds one per live session. Past `memory_bytes` (None: never, the readers' way) it moves to a
    temporary file in `folder` (None: the system's temporary folder), unlinked as it is made (`TemporaryFile`), so
    nothing is left behind by a close, a crash or a `kill -9`; then it costs no resident memory between calls, and
    a call reads it back `_CHUNK` elements at a time to compare (from the page cache) and writes only its new
    rows. Which elements it holds is the same either way, so the cassette's bytes are too."""

    values: Any = None  # in memory: numpy array of unsigned ints, or None
    memory_bytes: int | None = None
    folder: str | None = None
    # spilled: a raw file of `_size` items of `_dtype` (values is None then)
    _file: Any = field(default=None, init=False, repr=False)
    _size: int = field(default=0, init=False)
    _dtype: Any = field(default=None, init=False)

    def __len__(self) -> int:
        if self._file is not None:
            return self._size
        return 0 if self.values is None else int(self.values.size)

    @property
    def nbytes(self) -> int:
        """The bytes it holds in memory (none once spilled to its file)."""
        return 0 if self.values is None else int(self.values.nbytes)

    @property
    def spilled_bytes(self) -> int:
        """The bytes it holds in its temporary file."""
        return 0 if self._file is None else self._size * self._dtype.itemsize

    @property
    def started(self) -> bool:
        """Whether a route field has set it since it started empty (or was let go)."""
        return self.values is not None or self._file is not None

    def clear(self) -> None:
        self.values = None
        if self._file is not None:
            self._file.close()  # unlinked already: its space goes back with it
            self._file, self._size, self._dtype = None, 0, None

    def common_prefix(self, at: int, values: npt.NDArray[Any]) -> int:
        """How many leading elements of `values` equal the context's from element `at` (at most its length)."""
        if self._file is None:
            return _common_prefix(self.values[at:], values)
        import numpy as np

        n = min(self._size - at, values.size)
        buffer = np.empty(min(n, _CHUNK), self._dtype)
        done = 0
        while done < n:
            end = min(n, done + _CHUNK)
            part = self._read(at + done, buffer[: end - done])
            differs = np.flatnonzero(part != values[done:end])
            if differs.size:
                return done + int(differs[0])
            done = end
        return n

    def copy_into(self, at: int, out: npt.NDArray[Any]) -> None:
        """Its elements `[at, at + len(out))` into `out` (a reader's kept items)."""
        if self._file is None:
            out[:] = self.values[at : at + out.size]
            return
        import numpy as np

        buffer = np.empty(min(out.size, _CHUNK), self._dtype)
        for done in range(0, out.size, _CHUNK):
            end = min(out.size, done + _CHUNK)
            out[done:end] = self._read(at + done, buffer[: end - done])

    def replace(self, keep: int, tail: npt.NDArray[Any], width: int) -> None:
        """Become its first `keep` elements followed by `tail` (items of `width` bytes at most), in the narrowest
        type holding both."""
        import numpy as np

        if self._file is None:
            itemsize = max(width, 1 if self.values is None else self.values.dtype.itemsize)
            big = self.memory_bytes is not None and (keep + tail.size) * itemsize > self.memory_bytes
            if not big or not self._spill(keep, np.dtype(f"<u{itemsize}")):
                self.values = _joined(self.values, keep, tail, width)
                return
        dtype = np.dtype(f"<u{max(width, self._dtype.itemsize)}")
        if dtype != self._dtype:  # a wider id than any before: the kept elements written again, wider
            self._rewrite(keep, dtype)
        self._size = keep
        self._file.truncate(keep * dtype.itemsize)
        for done in range(0, tail.size, _CHUNK):
            self._write_at(self._size, tail[done : done + _CHUNK].astype(dtype, copy=False))
            self._size += min(_CHUNK, tail.size - done)

    # the file

    def _spill(self, keep: int, dtype: Any) -> bool:
        """Its first `keep` elements from memory to a new file (the rest are about to be replaced); False where no
        file can be made (no descriptor left, an unwritable folder): it stays in memory, as readers keep theirs."""
        import numpy as np

        try:
            file = self._new_file()
        except OSError:
            self.memory_bytes = None
            return False
        head = np.empty(0, dtype) if self.values is None else self.values
        self._file, self._size, self._dtype = file, 0, dtype
        for done in range(0, keep, _CHUNK):
            self._write_at(self._size, head[done : min(keep, done + _CHUNK)].astype(dtype, copy=False))
            self._size = min(keep, done + _CHUNK)
        self.values = None
        return True

    def _rewrite(self, keep: int, dtype: Any) -> None:
        import numpy as np

        old, old_dtype = self._file, self._dtype
        self._file, self._size, self._dtype = self._new_file(), 0, dtype
        buffer = np.empty(min(keep, _CHUNK), old_dtype)
        try:
            for done in range(0, keep, _CHUNK):
                end = min(keep, done + _CHUNK)
                part = buffer[: end - done]
                _read_exactly(old, done * old_dtype.itemsize, part)
                self._write_at(done, part.astype(dtype))
                self._size = end
        finally:
            old.close()

    def _new_file(self) -> Any:
        import tempfile

        return tempfile.TemporaryFile(prefix="tito-routes-", dir=self.folder, buffering=0)

    def _read(self, at: int, out: npt.NDArray[Any]) -> npt.NDArray[Any]:
        _read_exactly(self._file, at * self._dtype.itemsize, out)
        return out

    def _write_at(self, at: int, items: npt.NDArray[Any]) -> None:
        self._file.seek(at * self._dtype.itemsize)
        view = items.data.cast("B")
        while view:
            written = self._file.write(view)
            view = view[written:]


def _read_exactly(file: Any, offset: int, out: npt.NDArray[Any]) -> None:
    file.seek(offset)
    view = out.data.cast("B")
    while view:
        got = file.readinto(view)
        if not got:
            raise OSError(f"a route context's temporary file {file.name} is shorter than written")
        view = view[got:]


def is_base64_text(value: Any) -> bool:
    """Whether `value` is a str of the base64 alphabet alone (at C speed: a route string is megabytes)."""
    return isinstance(value, str) and value.isascii() and not value.encode("ascii").translate(None, _BASE64_ALPHABET)


# writing


def encode_channels(context: RouteContext, request: Any, original: Any, response: Any) -> Any:
    """`response` (the engine answer as the codec stores it so far) with its channel strings as `B64Ints`, the
    dicts on the way copied (the caller's record stays as it was). `request` and `original` (the call's request and
    answer as recorded) place a `routed_experts_start_len` answer's rows in the session's context."""
    if not _has_channels(response):
        return response
    response = _copied(response)
    start, rows = _generate_rows(request, original)
    for holder, key, is_route in _fields(response):
        value = holder[key]
        if isinstance(value, str) and len(value) >= MIN_CHARS:
            stored = _encoded(context, value, is_route, start, rows)
            if stored is not None:
                holder[key] = stored
    return response


def _encoded(context: RouteContext, text: str, is_route: bool, start: int, rows: int) -> B64Ints | None:
    import numpy as np
    import pybase64

    try:
        raw = pybase64.b64decode(text, validate=True)
    except ValueError:
        return None
    # Every whole group of 4 characters maps to its 3 bytes one to one; only a padded last group can carry bits the
    # bytes do not (non-canonical padding): compare it once re-encoded.
    if len(raw) % 3 and pybase64.b64encode(raw[len(raw) - len(raw) % 3 :]).decode("ascii") != text[-4:]:
        return None
    header, itemsize = _npy_header(raw)
    items = memoryview(raw)[len(header) :]
    if len(items) % itemsize:
        return None
    values = np.frombuffer(items, dtype=f"<u{itemsize}")
    at, keep = 0, 0
    if is_route and context.started:
        keep = context.common_prefix(0, values)
        if rows > 0 and start > 0 and values.size % rows == 0:  # a start_len answer: its rows from the start row
            where = start * (values.size // rows)
            same = context.common_prefix(where, values) if where <= len(context) else -1
            if same >= keep:  # where its rows belong, unless the start keeps less than 0 does
                at, keep = where, same
    tail = values[keep:]
    width = _width(tail, itemsize)
    if is_route:
        context.replace(at + keep, tail, width)
    return B64Ints(is_route, itemsize, width, at, keep, header, tail.astype(f"<u{width}", copy=False).tobytes())


def _npy_header(raw: bytes) -> tuple[bytes, int]:
    """A `.npy` file's header and its items' size (little-endian or single-byte unsigned or signed ints); else no
    header and int32 items (SGLang's raw arrays)."""
    if raw.startswith(_NPY_MAGIC) and len(raw) >= 10:
        major = raw[6]
        size_at, size_fmt = (8, "<H") if major == 1 else (8, "<I")
        if major in (1, 2, 3) and len(raw) >= size_at + struct.calcsize(size_fmt):
            length = struct.unpack_from(size_fmt, raw, size_at)[0]
            end = size_at + struct.calcsize(size_fmt) + length
            match = _NPY_DESCR.search(raw[:end]) if end <= len(raw) else None
            if match is not None:
                return raw[:end], int(match.group(3))
    return b"", 4


def _width(values: npt.NDArray[Any], itemsize: int) -> int:
    if not values.size:
        return 1
    top = int(values.max())
    return next(w for w in ITEM_SIZES if w >= itemsize or top < 1 << (8 * w))


def _common_prefix(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> int:
    """How many leading elements two arrays share, compared a chunk at a time."""
    import numpy as np

    n = min(a.size, b.size)
    done = 0
    while done < n:
        end = min(n, done + _CHUNK)
        differs = np.flatnonzero(a[done:end] != b[done:end])
        if differs.size:
            return done + int(differs[0])
        done = end
    return n


def _joined(values: Any, keep: int, tail: npt.NDArray[Any], width: int) -> Any:
    """The context's first `keep` elements followed by `tail`, in the narrowest type holding both."""
    import numpy as np

    dtype = np.dtype(f"<u{max(width, 1 if values is None else values.dtype.itemsize)}")
    head = np.empty(0, dtype) if values is None else values[:keep]
    out = np.empty(head.size + tail.size, dtype)
    out[: head.size] = head
    out[head.size :] = tail
    return out


def _generate_rows(request: Any, response: Any) -> tuple[int, int]:
    """A /generate call's `routed_experts_start_len` and the rows its answer should hold from there (prompt plus
    output, less the last sampled token); (0, 0) when either is unknown."""
    if not isinstance(request, dict) or not isinstance(response, dict):
        return 0, 0
    start, prompt, output = (
        request.get("routed_experts_start_len"),
        request.get("input_ids"),
        response.get("output_ids"),
    )
    if type(start) is not int or start <= 0 or not isinstance(prompt, list | PackedIds) or not isinstance(output, list):
        return 0, 0
    return start, len(prompt) + len(output) - 1 - start


# reading


def decode_channels(context: RouteContext, response: Any, spend: Callable[[int, str], Any]) -> Any:
    """`response` with each `B64Ints` resolved to the exact string it was, in the order the writer met them.
    `spend(n, what)` charges the decode budget before a string is built."""
    if not _has_channels(response):
        return response
    for holder, key, _ in _fields(response):
        value = holder[key]
        if isinstance(value, B64Ints):
            holder[key] = _decoded(context, value, spend)
    return response


def _decoded(context: RouteContext, stored: B64Ints, spend: Callable[[int, str], Any]) -> str:
    import numpy as np
    import pybase64

    if stored.at + stored.keep > len(context):
        raise CorruptCassetteError(
            f"base64 integers keep elements [{stored.at}, {stored.at + stored.keep}) of a {len(context)}-element "
            "route context"
        )
    spend(stored.decoded_chars(), "base64 integers")
    tail = np.frombuffer(stored.tail, dtype=f"<u{stored.width}")
    items = np.empty(stored.keep + tail.size, dtype=f"<u{stored.itemsize}")
    if stored.keep:
        context.copy_into(stored.at, items[: stored.keep])
    items[stored.keep :] = tail
    if stored.routes:
        context.replace(stored.at + stored.keep, tail, stored.width)
    return pybase64.b64encode(stored.header + items.tobytes()).decode("ascii")


# where they are


def _has_channels(response: Any) -> bool:
    """A cheap first look: most engine answers carry none."""
    bodies = response if isinstance(response, list) else [response]
    for body in bodies:
        if not isinstance(body, dict):
            continue
        meta = body.get("meta_info")
        if isinstance(meta, dict) and any(k in meta for k in (*ROUTE_KEYS, *KEPT_KEYS)):
            return True
        if isinstance(body.get("sglext"), dict) and "routed_experts" in body["sglext"]:
            return True
        choices = body.get("choices")
        if isinstance(choices, list) and any(
            isinstance(c, dict)
            and (
                "routed_experts" in c
                or isinstance(c.get("sgl_ext"), dict)
                or (isinstance(c.get("meta_info"), dict) and "routed_experts" in c["meta_info"])
            )
            for c in choices
        ):
            return True
    return False


def _fields(response: Any) -> list[tuple[dict[str, Any], str, bool]]:
    found: list[tuple[dict[str, Any], str, bool]] = []
    for body in response if isinstance(response, list) else [response]:
        if not isinstance(body, dict):
            continue
        meta = body.get("meta_info")
        if isinstance(meta, dict):
            found += [(meta, k, k in ROUTE_KEYS) for k in (*ROUTE_KEYS, *KEPT_KEYS) if k in meta]
        choices = body.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            if "routed_experts" in choice:
                found.append((choice, "routed_experts", True))
            for key in ("sgl_ext", "meta_info"):
                ext = choice.get(key)
                if isinstance(ext, dict) and "routed_experts" in ext:
                    found.append((ext, "routed_experts", True))
        root = body.get("sglext")
        if isinstance(root, dict) and "routed_experts" in root:
            found.append((root, "routed_experts", True))
    return found


def _copied(response: Any) -> Any:
    """The response with every dict on the way to a channel copied (a list of chunks: each chunk)."""
    if isinstance(response, list):
        return [_copied(chunk) for chunk in response]
    if not isinstance(response, dict):
        return response
    out = dict(response)
    if isinstance(out.get("meta_info"), dict):
        out["meta_info"] = dict(out["meta_info"])
    if isinstance(out.get("choices"), list):
        out["choices"] = [_copied_choice(c) for c in out["choices"]]
    if isinstance(out.get("sglext"), dict):
        out["sglext"] = dict(out["sglext"])
    return out


def _copied_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    out = dict(choice)
    for key in ("sgl_ext", "meta_info"):
        if isinstance(out.get(key), dict):
            out[key] = dict(out[key])
    return out


# samples


SAMPLE_ROUTES = "rollout_routed_experts"
_ARRAY_HEAD = struct.Struct("<BB")  # itemsize of the signed items, number of dimensions
_SIGNED = {1: "<i1", 2: "<i2", 4: "<i4", 8: "<i8"}


@dataclass(frozen=True)
class IntArray:
    """A sample's expert routes as stored (`cassettes/FORMAT.md`, extension 8): an n-dimensional array of signed
    ints (-1 marks an unknown row) in the narrowest width that holds them, instead of nested lists that msgpack
    writes an int at a time (a 100k-token sample of 48 layers x top 8: 38M ints). `values` is the numpy array."""

    values: Any

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        """What `np.asarray` reads (the audit, given samples left packed)."""
        return self.values if dtype is None else self.values.astype(dtype)

    def tolist(self) -> Any:
        """The nested lists it stands for (what an export writes)."""
        return self.values.tolist()

    def payload(self) -> bytes:
        import numpy as np

        array = self.values
        low, high = (int(array.min()), int(array.max())) if array.size else (0, 0)
        itemsize = next(s for s in (1, 2, 4, 8) if -(1 << (8 * s - 1)) <= low and high < 1 << (8 * s - 1))
        head = _ARRAY_HEAD.pack(itemsize, array.ndim) + struct.pack(f"<{array.ndim}I", *array.shape)
        return head + np.ascontiguousarray(array, dtype=_SIGNED[itemsize]).tobytes()

    @classmethod
    def from_payload(cls, data: bytes) -> IntArray:
        import numpy as np

        if len(data) < _ARRAY_HEAD.size:
            raise CorruptCassetteError("short integer array")
        itemsize, ndim = _ARRAY_HEAD.unpack_from(data)
        end = _ARRAY_HEAD.size + 4 * ndim
        if itemsize not in _SIGNED or not ndim or end > len(data):
            raise CorruptCassetteError("integer array with a bad item size or shape")
        shape = struct.unpack_from(f"<{ndim}I", data, _ARRAY_HEAD.size)
        count = 1
        for n in shape:
            count *= n
        if count * itemsize != len(data) - end:
            raise CorruptCassetteError(f"integer array of shape {list(shape)} does not fit its {len(data) - end} bytes")
        return cls(np.frombuffer(data, dtype=_SIGNED[itemsize], offset=end).reshape(shape))


def packed_sample_routes(value: Any) -> IntArray | None:
    """A sample's routes (an int ndarray, or the nested int lists `Sample.to_dict` gives) as an `IntArray`; None
    where they would not come back exactly as the same nested lists (ragged, not ints, bools, past 64 bits)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return IntArray(value) if value.dtype.kind in "iu" and value.ndim and value.size < 1 << 32 else None
    if not isinstance(value, list) or not value:
        return None
    try:
        array = np.asarray(value)
    except (ValueError, OverflowError, TypeError):
        return None
    if array.dtype.kind != "i" or array.ndim == 0 or array.size >= 1 << 32:  # floats, objects: as they are
        return None
    # every level lists, every leaf an int (not a bool numpy read as one), gathered at C speed
    level: Any = value
    for _ in range(array.ndim - 1):
        if set(map(type, level)) != {list}:
            return None
        level = itertools.chain.from_iterable(level)
    return IntArray(array) if set(map(type, level)) == {int} else None
