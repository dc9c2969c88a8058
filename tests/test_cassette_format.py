"""Format v1 building blocks: packed arrays, deltas, frames, the per-session codec, determinism."""

from __future__ import annotations

import io
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.cassette_helpers import BEARER, PINNED, final_sample, header, play, session_traffic
from tito_rl.cassette.format.codec import SessionCodec
from tito_rl.cassette.format.deltas import bytes_delta, token_delta
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.frames import (
    FLAG_ZLIB,
    FRAME_HEADER,
    MAGIC,
    decode_frame_header,
    decode_payload,
    encode_frame,
)
from tito_rl.cassette.format.packing import PackedIds, mask_rle, mask_unrle, pack_u32, packed_token_list, unpack_u32
from tito_rl.cassette.format.records import AgentRecord, DropRecord, EngineRecord, Header, Record, SamplesRecord
from tito_rl.cassette.writer import CassetteWriter

token_lists = st.lists(st.integers(min_value=0, max_value=0xFFFFFFFF), max_size=200)


@given(token_lists)
def test_packed_uint32_is_little_endian_and_round_trips(ids: list[int]) -> None:
    data = pack_u32(ids)
    assert len(data) == 4 * len(ids)
    assert data == b"".join(i.to_bytes(4, "little") for i in ids)
    assert unpack_u32(data) == ids


@given(token_lists, token_lists)
def test_token_delta_rebuilds_the_prompt(base: list[int], prompt: list[int]) -> None:
    delta = token_delta(pack_u32(base), pack_u32(prompt))
    assert unpack_u32(delta.apply(pack_u32(base))) == prompt
    assert base[: delta.prefix] == prompt[: delta.prefix]
    assert delta.prefix == len(base) or delta.prefix == len(prompt) or base[delta.prefix] != prompt[delta.prefix]


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_bytes_delta_rebuilds_the_body(base: bytes, body: bytes) -> None:
    assert bytes_delta(base, body).apply(base) == body


@given(st.lists(st.integers(min_value=0, max_value=1), max_size=300))
def test_mask_run_length_round_trips(mask: list[int]) -> None:
    assert mask_unrle(mask_rle(mask)) == mask


def test_a_growing_body_stores_only_what_changed() -> None:
    base = b'{"messages":[' + b'"x"' * 1000 + b'],"tools":[' + b'"t"' * 1000 + b"]}"
    grown = base.replace(b'],"tools"', b',"new message"],"tools"')
    delta = bytes_delta(base, grown)
    assert len(delta.middle) < 20 and delta.apply(base) == grown


def test_frames_catch_flipped_bytes_and_compress_big_records() -> None:
    frame = encode_frame({"t": "engine", "blob": "abc" * 1000})
    length, flags, crc = decode_frame_header(frame[: FRAME_HEADER.size], 0)
    assert flags & FLAG_ZLIB and length == len(frame) - FRAME_HEADER.size < 3000
    assert decode_payload(frame[FRAME_HEADER.size :], flags, crc, 0)["blob"] == "abc" * 1000
    flipped = bytearray(frame)
    flipped[FRAME_HEADER.size + 5] ^= 0x40
    with pytest.raises(CorruptCassetteError, match="checksum"):
        decode_payload(bytes(flipped[FRAME_HEADER.size :]), flags, crc, 0)
    bad_header = bytearray(frame[: FRAME_HEADER.size])
    bad_header[0] ^= 0x01
    with pytest.raises(CorruptCassetteError, match="frame header"):
        decode_frame_header(bytes(bad_header), 0)


