"""Hostile cassettes: the seeded fuzz run (`tests/cassette_fuzz.py`) finds nothing, a sample of its files goes
through `tito cassette info`, `tito replay` and `tito inspect --html` with exit 2 and one line (or a replay
result), and each limit of the reader holds on its own: zlib and delta bombs, nesting, types, values."""

from __future__ import annotations

import contextlib
import io
import json
import re
import struct
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest

from tests import cassette_fuzz as fuzz
from tests.cassette_helpers import header
from tests.process_helpers import ROOT
from tito_rl.cassette.format.budget import DECODE_FLOOR, DECODE_RATIO
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.extensions import EXT_F64, EXT_MASK_RLE, EXT_TOKEN_DELTA, EXT_U32
from tito_rl.cassette.format.frames import FLAG_ZLIB, INFLATE_CHUNK, encode_frame
from tito_rl.cassette.format.packing import pack_u32
from tito_rl.cassette.format.records import RECORD_TYPES, EngineRecord, Header, SamplesRecord
from tito_rl.cassette.reader import CassetteReader, read_cassette
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.main import main
from tito_rl.replayer.replay.harness import STEP_TIMEOUT_S


@pytest.mark.slow
def test_the_seeded_fuzz_run_finds_nothing_in_bounded_time_and_memory() -> None:
    """A few thousand cases in a process of their own (so its peak memory is theirs). How long they take is a
    benchmark's figure (`benchmarks/bench_fuzz.py`: the slowest case against the mean), not an assertion that a busy
    host fails; the timeout only catches a hang, at many times the normal run (about 10 s on a quiet host)."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.cassette_fuzz", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    report = json.loads(done.stdout)
    assert report["findings"] == [] and done.returncode == 0, report["findings"][:5]
    assert report["cases"] == fuzz.CASES >= 3000
    outcomes: dict[str, dict[str, int]] = {}
    for kind, outcome, n in report["outcomes"]:
        outcomes.setdefault(kind, {})[outcome] = n
    assert set(outcomes) == set(fuzz.MUTATIONS)
    for kind in (
        "flip bytes",
        "msgpack length",
        "deep nesting",
        "zlib bomb",
        "delta bomb",
        "wrong type",
        "bad value",
        "frames",
        "ext type",
        "channels",
    ):  # each reaches a check that refuses it
        assert outcomes[kind].get("CorruptCassetteError", 0) > 0, (kind, outcomes[kind])
    assert outcomes["bad value"].get("read", 0) > 0  # a name like `../x` is data: read, then replayed below
    assert report["rss_peak_mib"] - report["rss_start_mib"] < 512, report


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def sample(per_kind: int = 2) -> list[fuzz.Case]:
    """From each mutation, its first cases the reader refuses and its first it reads: both paths of each tool.
    Drawn from the seeded run's first 200 cases (the last one picked is #166; 600 picked the same 32): every
    worker builds this list to collect, and each case drawn is a read of the whole file."""
    picked: dict[tuple[str, bool], list[fuzz.Case]] = {}
    for case in fuzz.cases(200):
        try:
            readable = fuzz.read_all(case.data) in ("read", "truncated tail")
        except Exception:  # a finding: its case fails below, through the tools, not the collection
            readable = True
        chosen = picked.setdefault((case.kind, readable), [])
        if len(chosen) < per_kind:
            chosen.append(case)
    return [c for cases in picked.values() for c in cases]


@pytest.mark.parametrize("case", sample(), ids=lambda c: f"{c.number}-{c.kind.replace(' ', '-')}")
def test_a_mutated_file_through_every_tool_is_a_result_or_one_line(case: fuzz.Case, tmp_path: Path) -> None:
    path = tmp_path / "hostile.tito"
    path.write_bytes(case.data)
    refused = fuzz.read_all(case.data) not in ("read", "truncated tail")  # a finding fails here
    stalled = f"within {STEP_TIMEOUT_S:g} s"  # replay's own hang bound, in a difference (-v: every one)
    tools = {
        "tito cassette info": ["cassette", "info", str(path)],
        "tito cassette export": ["cassette", "export", str(path)],
        "tito replay": ["replay", "-v", str(path)],
        "tito inspect": ["inspect", str(path), "--html", str(tmp_path / "page.html")],
    }
    for name, argv in tools.items():
        code, out, err = run(*argv)
        assert stalled not in out + err, (name, out)  # the replay gave up waiting on a request: a hang, not a refusal
        assert "Traceback" not in out + err, (name, err)
        if refused:  # export streams the records it read before the bad one: its output is cut, its exit 2
            assert code == 2 and (out == "" or name.endswith("export")) and len(err.splitlines()) == 1, (name, err)
            assert err.startswith(f"{name}: "), err
        else:
            assert code in (0, 1, 2), (name, code, err)
            assert code != 2 or len(err.splitlines()) == 1, (name, err)


def test_export_writes_a_header_value_json_has_no_number_for_as_its_text(tmp_path: Path) -> None:
    from tito_rl.cassette.format.records import Header

    path = tmp_path / "nan.tito"
    with CassetteWriter(path, Header(tokenizer_fingerprint="x", adapter={"odd": float("nan")}), header_redacted=True):
        pass
    code, out, _ = run("cassette", "export", str(path))
    assert code == 0 and json.loads(out)["header"]["adapter"] == {"odd": "nan"}


# --- each limit on its own ----------------------------------------------------------------------------------


def cassette_of(*frames: bytes) -> bytes:
    start = {"t": "session", "session": "s", "source": "bearer", "seq": 0}
    return fuzz.MAGIC + encode_frame({"t": "header", **header().to_dict()}) + encode_frame(start) + b"".join(frames)


def read(data: bytes) -> None:
    with CassetteReader(io.BytesIO(data)) as reader:
        for _ in reader.records():
            pass


def test_a_zlib_bomb_stops_at_the_decode_budget_before_it_is_inflated() -> None:
    """Inflated no further than the budget has left: 256 bytes per byte read, not the bomb's 1 GiB."""
    bomb = fuzz.zlib_bomb(1 << 30)  # 1 GiB of zeros in about 1 MiB
    data = cassette_of(fuzz.frame(bomb, FLAG_ZLIB))
    tracemalloc.start()
    try:
        with pytest.raises(
            CorruptCassetteError,
            match=r"a compressed record decodes past 256x the \d+ bytes read "
            r".*\(the record at byte",
        ):
            read(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.25 * DECODE_RATIO * len(data) + 2 * INFLATE_CHUNK < 1 << 30  # the budget's worth, then refused


def test_a_small_zlib_bomb_stops_at_the_floor() -> None:
    bomb = fuzz.zlib_bomb(32 << 20)  # 32 MiB of zeros in about 32 KiB: its 256x is under the 16 MiB floor
    with pytest.raises(CorruptCassetteError) as info:
        read(cassette_of(fuzz.frame(bomb, FLAG_ZLIB)))
    decoded = re.search(r"a compressed record decodes past 256x the \d+ bytes read \((\d+) bytes", str(info.value))
    assert decoded and DECODE_FLOOR < int(decoded.group(1)) <= DECODE_FLOOR + INFLATE_CHUNK  # a chunk past the floor


@pytest.mark.parametrize("tokens", [1_000, 600_000])  # inflated in one chunk, and across several
def test_a_compressed_record_cut_short_is_corrupt_and_whole_it_reads(tokens: int) -> None:
    payload = fuzz.pack(fuzz.engine_record(1, {"input_ids": [i % 151_000 for i in range(tokens)]}))
    squeezed = zlib.compress(payload, 6)
    assert (len(payload) > INFLATE_CHUNK) == (tokens > 1_000)
    read(cassette_of(fuzz.frame(squeezed, FLAG_ZLIB)))
    with pytest.raises(CorruptCassetteError, match=r"a compressed record ends early \(the record at byte"):
        read(cassette_of(fuzz.frame(squeezed[:-8], FLAG_ZLIB)))


def test_a_delta_bomb_stops_at_the_budget() -> None:
    """One 16k-token context, then tiny records each resolving all of it: refused once the resolved tokens pass
    256 bytes per byte read (and the 16 MiB floor), long before 2000 x 64 KB."""
    tail = msgpack.ExtType(EXT_TOKEN_DELTA, struct.pack("<I", 0) + pack_u32(list(range(16_000))))
    again = msgpack.ExtType(EXT_TOKEN_DELTA, struct.pack("<I", 16_000))
    frames = [fuzz.frame(fuzz.pack(fuzz.engine_record(1, {"input_ids": tail})))]
    frames += [fuzz.frame(fuzz.pack(fuzz.engine_record(n, {"input_ids": again}))) for n in range(2, 2000)]
    with pytest.raises(CorruptCassetteError, match=r"a prompt decodes past 256x the \d+ bytes read"):
        read(cassette_of(*frames))
    assert DECODE_FLOOR < 2000 * 64_000


def test_a_mask_of_2_to_the_40_entries_is_refused_before_it_is_built() -> None:
    mask = msgpack.ExtType(EXT_MASK_RLE, b"\1" + pack_u32([0xFFFFFFFF] * 256))
    record = {
        "t": "samples",
        "session": "s",
        "seq": 1,
        "reward": 1.0,
        "samples": [{"tokens": [1], "response_length": 1, "loss_mask": mask, "rollout_log_probs": [0.0]}],
    }
    with pytest.raises(CorruptCassetteError, match="a run-length mask decodes past"):
        read(cassette_of(fuzz.frame(fuzz.pack(record))))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("status", "200", "engine record field 'status': expected int, got str '200'"),
        ("headers", {"x": 1}, "engine record field 'headers': expected dict[str, str | list[str]], got dict"),
        ("request", [1, 2], "engine record field 'request': expected dict[str, Any] | None, got list [1, 2]"),
        ("response", {b"key": 1}, "engine record field 'response': expected Any, got dict"),
        ("seq", -1, "engine record field 'seq' is negative (-1)"),
        ("started_s", float("nan"), "engine record field 'started_s' is not a time (nan)"),
        ("status", 1000, "engine record status 1000 is not an HTTP status"),
        ("session", "a\x1b[2Jb", "a session name holds control characters: 'a\\x1b[2Jb'"),
        # the checks by type set (the fast paths) against what each would let through
        ("status", True, "engine record field 'status': expected int, got bool True"),
        ("headers", {"x-a": "1", "x\n": "2"}, "engine record field 'headers': 'x\\n' is not an HTTP header"),
        ("headers", {"x-a": "1", "": "2"}, "engine record field 'headers': '' is not an HTTP header"),
        ("headers", {"x": ["a", "b\r\nc"]}, "engine record field 'headers': 'x' is not an HTTP header"),
        ("headers", {"x": ["a", 1]}, "engine record field 'headers': expected dict[str, str | list[str]], got dict"),
        ("method", "POST\n", "engine record field 'method': not an HTTP method: 'POST\\n'"),
        ("extra", {"a": [1, {"b": {2: 3}}]}, "engine record field 'extra': expected dict[str, Any], got dict"),
        ("extra", {"a": [1.5, [2, [None, {3: 4}]]]}, "engine record field 'extra': expected dict[str, Any], got dict"),
    ],
)
def test_a_field_of_another_type_or_value_is_one_error_naming_it(field: str, value: object, message: str) -> None:
    record = fuzz.engine_record(1, {"input_ids": [1, 2, 3]}) | {field: value}
    with pytest.raises(CorruptCassetteError) as info:
        read(cassette_of(fuzz.frame(fuzz.pack(record))))
    assert str(info.value).startswith(f"corrupt cassette: {message}"), str(info.value)
    assert "(the record at byte " in str(info.value) and "\n" not in str(info.value)


