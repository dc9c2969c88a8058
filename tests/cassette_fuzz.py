"""A seeded fuzzer for the cassette reader: committed cassettes, mutated the ways a hostile pull request could
(truncations, flipped bytes, huge declared lengths and counts, deep nesting, zlib and delta bombs, wrong types
and out-of-range values in every field of every record type, frames dropped, doubled or swapped), each read
in full by `CassetteReader`. Every case must end in the records, or in one `CassetteError` of one line, in
bounded time and memory: anything else is a finding.

Mutations work on the decoded frames and re-frame them with valid checksums, so they reach the decoder and
the record checks instead of stopping at a CRC. `tests/test_cassette_fuzz.py` runs it in CI; `python -m
tests.cassette_fuzz --docs docs/cassettes.md` writes its figures (cases, outcomes by kind, peak memory) there.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import random
import re
import resource
import struct
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import msgpack

from benchmarks.host_steal import steal_watch
from tito_rl.cassette.format.errors import CassetteError
from tito_rl.cassette.format.extensions import (
    EXT_B64_INTS,
    EXT_BYTES_DELTA,
    EXT_F64,
    EXT_LOGPROB_COLUMN,
    EXT_MASK_RLE,
    EXT_TOKEN_DELTA,
    EXT_U32,
)
from tito_rl.cassette.format.frames import FLAG_ZLIB, FRAME_HEADER, MAGIC
from tito_rl.cassette.format.packing import pack_u32
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import CassetteReader
from tito_rl.cassette.writer import CassetteWriter

ROOT = Path(__file__).resolve().parent.parent
BASES = ("openai_wires", "client_abort", "drift_realign")  # every record type, both wires' shapes, an abort
SEED = 20240624
CASES = 3000
DOCS_START, DOCS_END = "<!-- fuzz-figures:start -->", "<!-- fuzz-figures:end -->"


# --- frames ------------------------------------------------------------------------------------------------


@dataclass
class Frame:
    record: dict[str, Any]  # msgpack map with ext types kept as msgpack.ExtType
    compress: bool


def parse(data: bytes) -> list[Frame]:
    frames, offset = [], len(MAGIC)
    while offset < len(data):
        length, flags, _, _ = FRAME_HEADER.unpack_from(data, offset)
        payload = data[offset + FRAME_HEADER.size : offset + FRAME_HEADER.size + length]
        offset += FRAME_HEADER.size + length
        raw = zlib.decompress(payload) if flags & FLAG_ZLIB else payload
        frames.append(
            Frame(
                msgpack.unpackb(raw, ext_hook=msgpack.ExtType, raw=False, strict_map_key=False), bool(flags & FLAG_ZLIB)
            )
        )
    return frames


def frame(payload: bytes, flags: int = 0, length: int | None = None) -> bytes:
    """A frame whose header check and CRC hold, so the reader decodes its payload."""
    n = len(payload) if length is None else length
    check = zlib.crc32(struct.pack("<IB", n, flags)) & 0xFFFF
    return FRAME_HEADER.pack(n, flags, check, zlib.crc32(payload)) + payload


def pack(record: Any) -> bytes:
    return msgpack.packb(record, use_bin_type=True)


def with_raw(record: dict[str, Any], key: str, raw: bytes) -> bytes:
    """`record` packed with one more entry, `key`, whose value is the msgpack bytes `raw` as they are."""
    n = len(record) + 1
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
    return head + b"".join(pack(k) + pack(v) for k, v in record.items()) + pack(key) + raw


def assemble(frames: Sequence[Frame | bytes]) -> bytes:
    out = [MAGIC]
    for f in frames:
        if isinstance(f, bytes):
            out.append(f)
        else:
            payload = pack(f.record)
            out.append(frame(zlib.compress(payload), FLAG_ZLIB) if f.compress else frame(payload))
    return b"".join(out)


@cache
def base(name: str) -> tuple[bytes, tuple[Frame, ...]]:
    data = (ROOT / "cassettes" / f"{name}.tito").read_bytes()
    return data, tuple(parse(data))


def frames_of(name: str) -> list[Frame]:
    """A fresh copy to mutate."""
    return [
        Frame(msgpack.unpackb(pack(f.record), ext_hook=msgpack.ExtType, raw=False, strict_map_key=False), f.compress)
        for f in base(name)[1]
    ]


# --- mutations ---------------------------------------------------------------------------------------------


def odd_values(rng: random.Random) -> list[Any]:
    """Values of every msgpack type, and of types the format never puts where they land."""
    return [
        None,
        True,
        False,
        0,
        -1,
        2**63,
        -(2**63),
        2**64 - 1,
        1.5,
        math.nan,
        math.inf,
        "",
        "x" * 300,
        "\x00",
        b"",
        b"\xff" * 9,
        [],
        [1, "two", None],
        {},
        {"k": b"v"},
        {"nested": {"deeper": [[[]]]}},
        msgpack.ExtType(EXT_U32, pack_u32([1, 2, 3])),
        msgpack.ExtType(EXT_TOKEN_DELTA, b"\0\0\0\0"),
        msgpack.ExtType(EXT_BYTES_DELTA, b"\0" * 8),
        msgpack.ExtType(EXT_LOGPROB_COLUMN, b"\0" * 8),
        msgpack.ExtType(EXT_B64_INTS, bytes([1, 4, 1]) + struct.pack("<III", 0, 0, 0) + b"\1\2\3\4"),
        msgpack.ExtType(99, b""),
        [rng.random() for _ in range(3)],
    ]


BAD_VALUES: dict[str, list[Any]] = {
    "seq": [-1, 2**63],
    "status": [-1, 1000, 2**40],
    "retry_of": [-1, 2**62],
    "turn_index": [-7],
    "started_s": [math.nan, math.inf, -1.0],
    "duration_s": [math.nan, -0.5],
    "reward": [math.nan, math.inf],
    "session": ["", "../../escape", "/etc/passwd", "a\r\nb", "<script>alert(1)</script>", "é" * 200],
    "format_version": [0, 2, "1", None],
    "tokenizer_fingerprint": ["", "sha256:" + "0" * 64],
    "method": ["", "GET\r\n"],
    "path": ["", "/../../x", "\x00"],
    "source": ["", "named", "x" * 500],
    "headers": [{"x-a": "b\r\nInjected: 1"}, {"": ""}, {"authorization": "Bearer " + "z" * 2000}],
}


def mutate_truncate(rng: random.Random, name: str) -> bytes:
    data = base(name)[0]
    return data[: rng.randrange(len(data))]


def mutate_flip(rng: random.Random, name: str) -> bytes:
    data = bytearray(base(name)[0])
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] ^= rng.randint(1, 255)
    return bytes(data)


def mutate_frame_length(rng: random.Random, name: str) -> bytes:
    frames = frames_of(name)
    i = rng.randrange(len(frames))
    payload = pack(frames[i].record)
    length = rng.choice([len(payload) + 1, 2**20, 2**30, 2**30 + 1, 2**32 - 1])
    return assemble([*frames[:i], frame(payload, 0, length), *frames[i + 1 :]])


def mutate_msgpack_length(rng: random.Random, name: str) -> bytes:
    frames = frames_of(name)
    i = rng.randrange(1, len(frames))
    declared = rng.choice([b"\xdf", b"\xdd", b"\xdb", b"\xc6", b"\xc9"]) + b"\xff\xff\xff\xff"
    payload = with_raw(frames[i].record, "field", declared + b"\x01" * rng.randint(0, 64))
    return assemble([*frames[:i], frame(payload), *frames[i + 1 :]])


def nested(depth: int, rng: random.Random) -> bytes:
    opener = rng.choice([b"\x91", b"\x81\xa1k"])  # a one-item array, or a one-key map
    return opener * depth + b"\xc0"


def mutate_nesting(rng: random.Random, name: str) -> bytes:
    frames = frames_of(name)
    i = rng.randrange(1, len(frames))
    record = dict(frames[i].record)
    key = rng.choice([k for k in record if k != "t"] or ["extra"])
    record.pop(key, None)
    depth = rng.choice([30, 63, 64, 65, 200, 1000, 1100, 100_000])
    payload = with_raw(record, key, nested(depth, rng))
    return assemble([*frames[:i], frame(payload), *frames[i + 1 :]])


@cache
def zlib_bomb(size: int) -> bytes:
    """A valid zlib stream of a record's start and then `size` zero bytes, about 1000 times smaller: one
    fully flushed block of 1 MiB of zeros compresses to the same bytes each time, so it is repeated."""
    squeeze, chunk = zlib.compressobj(9), bytes(1 << 20)
    start = pack({"t": "engine", "session": "s", "seq": 0})[:-1]
    head = squeeze.compress(start) + squeeze.flush(zlib.Z_FULL_FLUSH)
    block = squeeze.compress(chunk) + squeeze.flush(zlib.Z_FULL_FLUSH)
    check = zlib.adler32(start)
    for _ in range(size >> 20):
        check = zlib.adler32(chunk, check)
    end = squeeze.flush()
    return head + block * (size >> 20) + end[:-4] + struct.pack(">I", check)


def mutate_zlib_bomb(rng: random.Random, name: str) -> bytes:
    frames = frames_of(name)
    i = rng.randrange(1, len(frames))
    payload = zlib_bomb(rng.choice([16 << 20, 64 << 20, 1 << 30]))
    if rng.random() < 0.3:  # a stream cut short, or one with junk after its end
        payload = payload[: rng.randrange(2, len(payload))] if rng.random() < 0.5 else payload + b"junk"
    return assemble([*frames[:i], frame(payload, FLAG_ZLIB), *frames[i + 1 :]])


def mutate_delta_bomb(rng: random.Random, name: str) -> bytes:
    """Deltas that decode to far more than they store: runs, prefixes, or one context re-used many times."""
    frames = frames_of(name)
    header, start = frames[0], Frame({"t": "session", "session": "s", "source": "bearer", "seq": 0}, False)
    choice = rng.randrange(4)
    if choice == 0:  # a loss mask of 2^40 entries
        mask = msgpack.ExtType(EXT_MASK_RLE, b"\1" + pack_u32([0xFFFFFFFF] * 256))
        sample = {"tokens": [1], "response_length": 1, "loss_mask": mask, "rollout_log_probs": [0.0]}
        bomb = [Frame({"t": "samples", "session": "s", "seq": 1, "reward": 1.0, "samples": [sample]}, False)]
    elif choice == 1:  # a prompt keeping more of the context than there is
        delta = msgpack.ExtType(EXT_TOKEN_DELTA, struct.pack("<I", rng.choice([1, 2**20, 2**32 - 1])))
        bomb = [Frame(engine_record(1, {"input_ids": delta}), False)]
    elif choice == 2:  # an agent body keeping more of the last one than it had
        body = msgpack.ExtType(EXT_BYTES_DELTA, struct.pack("<II", 2**31, 2**31))
        bomb = [Frame(agent_record(1, body), False)]
    else:  # one 16k-token context, then thousands of tiny prompts that each resolve all of it
        tail = msgpack.ExtType(EXT_TOKEN_DELTA, struct.pack("<I", 0) + pack_u32(list(range(16_000))))
        again = msgpack.ExtType(EXT_TOKEN_DELTA, struct.pack("<I", 16_000))
        bomb = [Frame(engine_record(1, {"input_ids": tail}), False)] + [
            Frame(engine_record(n, {"input_ids": again}), False) for n in range(2, 2000)
        ]
    return assemble([header, start, *bomb])


def engine_record(seq: int, request: dict[str, Any]) -> dict[str, Any]:
    return {
        "t": "engine",
        "session": "s",
        "seq": seq,
        "method": "POST",
        "path": "/generate",
        "request": request,
        "status": 200,
        "response": {"text": ""},
    }


def agent_record(seq: int, body: Any) -> dict[str, Any]:
    return {
        "t": "agent",
        "session": "s",
        "seq": seq,
        "method": "POST",
        "path": "/v1/messages",
        "query": "",
        "headers": {},
        "body": body,
        "status": 200,
        "reply_headers": {},
    }


def mutate_wrong_type(rng: random.Random, name: str) -> bytes:
    """Any record type, any field (or `t`, or a missing one, or a new one), any value of another type."""
    frames = frames_of(name)
    target = rng.choice(frames)
    record = target.record
    fields_here = list(record)
    action = rng.random()
    if action < 0.1 and len(fields_here) > 1:
        del record[rng.choice([k for k in fields_here if k != "t"])]
    else:
        key = rng.choice(fields_here) if action < 0.9 else rng.choice(["surprise", "t"])
        value = rng.choice(odd_values(rng))
        inner = record.get(key)
        if isinstance(inner, dict) and inner and rng.random() < 0.5:  # one level down: request, response, ...
            inner[rng.choice(list(inner))] = value
        elif isinstance(inner, list) and inner and isinstance(inner[0], dict) and rng.random() < 0.5:
            inner[0][rng.choice(list(inner[0]) or ["x"])] = value  # a sample's field
        else:
            record[key] = value
    return assemble(frames)


def mutate_bad_value(rng: random.Random, name: str) -> bytes:
    """Values of the right type that the format does not allow (or that later code could trip on)."""
    frames = frames_of(name)
    ids = [f.record["request"] for f in frames if isinstance(f.record.get("request"), dict)]
    if ids and rng.random() < 0.15:  # token ids a tokenizer cannot decode
        rng.choice(ids)["input_ids"] = rng.choice([[-1], [2**32], [1, 2**40], [0.5]])
        return assemble(frames)
    candidates = [(f, k) for f in frames for k in f.record if k in BAD_VALUES]
    target, key = rng.choice(candidates)
    value = rng.choice(BAD_VALUES[key])
    if key == "session":  # a session name is the same in all of its records
        old = target.record["session"]
        for f in frames:
            if f.record.get("session") == old:
                f.record["session"] = value
    else:
        target.record[key] = value
    return assemble(frames)


def mutate_frames(rng: random.Random, name: str) -> bytes:
    frames: list[Frame | bytes] = list(frames_of(name))
    i, j = rng.randrange(len(frames)), rng.randrange(len(frames))
    choice = rng.randrange(4)
    if choice == 0:
        frames[i], frames[j] = frames[j], frames[i]
    elif choice == 1:
        frames.insert(i, frames[j])
    elif choice == 2:
        del frames[i]
    else:
        frames.insert(i, frame(rng.randbytes(rng.randint(0, 64))))  # garbage with a valid CRC
    return assemble(frames)


def mutate_ext(rng: random.Random, name: str) -> bytes:
    frames = frames_of(name)
    target = rng.choice(frames[1:])
    key = rng.choice([k for k in target.record if k != "t"])
    code = rng.choice(
        [EXT_U32, EXT_F64, EXT_TOKEN_DELTA, EXT_BYTES_DELTA, EXT_MASK_RLE, EXT_LOGPROB_COLUMN, EXT_B64_INTS, 0, 127]
    )
    target.record[key] = msgpack.ExtType(code, rng.randbytes(rng.choice([0, 1, 3, 5, 7, 9, 33])))
    return assemble(frames)


# --- per-token channels: engine answers with expert routes and kept sets (format version 5) -------------------

CHANNEL_KINDS = (
    "random",
    "prefix",
    "start_len",
    "differing_row",
    "vllm",
    "vllm_wide",
    "openai_stream",
    "openai_root",
    "kept",
    "odd",
)


def channel_records(rng: random.Random, session: str, kind: str, turns: int = 5) -> list[EngineRecord]:
    """One session's engine calls whose answers carry per-token channels, as each engine sends them: `random`
    (routes unrelated from turn to turn), `prefix` (SGLang, the whole prefix again each turn), `start_len` (only the
    rows from `routed_experts_start_len`), `differing_row` (a prefix row that changed since the turn before), `vllm`
    and `vllm_wide` (`.npy`, uint8 and uint16), `openai_stream` (SGLang's chat chunks,
    `sgl_ext`), `openai_root` (SGLang 0.5.23: the root `sglext`, streamed in a chunk of its own with `choices: []`,
    or a choice's `meta_info`), `kept` (top-p kept sets), `odd` (strings the format cannot store as integers:
    stored as they came)."""
    import base64

    import numpy as np

    from tests.route_channels import MoeShape, kept_sets, route_rows, sglang_routes, vllm_routes

    shape = MoeShape(3, 2, 300 if kind == "vllm_wide" else 16)
    records, prompt, had = [], [rng.randrange(1000) for _ in range(rng.randint(1, 30))], 0
    for turn in range(turns):
        out = [rng.randrange(1000) for _ in range(rng.randint(1, 12))]
        seq = prompt + out
        rows = route_rows(seq, shape)
        request: dict[str, Any] = {"input_ids": prompt, "return_routed_experts": True}
        meta: dict[str, Any] = {"finish_reason": {"type": "stop"}}
        dialect: str | None = None
        response: Any = None  # a /generate body, an OpenAI answer, or a stream's chunks
        if kind == "random":
            raw = rng.randbytes(4 * shape.row * rng.randint(0, 20))
            meta["routed_experts"] = base64.b64encode(raw).decode()
        elif kind in ("prefix", "start_len"):
            start = min(had, len(prompt)) if kind == "start_len" and turn else 0
            if start:
                request["routed_experts_start_len"] = start
            meta["routed_experts"] = sglang_routes(seq, shape, start, rows)
        elif kind == "differing_row":
            changed = rows.copy()
            if turn:
                changed[rng.randrange(len(seq) - 1)] = (changed[0] + 1) % shape.experts
            meta["routed_experts"] = sglang_routes(seq, shape, 0, changed)
        elif kind in ("vllm", "vllm_wide"):
            dialect = "vllm-generate"
            request = {"prompt": prompt, "sampling_params": {"max_tokens": 16}}
            choice = {"index": 0, "token_ids": out, "routed_experts": vllm_routes(seq, shape, rows)}
            response = {"choices": [choice, {"index": 1, "token_ids": out, "routed_experts": None}]}
        elif kind == "openai_stream":
            dialect = "sglang-openai"
            request = {"messages": [{"role": "user", "content": f"turn {turn}"}], "return_routed_experts": True}
            response = [
                {"choices": [{"index": 0, "delta": {"content": "x"}, "sgl_ext": {"routed_experts": routes}}]}
                for routes in (sglang_routes(seq[: n + 2], shape, 0, rows) for n in range(len(seq) - 1))
            ]
        elif kind == "openai_root":
            dialect = "sglang-openai"
            request = {"messages": [{"role": "user", "content": f"turn {turn}"}], "return_routed_experts": True}
            routes = sglang_routes(seq, shape, 0, rows)
            if turn % 3 == 0:
                response = [
                    {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]},
                    {"choices": [], "usage": None, "sglext": {"routed_experts": routes}},
                ]
            elif turn % 3 == 1:
                response = {
                    "choices": [{"index": 0, "message": {"content": "x"}}],
                    "sglext": {"routed_experts": routes},
                }
            else:
                choice = {"index": 0, "message": {"content": "x"}, "meta_info": {"routed_experts": routes}}
                response = {"choices": [choice]}
        elif kind == "kept":
            meta["top_p_token_ids"], meta["top_p_token_offsets"] = kept_sets(out, seed=rng.randrange(1 << 30))
            meta["routed_experts"] = sglang_routes(seq, shape, 0, rows)
        else:  # each a string the writer must keep as it is
            good = sglang_routes(seq, shape, 0, rows)
            meta["routed_experts"] = rng.choice(
                [
                    base64.b64encode(bytes(13)).decode()[:-3] + "B==",  # 13 zero bytes, non-canonical padding
                    good + "\n",
                    good.replace("+", "-").replace("/", "_"),
                    good[:-2] if len(good) > 10 else good + "==",
                    "   " + good,
                    base64.b64encode(b"\x93NUMPY\x01\x00" + b"\xff" * 9).decode(),
                    base64.b64encode(np.arange(7, dtype=">u2").tobytes()).decode(),
                    "é" * 12,
                ]
            )
            meta["top_p_token_ids"] = rng.choice([None, 5, ["a"], "short"])
        if response is None:
            response = {"text": "", "output_ids": out, "meta_info": meta}
        records.append(EngineRecord(session, 0, "POST", "/generate", request, 200, response, dialect=dialect))
        had = len(seq) - 1
        prompt = seq + [rng.randrange(1000) for _ in range(rng.randint(0, 20))]
    return records


def channel_cassette(seed: int, sessions: int = 6) -> tuple[bytes, dict[str, list[EngineRecord]]]:
    """A cassette of sessions of every channel kind, interleaved, one of them finished half way (its bases let go,
    more calls after): its bytes, and each session's engine records as written."""
    from tests.cassette_helpers import header

    rng = random.Random(seed)
    plan = {f"s{i}-{kind}": channel_records(rng, f"s{i}-{kind}", kind) for i, kind in enumerate(CHANNEL_KINDS)}
    plan.update({f"r{i}": channel_records(rng, f"r{i}", rng.choice(CHANNEL_KINDS)) for i in range(sessions)})
    out = io.BytesIO()
    writer = CassetteWriter(out, header())
    queue = [(name, i) for name, calls in plan.items() for i in range(len(calls))]
    rng.shuffle(queue)
    queue.sort(key=lambda item: item[1])  # each session's calls in order, sessions interleaved
    for name, i in queue:
        writer.write_engine(plan[name][i], redacted=True)
        if i == 2 and name.startswith("r0"):
            writer.session_finished(name, "named", 1.0, [])
    return out.getvalue(), plan