def test_engine_records_store_prompts_as_deltas_against_the_previous_context() -> None:
    codec, reader = SessionCodec(), SessionCodec()
    rng = random.Random(0)
    p1 = [rng.randrange(151000) for _ in range(2000)]
    out1 = [7, 8, 151645]
    p2 = p1 + out1 + [42, 43]
    frames = []
    for seq, (prompt, out) in enumerate([(p1, out1), (p2, [9, 151645])]):
        rec = EngineRecord(
            "s",
            seq,
            "POST",
            "/generate",
            {"rid": f"r{seq}", "input_ids": prompt},
            200,
            {"output_ids": out, "meta_info": {"output_token_logprobs": [[-0.5, t, None] for t in out]}},
        )
        frames.append(encode_frame(codec.encode(rec)))
    # The second prompt costs its 2 new tokens, not 2005.
    assert len(frames[1]) < 400 < 4000 < len(frames[0])
    for seq, frame in enumerate(frames):
        length, flags, crc = decode_frame_header(frame[: FRAME_HEADER.size], 0)
        back = reader.decode(decode_payload(frame[FRAME_HEADER.size :], flags, crc, 0))
        assert isinstance(back, EngineRecord)
        assert back.request["input_ids"] == (p1 if seq == 0 else p2)
        assert back.response["meta_info"]["output_token_logprobs"][0] == [-0.5, back.response["output_ids"][0], None]


@given(token_lists, st.integers(-250, 250), st.integers(-250, 250))
def test_packed_ids_read_as_the_list_they_stand_for(ids: list[int], start: int, stop: int) -> None:
    packed = PackedIds(pack_u32(ids))
    assert len(packed) == len(ids) and list(packed) == ids and packed.tolist() == ids
    assert packed == ids and ids == packed and packed == PackedIds(pack_u32(ids))
    assert packed != [*ids, 0] and packed != ids[:-1] + [ids[-1] ^ 1] if ids else packed != [0]
    assert packed[start:stop] == ids[start:stop] and packed[::2] == ids[::2]
    for i in (start, stop):
        if -len(ids) <= i < len(ids):
            assert packed[i] == ids[i]
        else:
            with pytest.raises(IndexError):
                packed[i]
    assert packed_token_list(packed) == pack_u32(ids)  # written back as it was read
    assert packed != [-1] * len(ids) or not ids  # a list that is no uint32 array is never equal


def test_packed_ids_are_unhashable_shown_short_and_refuse_a_cut_array() -> None:
    packed = PackedIds(pack_u32(list(range(100_000))))
    assert repr(packed) == "PackedIds(100000 ids)"
    with pytest.raises(TypeError):
        hash(packed)
    with pytest.raises(CorruptCassetteError, match="not a multiple of 4"):
        PackedIds(b"\x01\x00\x00")


def test_a_reader_asking_for_packed_prompts_gets_the_same_records_with_prompts_packed() -> None:
    writer, lists, packed = SessionCodec(), SessionCodec(), SessionCodec(packed_prompts=True)
    rng = random.Random(1)
    p1 = [rng.randrange(151000) for _ in range(3000)]
    p2 = p1 + [7, 8, 151645, 42]
    for seq, prompt in enumerate([p1, p2]):
        rec = EngineRecord(
            "s",
            seq,
            "POST",
            "/generate",
            {"rid": f"r{seq}", "input_ids": prompt},
            200,
            {"output_ids": [7, 8, 151645], "meta_info": {}},
        )
        frame = encode_frame(writer.encode(rec))
        length, flags, crc = decode_frame_header(frame[: FRAME_HEADER.size], 0)
        as_list = lists.decode(decode_payload(frame[FRAME_HEADER.size :], flags, crc, 0))
        as_packed = packed.decode(decode_payload(frame[FRAME_HEADER.size :], flags, crc, 0))
        assert type(as_list.request["input_ids"]) is list and type(as_packed.request["input_ids"]) is PackedIds
        assert as_packed.request["input_ids"] == as_list.request["input_ids"] == prompt
        assert as_packed.response == as_list.response and as_packed.seq == as_list.seq
        # Written again, a record read packed gives the bytes it was read from.
        assert encode_frame(SessionCodec().encode(as_packed)) == encode_frame(SessionCodec().encode(as_list))