def test_nesting_past_the_limit_is_refused_and_under_it_read() -> None:
    for depth, ok in ((60, True), (65, False), (100_000, False)):
        record = fuzz.engine_record(1, {})
        payload = fuzz.with_raw(record, "extra", b"\x81\xa1k" * depth + b"\x80")
        if ok:
            read(cassette_of(fuzz.frame(payload)))
        else:
            with pytest.raises(CorruptCassetteError):
                read(cassette_of(fuzz.frame(payload)))


def test_the_writer_compresses_a_record_however_well_it_compresses_and_it_reads_back(tmp_path: Path) -> None:
    """The decode budget is the file's, so no record has to be stored raw: a sample of a 262k-token context whose
    logprobs are zeros but for its last turn (a long session's, as they are) compresses ~800x, and the cassette
    holding it alone reads back, whole and through its index."""
    n = 262_144
    samples = [
        {
            "tokens": [7] * n,
            "response_length": n - 1000,
            "loss_mask": [0] * 1000 + [1] * (n - 1000),
            "rollout_log_probs": [0.0] * (n - 64) + [-0.25] * 64,
            "reward": 0.0,
            "metadata": {"note": "x" * 99},
        }
    ]
    frame = encode_frame({"t": "samples", "session": "s", "seq": 1, "reward": 0.0, "samples": samples})
    _, flags, _, _ = fuzz.FRAME_HEADER.unpack(frame[: fuzz.FRAME_HEADER.size])
    packed = frame[fuzz.FRAME_HEADER.size :]
    assert flags == FLAG_ZLIB and len(zlib.decompress(packed)) > 500 * len(packed)
    path = tmp_path / "squeezed.tito"
    with CassetteWriter(path, header()) as writer:
        writer.append_redacted(SamplesRecord("s", 0, 0.0, samples))
    assert path.stat().st_size < 16 << 10
    (record,) = read_cassette(path).sessions["s"].records
    assert record.samples[0]["rollout_log_probs"] == samples[0]["rollout_log_probs"]
    assert record.samples[0]["tokens"] == [7] * n and record.samples[0]["loss_mask"] == samples[0]["loss_mask"]
    with CassetteReader(path) as reader:
        (alone,) = reader.read_session(reader.stored_index()["s"]).records
    assert alone.samples[0]["rollout_log_probs"][-1] == -0.25


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("adapter", "context_length", "40960", "header adapter.context_length: Expected `int`, got `str`"),
        ("adapter", "chat_template", 5, "header adapter.chat_template: Expected `str | null`, got `int`"),
        ("adapter", "manager", {"bogus": 1}, "header adapter.manager.bogus: not a setting of this tito's manager"),
        ("adapter", "manager", {"reward_policy": "all"}, "header adapter.manager: reward_policy must be one of"),
        ("parsers", "tool_call", 5, "header parsers.tool_call: Expected `str | null`, got `int`"),
    ],
)
def test_header_settings_of_another_type_are_one_line_before_a_replay(
    section: str, key: str, value: object, message: str, tmp_path: Path
) -> None:
    """The header's adapter and manager settings build the replay's adapter app: each is checked against the
    setting's type first (a cassette's settings are as untrusted as its records)."""
    from tito_rl.cassette.format.records import Header

    source = ROOT / "cassettes" / "drift_realign.tito"
    path = tmp_path / "settings.tito"
    with CassetteReader(source) as reader:
        values = reader.header.to_dict()
        values[section] = {**values[section], key: value}
        with CassetteWriter(path, Header(**values), header_redacted=True) as writer:
            for record in reader.records():
                writer.append_redacted(record)
    for tool in ("replay", "inspect"):
        code, out, err = run(tool, str(path))
        assert (code, out) == (2, "") and err.startswith(f"tito {tool}: {path}: {message}"), err
        assert len(err.splitlines()) == 1