@cache
def channel_base() -> tuple[Frame, ...]:
    return tuple(parse(channel_cassette(SEED)[0]))


def mutate_channels(rng: random.Random, name: str) -> bytes:
    """A cassette with routes and kept sets, one of its B64_INTS values changed: its counts, sizes, flags or bytes."""
    frames = [
        Frame(msgpack.unpackb(pack(f.record), ext_hook=msgpack.ExtType, raw=False, strict_map_key=False), f.compress)
        for f in channel_base()
    ]
    found = [(holder, key) for f in frames for holder, key in _ext_slots(f.record, EXT_B64_INTS)]
    holder, key = rng.choice(found)
    data = bytearray(holder[key].data)
    choice = rng.randrange(5)
    if choice == 0:  # at / keep past the context, or near the u32 limit
        struct.pack_into("<II", data, 3, rng.choice([0, 1, 2**31, 2**32 - 1]), rng.choice([1, 2**20, 2**32 - 1]))
    elif choice == 1:  # flags, itemsize, width
        data[rng.randrange(3)] = rng.choice([0, 1, 2, 3, 5, 8, 9, 255])
    elif choice == 2:  # header length
        struct.pack_into("<I", data, 11, rng.choice([1, 2**16, 2**32 - 1]))
    elif choice == 3:  # cut
        del data[rng.randrange(len(data)) :]
    else:
        data[rng.randrange(len(data))] ^= rng.randint(1, 255)
    holder[key] = msgpack.ExtType(EXT_B64_INTS, bytes(data))
    return assemble(frames)