def test_a_finished_session_s_delta_bases_are_let_go_and_a_later_record_still_decodes() -> None:
    """A recorder running for days must not hold every finished session's context (about 1 MB each); a record of
    the session after its finish is stored whole and decodes with a reader that kept the old context."""
    codec, reader = SessionCodec(), SessionCodec()
    rng = random.Random(1)

    def engine(session: str, seq: int, prompt: list[int]) -> EngineRecord:
        return EngineRecord(
            session, seq, "POST", "/generate", {"input_ids": prompt}, 200, {"output_ids": [5, 151645], "meta_info": {}}
        )

    def agent(session: str, seq: int, body: bytes) -> AgentRecord:
        return AgentRecord(session, seq, "POST", "/v1/messages", "", {}, body, 200, {})

    prompts = {name: [rng.randrange(151000) for _ in range(5000)] for name in ("a", "b", "c")}
    records: list[Any] = []
    for name, prompt in prompts.items():
        records += [engine(name, 0, prompt), agent(name, 1, b"x" * 20000)]
    sample = {
        "tokens": prompts["a"] + [5, 151645],
        "response_length": 2,
        "loss_mask": [1, 1],
        "rollout_log_probs": [-0.1, -0.2],
        "reward": 1.0,
        "metadata": {},
    }
    records += [SamplesRecord("a", 2, 1.0, [sample]), DropRecord("b", 2)]
    encoded = [codec.encode(r) for r in records]
    assert codec.held_bytes() == 4 * (5000 + 2) + 20000  # only session c's, which has not ended
    later: list[Record] = [engine("a", 3, prompts["a"] + [5, 151645, 9]), agent("a", 4, b"x" * 20001)]
    encoded += [codec.encode(r) for r in later]
    assert encoded[-2]["request"]["input_ids"].prefix == 0  # whole: its base was let go
    decoded = [
        reader.decode(decode_payload(encode_frame(e)[FRAME_HEADER.size :], *_frame_bits(encode_frame(e)), 0))
        for e in encoded
    ]
    assert decoded[-2].request["input_ids"] == prompts["a"] + [5, 151645, 9] and decoded[-1].body == b"x" * 20001


def _frame_bits(frame: bytes) -> tuple[int, int]:
    _, flags, crc = decode_frame_header(frame[: FRAME_HEADER.size], 0)
    return flags, crc


def test_irregular_logprobs_are_stored_verbatim() -> None:
    """Only the exact `[float, id, None]` shape becomes a column: anything else must survive untouched."""
    codec, reader = SessionCodec(), SessionCodec()
    triples = [[0, 5, None], [-0.25, 6, "x"]]  # an int logprob, a text entry
    rec = EngineRecord(
        "s",
        0,
        "POST",
        "/generate",
        {"input_ids": [1, 2]},
        200,
        {"output_ids": [5, 6], "meta_info": {"output_token_logprobs": triples}},
    )
    frame = encode_frame(codec.encode(rec))
    _, flags, crc = decode_frame_header(frame[: FRAME_HEADER.size], 0)
    back = reader.decode(decode_payload(frame[FRAME_HEADER.size :], flags, crc, 0))
    assert back.response["meta_info"]["output_token_logprobs"] == triples
    assert type(back.response["meta_info"]["output_token_logprobs"][0][0]) is int


def _write(events: list, created: str = PINNED) -> bytes:
    buffer = io.BytesIO()
    writer = CassetteWriter(buffer, Header(**{**header().to_dict(), "created": created}))
    play(writer, events)
    writer.session_finished(BEARER, "api", 1.0, [final_sample(events)])
    return buffer.getvalue()


def _after_header(data: bytes) -> bytes:
    start = len(MAGIC)
    length, _, _ = decode_frame_header(data[start : start + FRAME_HEADER.size], start)
    return data[start + FRAME_HEADER.size + length :]


def test_writing_the_same_exchanges_twice_gives_identical_bytes(qwen_tokenizer: Any) -> None:
    events = session_traffic(qwen_tokenizer, turns=3)
    first, second = _write(events), _write(events)
    assert first.startswith(MAGIC) and first == second
    other = _write(events, created="2030-12-31T23:59:59Z")
    assert other != first and _after_header(other) == _after_header(first)