def test_a_packed_list_is_only_taken_where_its_numbers_belong() -> None:
    """Lists the decoder unpacks itself skip the per-item walk, but only where their item type is declared."""
    floats = msgpack.ExtType(EXT_F64, struct.pack("<2d", 1.5, 2.5))
    sample = {"tokens": floats, "response_length": 0, "loss_mask": [], "rollout_log_probs": []}
    samples = {"t": "samples", "session": "s", "seq": 1, "reward": 1.0, "samples": [sample]}
    with pytest.raises(CorruptCassetteError, match=r"sample 0 'tokens': expected list\[TokenId\], got list \[1.5, 2.5"):
        read(cassette_of(fuzz.frame(fuzz.pack(samples))))
    events = fuzz.agent_record(1, b"{}") | {"reply_events": msgpack.ExtType(EXT_U32, pack_u32([1, 2]))}
    with pytest.raises(CorruptCassetteError, match=r"agent record field 'reply_events': expected list\[str\] \| None"):
        read(cassette_of(fuzz.frame(fuzz.pack(events))))
    sample["tokens"], sample["rollout_log_probs"] = [1, 2], floats  # numbers where numbers go: read
    sample["response_length"], sample["loss_mask"] = 2, msgpack.ExtType(EXT_MASK_RLE, b"\1" + pack_u32([2]))
    read(cassette_of(fuzz.frame(fuzz.pack(samples))))