def _ext_slots(value: Any, code: int) -> Iterator[tuple[Any, Any]]:
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(item, msgpack.ExtType) and item.code == code:
            yield value, key
        else:
            yield from _ext_slots(item, code)


MUTATIONS: dict[str, Callable[[random.Random, str], bytes]] = {
    "truncate": mutate_truncate,
    "flip bytes": mutate_flip,
    "frame length": mutate_frame_length,
    "msgpack length": mutate_msgpack_length,
    "deep nesting": mutate_nesting,
    "zlib bomb": mutate_zlib_bomb,
    "delta bomb": mutate_delta_bomb,
    "wrong type": mutate_wrong_type,
    "bad value": mutate_bad_value,
    "frames": mutate_frames,
    "ext type": mutate_ext,
    "channels": mutate_channels,
}
WEIGHTS = {"zlib bomb": 0.1, "delta bomb": 0.1}  # slower cases (each up to its budget), fewer of them


# --- running -----------------------------------------------------------------------------------------------


@dataclass
class Case:
    number: int
    kind: str
    base: str
    data: bytes


def cases(n: int = CASES, seed: int = SEED) -> Iterator[Case]:
    rng = random.Random(seed)
    kinds = list(MUTATIONS)
    weights = [WEIGHTS.get(k, 1.0) for k in kinds]
    for number in range(n):
        kind = rng.choices(kinds, weights)[0]
        name = rng.choice(BASES)
        yield Case(number, kind, name, MUTATIONS[kind](rng, name))


