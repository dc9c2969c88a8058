"""The cassette writer's memory for expert routes (issue 46, point 3): a live session's route context (a byte an
expert id of its rows so far; 41 MB for a 107k-token session at 48 layers x top 8) is held in memory only up to
`ROUTE_MEMORY_BYTES`, the rest in an unlinked temporary file beside the cassette, and the cassette's bytes are the
ones an all-in-memory writer writes."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cassette_fuzz import channel_cassette
from tests.cassette_helpers import header
from tests.route_channels import MoeShape, route_rows, sglang_routes, vllm_routes
from tito_rl.cassette.format.codec import SessionCodec
from tito_rl.cassette.format.frames import FRAME_HEADER, decode_payload, encode_frame
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.format.routes import ROUTE_MEMORY_BYTES
from tito_rl.cassette.reader import CassetteReader
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.trajectory.adapters.tap import EngineExchange

SHAPE = MoeShape(48, 8, 128)  # a real MoE's: 384 route elements a token
ROOT = Path(__file__).resolve().parent.parent / "cassettes"


def _call(prompt: list[int], output: list[int], rows: Any, start: int = 0) -> EngineExchange:
    """A /generate call as tito's adapter records it, answering SGLang's routes of `rows` from row `start`."""
    request: dict[str, Any] = {"input_ids": prompt, "return_routed_experts": True}
    if start:
        request["routed_experts_start_len"] = start
    routes = sglang_routes(prompt + output, SHAPE, start, rows)
    response = {"text": "", "output_ids": output, "meta_info": {"id": "x", "routed_experts": routes}}
    return EngineExchange("POST", "/generate", request, 200, response, started_s=1.0, duration_s=0.5)


def _long_sessions() -> list[tuple[str, EngineExchange]]:
    """Two MoE sessions interleaved, growing to 9k tokens (3.5M route elements each): `a` as a prefix routes the
    same every turn; `b` with a row re-routed half way (the context cut there), an expert id past a byte (the
    context widened), and a `routed_experts_start_len` call."""
    rng = np.random.default_rng(46)
    tokens = {name: rng.integers(0, 151_000, 9_000).tolist() for name in ("a", "b")}
    rows = {name: route_rows(ids, SHAPE) for name, ids in tokens.items()}
    calls = []
    for turn, end in enumerate((2_500, 4_000, 5_500, 7_000, 8_000, 9_000)):
        for name in ("a", "b"):
            prompt, output = tokens[name][: end - 48], tokens[name][end - 48 : end]
            sent, start = rows[name], 0
            if name == "b" and turn == 2:
                sent = sent.copy()
                sent[1_000, 7, 3] = (sent[1_000, 7, 3] + 1) % SHAPE.experts
            if name == "b" and turn == 3:
                sent = sent.copy()
                sent[6_000, 0, 0] = 300
            if name == "b" and turn == 4:
                start = 7_000 - 48 - 1
            calls.append((name, _call(prompt, output, sent, start)))
    return calls


def test_a_long_moe_session_s_routes_stay_in_memory_under_the_bound_and_the_cassette_is_unchanged(
    tmp_path: Path,
) -> None:
    bound_dir, unbound_dir = tmp_path / "bound", tmp_path / "unbound"
    bound_dir.mkdir()
    unbound_dir.mkdir()
    bound = CassetteWriter(bound_dir / "run.tito", header())
    unbound = CassetteWriter(unbound_dir / "run.tito", header(), route_memory=None)
    context_tokens: dict[str, int] = {}
    largest = 0
    for name, call in _long_sessions():
        for writer in (bound, unbound):
            writer.engine_exchange(name, "bearer", call)
        context_tokens[name] = len(call.request["input_ids"]) + len(call.response["output_ids"])
        # The token contexts (4 bytes a token) as before; of the routes, at most the bound a session.
        assert bound._codec.held_bytes() <= 4 * sum(context_tokens.values()) + 2 * ROUTE_MEMORY_BYTES
        assert os.listdir(bound_dir) == ["run.tito"]  # the temporary files are unlinked as they are made
        largest = max(largest, unbound._codec.held_bytes())
    assert largest > 6 * ROUTE_MEMORY_BYTES  # what it bounds: two contexts of 9k tokens x 384 elements
    spilled = bound._codec.spilled_bytes()
    assert spilled >= 2 * 8_999 * SHAPE.row  # both contexts wait on disk, b's wider (an id past a byte)
    bound.session_finished("a", "bearer", 1.0, [])
    unbound.session_finished("a", "bearer", 1.0, [])
    assert 0 < bound._codec.spilled_bytes() < spilled  # a's file let go with the session
    bound.close()
    unbound.close()
    assert bound._codec.spilled_bytes() == 0  # b, still live, let go at the close
    assert (bound_dir / "run.tito").read_bytes() == (unbound_dir / "run.tito").read_bytes()


def _copy(source: bytes, route_memory: int | None, folder: Path) -> bytes:
    """A cassette's records written again by a writer with `route_memory` (cut and merge's path)."""
    out = folder / f"copy-{route_memory}.tito"
    with (
        CassetteReader(io.BytesIO(source)) as reader,
        CassetteWriter(out, reader.header, header_redacted=True, route_memory=route_memory) as writer,
    ):
        for record in reader.records():
            writer.append_redacted(record)
    data = out.read_bytes()
    out.unlink()
    return data


@pytest.mark.parametrize(
    "name", ["targets/slime_moe", "targets/moe_verifiers", "real_sglang/tito_sglang_moe", "fuzz:0", "fuzz:1"]
)
def test_route_cassettes_written_with_every_context_in_a_file_are_byte_for_byte_the_same(
    name: str, tmp_path: Path
) -> None:
    """The committed cassettes with routes (and channel fuzz cassettes: every kind of route and kept set, a session
    finished half way) copied by a writer that keeps no route element in memory (route_memory=0) and by one that
    keeps them all."""
    source = channel_cassette(int(name[5:]))[0] if name.startswith("fuzz:") else (ROOT / f"{name}.tito").read_bytes()
    spilled, in_memory = _copy(source, 0, tmp_path), _copy(source, None, tmp_path)
    assert spilled == in_memory
    if name.startswith("targets/"):  # written by format 6's writer; this one's copy of its copy is the copy
        assert _copy(spilled, 0, tmp_path) == spilled
        with CassetteReader(io.BytesIO(source)) as old, CassetteReader(io.BytesIO(spilled)) as new:
            assert list(new.records()) == list(old.records())


def test_a_context_with_no_file_to_be_had_stays_in_memory_and_a_reader_may_keep_its_own_in_a_file(
    tmp_path: Path,
) -> None:
    """An unwritable folder (or no descriptor left) keeps the context in memory, as before the bound: the same
    bytes, nothing lost. A reader's codec given a bound reads back every string from its file."""
    shape = MoeShape(4, 2, 300)  # vLLM's uint16 .npy
    tokens = list(range(1000, 1600))
    rows = route_rows(tokens, shape)
    answers = [{"choices": [{"routed_experts": vllm_routes(tokens[:n], shape, rows)}]} for n in (200, 400, 600)]
    records = [EngineRecord("s", i, "POST", "/v1/completions", {}, 200, a) for i, a in enumerate(answers)]
    plain, stuck = SessionCodec(), SessionCodec(route_memory=0, route_folder=str(tmp_path / "missing"))
    reader = SessionCodec(budget=None, route_memory=0, route_folder=str(tmp_path))
    for record in records:
        stored = plain.encode(record)
        assert stuck.encode(record) == stored
        frame = encode_frame(stored)
        length, flags, _, crc = FRAME_HEADER.unpack(frame[: FRAME_HEADER.size])
        assert reader.decode(decode_payload(frame[FRAME_HEADER.size :], flags, crc, 0)).response == record.response
    assert stuck.spilled_bytes() == 0 and stuck.held_bytes() == plain.held_bytes() == 2 * 599 * shape.row
    assert reader.spilled_bytes() == 2 * 599 * shape.row and reader.held_bytes() == 0
    assert os.listdir(tmp_path) == []