def test_the_request_and_response_fields_replay_reads_are_typed() -> None:
    """Replay compares a /generate with its recorded twin's input_ids and sampling params, and decodes token ids
    to show a difference: those are typed, ids as uint32."""
    record = fuzz.engine_record(1, {"input_ids": [1, 2], "sampling_params": 7})
    with pytest.raises(CorruptCassetteError, match=r"engine record request 'sampling_params': expected dict"):
        read(cassette_of(fuzz.frame(fuzz.pack(record))))
    for ids in (["a"], [-1], [2**32]):  # a tokenizer cannot decode an id outside uint32 (difference reports do)
        record = fuzz.engine_record(1, {"input_ids": ids})
        with pytest.raises(CorruptCassetteError, match=r"engine record request 'input_ids': expected list\[TokenId\]"):
            read(cassette_of(fuzz.frame(fuzz.pack(record))))
    record = fuzz.engine_record(1, {"input_ids": [1]}) | {"response": {"output_ids": [2**40]}}
    with pytest.raises(CorruptCassetteError, match=r"engine record response 'output_ids': expected list\[TokenId\]"):
        read(cassette_of(fuzz.frame(fuzz.pack(record))))


@pytest.mark.parametrize(
    "meta",
    [
        {"output_token_logprobs": [{"lp": -0.1}]},
        {"output_token_logprobs": [], "prompt_tokens": [3]},
        {"output_token_logprobs": [], "cached_tokens": "many"},
    ],
)
def test_a_malformed_engine_answer_is_an_engine_error_in_the_adapter(meta: dict[str, object]) -> None:
    """A replay serves the recorded engine answers to the real adapter: whatever their shape, the adapter
    answers its client 502 (an engine error), never fails in its handler."""
    from tito_rl.trajectory.adapters.engine.generate import EngineError, parse_generation

    with pytest.raises(EngineError) as info:
        parse_generation("rid", {"meta_info": meta})
    assert info.value.status == 502
    odd_reason = {"meta_info": {"output_token_logprobs": [], "finish_reason": "stop"}}  # a str, not SGLang's map
    assert parse_generation("rid", odd_reason).finish_reason == "stop"