def read_all(data: bytes) -> str:
    """The reader over every record, keeping none: `ok`, `truncated`, or the CassetteError's class name."""
    try:
        with CassetteReader(io.BytesIO(data)) as reader:
            for _ in reader.records():
                pass
            return "truncated tail" if reader.truncated else "read"
    except CassetteError as exc:
        message = str(exc)
        if "\n" in message or not message:
            raise AssertionError(f"not one line: {message!r}") from None
        return type(exc).__name__


@dataclass
class Report:
    seed: int
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (mutation, outcome) -> cases
    findings: list[str] = field(default_factory=list)  # cases that raised anything but a CassetteError
    slowest_s: float = 0.0
    slowest_case: str = ""
    seconds: float = 0.0
    rss_start_mib: float = 0.0  # the process's peak resident memory before the first case, and after the last
    rss_peak_mib: float = 0.0
    steal_pct: float = 0.0  # the most any one CPU was stolen by the hypervisor during the run (benchmarks/)
    load: float = 0.0  # the 1-minute load average at the end

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "cases": self.total,
            "findings": self.findings,
            "seconds": self.seconds,
            "slowest_s": self.slowest_s,
            "slowest_case": self.slowest_case,
            "rss_start_mib": self.rss_start_mib,
            "rss_peak_mib": self.rss_peak_mib,
            "steal_pct": self.steal_pct,
            "load": self.load,
            "outcomes": [[kind, outcome, n] for (kind, outcome), n in sorted(self.outcomes.items())],
        }


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def fuzz(n: int = CASES, seed: int = SEED) -> Report:
    report = Report(seed)
    zlib_bomb(1 << 30)  # built before the memory baseline: it is the input, not what reading it costs
    report.rss_start_mib = peak_rss_mib()
    started = time.perf_counter()
    steal: list[float] = []
    with steal_watch(steal):
        run_cases(report, n, seed)
    report.seconds = time.perf_counter() - started
    report.rss_peak_mib = peak_rss_mib()
    report.steal_pct, report.load = steal[0], os.getloadavg()[0]
    return report


