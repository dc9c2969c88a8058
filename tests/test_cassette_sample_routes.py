"""A sample's expert routes in a cassette's SamplesRecord: stored as one narrow integer array (extension 8) whether
the finish gave numpy (`Sample.to_dict(arrays=True)`, the adapter's path) or nested lists (an older writer, a
foreign gateway's samples), read back as the same nested lists (or numpy, for the audit), and compact; anything
that would not come back exactly is stored as it came."""

from __future__ import annotations

import io
import time
from typing import Any

import msgpack
import numpy as np
import pytest

from tests.cassette_helpers import header
from tito_rl.cassette.format.records import SamplesRecord
from tito_rl.cassette.format.routes import IntArray, packed_sample_routes
from tito_rl.cassette.reader import CassetteReader
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.trajectory.records import Sample


def _sample(n: int, layers: int = 4, top_k: int = 2, experts: int = 64) -> Sample:
    rng = np.random.default_rng(n)
    routes = rng.integers(0, experts, size=(n - 1, layers, top_k), dtype=np.int16)
    routes[3] = -1  # a row no answer covered
    return Sample(
        tokens=list(range(n)),
        response_length=n // 2,
        loss_mask=[1] * (n // 2),
        rollout_log_probs=[-0.5] * (n // 2),
        rollout_routed_experts=routes,
        rollout_top_p_token_ids=np.arange(n // 2, dtype=np.int32),
        rollout_top_p_token_offsets=np.arange(n // 2 + 1, dtype=np.int32),
        weight_versions=["v1"],
    )


def _round_trip(tmp_path: Any, samples: list[dict[str, Any]], packed: bool = False) -> tuple[list[Any], int]:
    path = tmp_path / f"s{len(list(tmp_path.iterdir()))}.tito"
    with CassetteWriter(path, header()) as writer:
        writer.session_finished("s", "api", 1.0, samples)
    with CassetteReader(path) as reader:
        [record] = [r for r in reader.records(packed_samples=packed) if isinstance(r, SamplesRecord)]
    return record.samples, path.stat().st_size


def test_routes_from_numpy_or_lists_read_back_as_the_same_lists_and_small(tmp_path: Any) -> None:
    sample = _sample(3000)
    as_lists = sample.to_dict()
    _, without = _round_trip(tmp_path, [{k: v for k, v in as_lists.items() if k != "rollout_routed_experts"}])
    nested = len(msgpack.packb(as_lists["rollout_routed_experts"]))  # how msgpack stores the lists: 14 bytes a row
    for given in (sample.to_dict(arrays=True), sample.to_dict()):
        [back], size = _round_trip(tmp_path, [given])
        assert back == as_lists  # nested lists, kept sets as lists: what to_dict gives
        # 2999 rows x 8 random experts under 64: a byte each before compression, no list headers; most of the
        # gain is time: one bytes object where msgpack wrote 24k ints and 15k lists (and the reader rebuilt them)
        assert size - without < nested
    [packed], _ = _round_trip(tmp_path, [sample.to_dict(arrays=True)], packed=True)
    assert isinstance(packed["rollout_routed_experts"], IntArray)  # the audit's reading: numpy, no lists built
    assert sample.rollout_routed_experts is not None
    assert np.array_equal(np.asarray(packed["rollout_routed_experts"]), sample.rollout_routed_experts)


@pytest.mark.parametrize(
    "value",
    [
        [[[1, 2]], [[3, True]]],  # a bool would read back as an int
        [[[1, 2]], [[3]]],  # ragged
        [[[1.0, 2.0]]],  # floats
        [[[1 << 63, 2]]],  # past int64 (numpy: uint64)
        "routes",
        [],
    ],
)
def test_routes_that_would_not_come_back_exactly_are_stored_as_they_came(value: Any, tmp_path: Any) -> None:
    assert packed_sample_routes(value) is None
    base = _sample(10).to_dict()
    [back], _ = _round_trip(tmp_path, [{**base, "rollout_routed_experts": value}])
    assert back["rollout_routed_experts"] == value and type(back["rollout_routed_experts"]) is type(value)


def test_wide_and_empty_routes_keep_their_values_and_shape(tmp_path: Any) -> None:
    base = _sample(10).to_dict()
    wide = np.array([[[40_000, -1]], [[70_000, 3]]], dtype=np.int32)  # past int16: four bytes each
    empty = np.zeros((0, 4, 2), dtype=np.int16)  # a one-token sample
    for routes in (wide, empty):
        [back], _ = _round_trip(tmp_path, [{**base, "rollout_routed_experts": routes}])
        assert back["rollout_routed_experts"] == routes.tolist()


def test_a_long_moe_samples_finish_path_stays_in_numpy(tmp_path: Any) -> None:
    """100k tokens x 48 layers x top 8 (38M ids): `to_dict(arrays=True)` copies an array, where nested lists took
    26 s on this host; the cassette stores them in a fraction of msgpack's ints."""
    sample = _sample(100_000, layers=48, top_k=8, experts=128)
    began = time.process_time()
    data = sample.to_dict(arrays=True)
    assert time.process_time() - began < 2.0  # a copy, not 38M Python ints (generous for a loaded host)
    out = io.BytesIO()
    writer = CassetteWriter(out, header())
    writer.session_finished("s", "api", 1.0, [data])
    writer.close()
    assert len(out.getvalue()) < 100_000 * 48 * 8  # at most a byte an expert id, after compression


def test_the_recorders_writer_process_takes_the_arrays_over_its_pipe(tmp_path: Any) -> None:
    """`tito record` writes from a child process: a finish's numpy channels cross the pipe as buffers and are stored
    as from the in-process writer (before, the pipe's msgpack refused an ndarray and the finish answered 500)."""
    from tito_rl.cassette.writer_process import WriterProcessTap

    sample = _sample(500)
    path = tmp_path / "child.tito"
    tap = WriterProcessTap(path, header())
    tap.session_finished("s", "api", 1.0, [sample.to_dict(arrays=True)])
    tap.close()
    with CassetteReader(path) as reader:
        [record] = [r for r in reader.records() if isinstance(r, SamplesRecord)]
    assert record.samples == [sample.to_dict()]