PALETTE = [None, True, 7, -3, 1.5, "text", b"bytes", [], [1, "x"], {}, {"k": "v"}, {"k": {"deeper": [b"\0"]}}]


def allowed_types(hint: object) -> set[type] | None:
    """The Python types a declared field takes (None: anything msgpack holds): the test's own reading of the
    record dataclasses' annotations, independent of the format's checker."""
    import types as pytypes
    import typing

    if hint is typing.Any:
        return None
    if typing.get_origin(hint) in (typing.Union, pytypes.UnionType):
        parts = [allowed_types(h) for h in typing.get_args(hint)]
        known = [p for p in parts if p is not None]
        return None if len(known) < len(parts) else set[type]().union(*known)
    origin = typing.cast(type, typing.get_origin(hint) or hint)  # a class, or a generic's class (list[int] -> list)
    return {int, float} if origin is float else {type(None)} if hint is type(None) else {origin}


# An engine-wide event (format version 7) as the recorder writes a trainer's update.
EVENT = {
    "t": "event",
    "session": "",
    "seq": 0,
    "method": "POST",
    "path": "/update_weight_version",
    "request": {"new_version": "2"},
    "status": 200,
    "response": {"success": True},
    "error": None,
    "order": [0, 1],
    "dialect": "sglang",
}