def run_cases(report: Report, n: int, seed: int) -> None:
    for case in cases(n, seed):
        t = time.perf_counter()
        try:
            outcome = read_all(case.data)
        except Exception as exc:  # a finding: anything but one CassetteError line
            outcome = "finding"
            report.findings.append(
                f"case {case.number} ({case.kind}, {case.base}): {type(exc).__name__}: {str(exc)[:200]}"
            )
        elapsed = time.perf_counter() - t
        if elapsed > report.slowest_s:
            report.slowest_s, report.slowest_case = elapsed, f"case {case.number} ({case.kind}, {case.base})"
        report.outcomes[(case.kind, outcome)] += 1


def figures(report: Report) -> str:
    """The markdown block docs/cassettes.md shows."""
    names = [
        "read",
        "truncated tail",
        "CorruptCassetteError",
        "TruncatedHeaderError",
        "UnsupportedVersionError",
        "finding",
    ]
    lines = [f"| mutation | cases | {' | '.join(names)} |", "|---|--:|" + "--:|" * len(names)]
    for kind in MUTATIONS:
        row = [report.outcomes[(kind, o)] for o in names]
        lines.append(f"| {kind} | {sum(row)} | {' | '.join(map(str, row))} |")
    total = [sum(report.outcomes[(k, o)] for k in MUTATIONS) for o in names]
    lines.append(f"| **all** | **{report.total}** | {' | '.join(f'**{t}**' for t in total)} |")
    return "\n".join(
        [
            f"{report.total} cases (seed {report.seed}) in {report.seconds:.1f} s; findings (an exception other than "
            f"one `CassetteError` line): **{len(report.findings)}**. Peak resident memory of the fuzzing process: "
            f"**{report.rss_peak_mib:.0f} MiB**, {report.rss_peak_mib - report.rss_start_mib:.0f} MiB above its "
            f"{report.rss_start_mib:.0f} MiB before the first case; slowest case **{report.slowest_s:.2f} s** "
            f"({report.slowest_case}). Host steal up to {report.steal_pct:.1f}%, load average {report.load:.2f}.",
            "",
            *lines,
        ]
    )


def write_docs(path: Path, block: str) -> None:
    text = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(DOCS_START) + ".*?" + re.escape(DOCS_END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {DOCS_START} ... {DOCS_END} block")
    path.write_text(pattern.sub(lambda _: f"{DOCS_START}\n{block}\n{DOCS_END}", text), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=CASES)
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--docs", metavar="FILE", help="write the figures into FILE's fuzz-figures block")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (the test reads it)")
    args = parser.parse_args(argv)
    report = fuzz(args.cases, args.seed)
    block = figures(report)
    print(json.dumps(report.to_dict()) if args.json else block)
    for finding in report.findings:
        print(finding, file=sys.stderr)
    if args.docs:
        write_docs(Path(args.docs), block)
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