def test_a_reader_asking_for_packed_samples_gets_the_same_records_and_lets_finished_sessions_go() -> None:
    """`records(packed_prompts=True, packed_samples=True, release_finished=True)` (the audit's reading) equals the
    plain reading record for record: samples' ids as `PackedIds`, masks and logprobs as `PackedColumn`s."""
    from pathlib import Path

    from tito_rl.cassette.format.packing import PackedColumn
    from tito_rl.cassette.reader import CassetteReader

    root = Path(__file__).resolve().parent.parent / "cassettes"
    for name in ("tool_loop", "drift_realign", "targets/slime_retry"):
        with CassetteReader(root / f"{name}.tito") as plain, CassetteReader(root / f"{name}.tito") as packed:
            pairs = list(
                zip(
                    plain.records(),
                    packed.records(packed_prompts=True, packed_samples=True, release_finished=True),
                    strict=True,
                )
            )
        samples = [(a, b) for a, b in pairs if isinstance(a, SamplesRecord)]
        assert samples, name
        for a, b in samples:
            for x, y in zip(a.samples, b.samples, strict=True):
                assert type(y["tokens"]) is PackedIds and y["tokens"] == x["tokens"]
                assert type(y["loss_mask"]) is PackedColumn and y["loss_mask"] == x["loss_mask"]
                assert y["loss_mask"].tolist() == x["loss_mask"] and len(y["loss_mask"]) == len(x["loss_mask"])
                if x.get("rollout_log_probs") is not None:
                    assert type(y["rollout_log_probs"]) is PackedColumn
                    assert y["rollout_log_probs"].tolist() == x["rollout_log_probs"]
        for read, read_packed in pairs:
            if isinstance(read, EngineRecord):
                assert read_packed.request == read.request and read_packed.response == read.response
            elif isinstance(read, AgentRecord):
                assert read_packed.body == read.body


def test_release_lets_a_finished_session_s_bases_go() -> None:
    codec = SessionCodec()
    codec.encode(
        EngineRecord(
            "s", 0, "POST", "/generate", {"input_ids": list(range(500))}, 200, {"output_ids": [7, 8], "meta_info": {}}
        )
    )
    codec.encode(AgentRecord("s", 1, "POST", "/v1/messages", "", {}, b'{"messages": []}', 200, {}))
    assert codec.held_bytes() > 2000
    codec.release("s")
    codec.release("never-seen")  # nothing held: nothing to do
    assert codec.held_bytes() == 0


def test_a_packed_mask_is_bounded_by_the_budget_as_a_built_one_is() -> None:
    from tito_rl.cassette.format.budget import DecodeBudget
    from tito_rl.cassette.format.packing import PackedColumn

    bomb = bytes([1]) + pack_u32([0xFFFFFFFF] * 64)  # a few hundred bytes standing for a trillion mask values
    with pytest.raises(CorruptCassetteError, match="decodes past"):
        PackedColumn("mask", bomb, DecodeBudget(stored=len(bomb)))
    with pytest.raises(CorruptCassetteError, match="bad run-length mask"):
        PackedColumn("mask", b"\x02" + pack_u32([3]))
    with pytest.raises(CorruptCassetteError, match="multiple of 8"):
        PackedColumn("f64", b"\x00" * 9)
    mask = PackedColumn("mask", mask_rle([0, 0, 1, 1, 1, 0]))
    assert mask == [0, 0, 1, 1, 1, 0] and mask.runs() == (0, [2, 3, 1]) and len(mask) == 6


@given(
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
    st.lists(st.integers(0, 2**32 - 1), max_size=40),
)
def test_a_token_delta_applies_to_a_context_held_in_two_parts_as_to_it_joined(
    context: list[int], output: list[int], tokens: list[int]
) -> None:
    """A reader keeps its context and the last output apart (`context_out`) and joins them in the next prompt's
    copy: the same prompt as on the joined context, and the same error past its end."""
    base, more = pack_u32(context), pack_u32(output)
    delta = token_delta(base + more, pack_u32(tokens))
    assert delta.apply(base, more) == delta.apply(base + more) == pack_u32(tokens)
    for prefix in (len(context), len(context) + len(output)):
        cut = type(delta)(prefix, b"")
        assert cut.apply(base, more) == (base + more)[: 4 * prefix]
    too_long = type(delta)(len(context) + len(output) + 1, b"")
    with pytest.raises(CorruptCassetteError, match="token delta keeps"):
        too_long.apply(base, more)