@pytest.mark.parametrize("kind", ["header", *RECORD_TYPES])
def test_every_field_of_every_record_type_takes_only_its_type(kind: str) -> None:
    """Each field of each record type set to values of every msgpack type: a value of another type than the
    field's is refused with one line; none gets past the reader to fail later; none raises anything else."""
    from typing import get_type_hints

    cls = Header if kind == "header" else RECORD_TYPES[kind]
    hints = get_type_hints(cls)
    refused = 0
    for field, hint in hints.items():
        allowed = allowed_types(hint)
        for value in PALETTE:
            frames = fuzz.frames_of("openai_wires")
            if kind == "event":  # no committed cassette holds a trainer's update: one added (the file has no index)
                at = next((i for i, f in enumerate(frames) if f.record["t"] == "index"), len(frames))
                frames.insert(at, fuzz.Frame(dict(EVENT), False))
            target = next(f for f in frames if f.record["t"] == kind)
            target.record[field] = value
            outcome = fuzz.read_all(fuzz.assemble(frames))  # raises on anything but one CassetteError line
            if allowed is not None and type(value) not in allowed:  # True is not an int here, as msgpack tells
                assert outcome in ("CorruptCassetteError", "UnsupportedVersionError"), (kind, field, value, outcome)
                refused += 1
    assert refused >= len(hints) * 6, refused  # most values are of another type than most fields'


def test_inspect_shows_an_engine_answer_of_any_shape() -> None:
    """The exchanges table reads each recorded /generate answer as it is: a finish reason or token count of
    another shape than SGLang's is shown as unknown, never used as text or a number."""
    from tito_rl.cassette.format.records import AgentRecord, EngineRecord
    from tito_rl.replayer.inspection.gather import exchange_row
    from tito_rl.replayer.replay.plan import PlannedExchange

    agent = AgentRecord("s", 2, "POST", "/v1/messages", "", {}, b"{}", 200, {})
    for meta, finish in (
        ({"finish_reason": {"type": "length"}, "prompt_tokens": 9}, "length"),
        ({"finish_reason": 5, "prompt_tokens": "many"}, None),
        ({"finish_reason": ["stop"]}, None),
    ):
        call = EngineRecord("s", 1, "POST", "/generate", {}, 200, {"output_ids": [1, 2], "meta_info": meta})
        row = exchange_row(PlannedExchange(0, agent, [call]))
        assert (row.finish, row.output_tokens) == (finish, 2)
        assert row.prompt_tokens == (9 if finish else None)


# --- per-token channels (routes, kept sets): stored as integers, read back byte for byte ----------------------


def engine_responses(data: bytes) -> dict[str, list[object]]:
    out: dict[str, list[object]] = {}
    with CassetteReader(io.BytesIO(data)) as reader:
        for record in reader.records():
            if isinstance(record, EngineRecord):
                out.setdefault(record.session, []).append(record.response)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_engine_answers_with_channels_read_back_exactly(seed: int, tmp_path: Path) -> None:
    """Sessions of every channel kind interleaved (random rows, prefix-extending, `routed_experts_start_len`, a row
    that changed, vLLM's `.npy` in uint8 and uint16, SGLang's chat chunks, kept sets, strings that cannot be stored
    as integers), one finished half way: each answer reads back equal, its strings byte for byte, by a scan, by the
    index one session at a time, and after a copy through another writer (cut and merge's path)."""
    data, plan = fuzz.channel_cassette(seed)
    expected = {name: [r.response for r in records] for name, records in plan.items()}
    assert engine_responses(data) == expected
    path, copy = tmp_path / "channels.tito", tmp_path / "copy.tito"
    path.write_bytes(data)
    with CassetteReader(path) as reader, CassetteWriter(copy, reader.header, header_redacted=True) as writer:
        for record in reader.records():
            writer.append_redacted(record)
    assert copy.read_bytes().startswith(data)  # the same records encode to the same bytes (the copy adds its index)
    with CassetteReader(copy) as reader:
        index = reader.stored_index()
        assert index is not None and set(index) >= set(expected)
        for name in expected:
            assert [r.response for r in reader.read_session(index[name]).engine] == expected[name]


def _codec_round_trip(responses: list[dict[str, object]], requests: list[dict[str, object]] | None = None) -> list:
    """Each answer through a writer's codec and a reader's, as frames: the stored maps, and the answers read."""
    from tito_rl.cassette.format.codec import SessionCodec
    from tito_rl.cassette.format.frames import FRAME_HEADER, decode_payload

    writer, reader, stored = SessionCodec(), SessionCodec(), []
    for i, response in enumerate(responses):
        request = requests[i] if requests else {}
        record = EngineRecord("s", i + 1, "POST", "/generate", request, 200, response)
        data = writer.encode(record)
        stored.append(data["response"])
        frame = encode_frame(data)
        length, flags, _, crc = FRAME_HEADER.unpack(frame[: FRAME_HEADER.size])
        back = reader.decode(decode_payload(frame[FRAME_HEADER.size :], flags, crc, 0))
        assert back.response == response  # strings equal: byte for byte
    return stored


def test_a_route_row_that_differs_from_the_stored_one_ends_the_kept_prefix_there() -> None:
    from tests.route_channels import MoeShape, route_rows, sglang_routes
    from tito_rl.cassette.format.routes import B64Ints

    shape = MoeShape(4, 2, 16)
    tokens = list(range(100, 160))
    rows = route_rows(tokens, shape)
    changed = rows.copy()
    changed[7, 2, 1] = (changed[7, 2, 1] + 1) % 16  # one expert of row 7 differs the next turn
    first = {"meta_info": {"routed_experts": sglang_routes(tokens[:40], shape, 0, rows)}}
    second = {"meta_info": {"routed_experts": sglang_routes(tokens, shape, 0, changed)}}
    third = {"meta_info": {"routed_experts": sglang_routes(tokens, shape, 0, changed)}}
    answers: list[dict[str, Any]] = [first, second, third]
    a, b, c = (s["meta_info"]["routed_experts"] for s in _codec_round_trip(answers))
    assert isinstance(a, B64Ints) and isinstance(b, B64Ints) and isinstance(c, B64Ints)
    assert (a.keep, a.width, a.itemsize) == (0, 1, 4)  # int32 ids under 16: a byte each
    assert b.keep == 7 * shape.row + 2 * shape.top_k + 1  # up to the changed expert; the rest stored whole
    assert c.keep == 59 * shape.row and c.tail == b""  # the changed rows are the session's now


def test_sglang_openai_routes_at_the_root_sglext_are_stored_as_integers() -> None:
    """SGLang 0.5.23's OpenAI routes sit at the answer's root `sglext` (streamed: a final chunk with `choices: []`),
    or in a choice's `meta_info`: each stored as integers, the later ones as the rows kept from before (a stored
    `sglext` left as text would cost the session's whole prefix every turn)."""
    from tests.route_channels import MoeShape, route_rows, sglang_routes
    from tito_rl.cassette.format.routes import B64Ints

    shape = MoeShape(4, 2, 16)
    tokens = list(range(500, 560))
    rows = route_rows(tokens, shape)
    streamed = [
        {"choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": None, "sglext": {"routed_experts": sglang_routes(tokens[:20], shape, 0, rows)}},
    ]
    whole = {"choices": [{"index": 0}], "sglext": {"routed_experts": sglang_routes(tokens[:40], shape, 0, rows)}}
    meta = {"choices": [{"index": 0, "meta_info": {"routed_experts": sglang_routes(tokens, shape, 0, rows)}}]}
    a, b, c = _codec_round_trip([streamed, whole, meta])  # type: ignore[list-item]
    first, second = a[1]["sglext"]["routed_experts"], b["sglext"]["routed_experts"]
    third = c["choices"][0]["meta_info"]["routed_experts"]
    assert all(isinstance(x, B64Ints) for x in (first, second, third))
    assert (first.keep, second.keep, third.keep) == (0, 19 * shape.row, 39 * shape.row)


def test_a_start_len_answer_is_placed_at_its_start_row() -> None:
    """`routed_experts_start_len` leaves rows out of the answer: its first row is the start row, kept from the rows
    stored before, whichever way the prompt grew."""
    from tests.route_channels import MoeShape, route_rows, sglang_routes

    shape = MoeShape(4, 2, 16)
    tokens = list(range(300, 400))
    rows = route_rows(tokens, shape)
    first = {"output_ids": tokens[30:40], "meta_info": {"routed_experts": sglang_routes(tokens[:40], shape, 0, rows)}}
    second = {"output_ids": tokens[90:100], "meta_info": {"routed_experts": sglang_routes(tokens, shape, 39, rows)}}
    requests: list[dict[str, object]] = [
        {"input_ids": tokens[:30]},
        {"input_ids": tokens[:90], "routed_experts_start_len": 39},
    ]
    answers: list[dict[str, Any]] = [first, second]
    _, stored = _codec_round_trip(answers, requests)
    routes = stored["meta_info"]["routed_experts"]
    assert (routes.at, routes.keep) == (39 * shape.row, 0)  # nothing to keep: every row from 39 on is new
    assert len(routes.tail) == (99 - 39) * shape.row


@pytest.mark.parametrize(
    "text",
    [
        "AAAAAAAAAAAAAAAAAB==",  # 13 zero bytes with non-canonical padding bits
        "AAAAAAB=",  # 5 zero bytes, the same
        "AA==AAAA",  # padding inside
        "AAAAAAAAAAAAAAAA\n",  # a line break
        "AAAA-_AAAAAAAAAA",  # the URL-safe alphabet
        "AAAAAAAAAAAAAA",  # not a whole number of groups
        "éééééééééé",
        "AAAAAAAAAAAAAAAAAAA=",  # 14 bytes: not a whole number of int32 items
    ],
)
def test_a_string_that_would_not_come_back_byte_for_byte_is_stored_as_it_came(text: str) -> None:
    (stored,) = _codec_round_trip([{"meta_info": {"routed_experts": text, "top_p_token_ids": text}}])
    assert stored["meta_info"] == {"routed_experts": text, "top_p_token_ids": text}


def test_vllm_npy_routes_keep_their_header_and_dtype() -> None:
    from tests.route_channels import MoeShape, route_rows, vllm_routes
    from tito_rl.cassette.format.routes import B64Ints

    for experts, itemsize in ((128, 1), (300, 2)):
        shape = MoeShape(3, 2, experts)
        tokens = list(range(50))
        rows = route_rows(tokens, shape)
        answers: list[dict[str, Any]] = [
            {"choices": [{"routed_experts": vllm_routes(tokens[:n], shape, rows)}]} for n in (20, 50)
        ]
        first, second = (s["choices"][0]["routed_experts"] for s in _codec_round_trip(answers))
        assert isinstance(second, B64Ints) and second.header.startswith(b"\x93NUMPY")
        assert (second.itemsize, second.keep) == (itemsize, 19 * shape.row)


def test_kept_route_rows_past_the_context_are_corrupt_and_a_route_bomb_stops_at_the_budget() -> None:
    from tito_rl.cassette.format.routes import B64Ints

    def engine(seq: int, stored: B64Ints) -> bytes:
        payload = msgpack.ExtType(fuzz.EXT_B64_INTS, stored.payload())
        return fuzz.frame(
            fuzz.pack(fuzz.engine_record(seq, {}) | {"response": {"meta_info": {"routed_experts": payload}}})
        )

    past = engine(1, B64Ints(True, 4, 1, 0, 5, b"", b""))
    with pytest.raises(CorruptCassetteError, match=r"keep elements \[0, 5\) of a 0-element route context"):
        read(cassette_of(past))
    whole = engine(1, B64Ints(True, 4, 1, 0, 0, b"", bytes(400_000)))
    again = [engine(n, B64Ints(True, 4, 1, 0, 400_000, b"", b"")) for n in range(2, 200)]  # 2 MB of text each
    with pytest.raises(CorruptCassetteError, match=r"base64 integers decodes past 256x"):
        read(cassette_of(whole, *again))
