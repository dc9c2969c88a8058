"""The index a clean close writes (format version 2): each session read alone through it equals the full read,
a cassette without it (version 1, a killed recorder) or with a damaged one is scanned, and records never
include it."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.cassette_helpers import BEARER, final_sample, header, play, session_traffic
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.index import INDEX_AT_BYTES
from tito_rl.cassette.format.records import FORMAT_VERSION
from tito_rl.cassette.reader import CassetteReader, StoredSessions, open_cassette, read_cassette, summarize
from tito_rl.cassette.redaction import session_digest
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.trajectory.adapters.tap import AgentExchange
from tito_rl.trajectory.tokens.tokenizer import fingerprint

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def three_sessions(tmp_path: Path, qwen_tokenizer: Any) -> Path:
    """Interleaved sessions, one of them finished twice, one only probed (recorded with the real tokenizer)."""
    path = tmp_path / "three.tito"
    traffic = session_traffic(qwen_tokenizer, turns=3)
    with CassetteWriter(path, header(fingerprint())) as writer:
        writer.agent_exchange(
            "probe-run", "path", AgentExchange("HEAD", "/s/probe-run/", "", {}, b"", 200, {}, side=True)
        )
        play(writer, traffic)
        writer.session_finished(BEARER, "api", 0.5, [final_sample(traffic)])
        writer.agent_exchange(
            "probe-run", "path", AgentExchange("HEAD", "/s/probe-run/x", "", {}, b"", 200, {}, side=True)
        )
        writer.session_finished(BEARER, "api", 1.0, [final_sample(traffic), final_sample(traffic)])
    return path


def test_each_session_read_through_the_index_equals_the_full_read(
    three_sessions: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = read_cassette(three_sessions)
    assert full.header.format_version == FORMAT_VERSION == 7 and not full.truncated

    def no_scan(self: CassetteReader) -> None:
        raise AssertionError("scanned a cassette that has an index")

    monkeypatch.setattr(CassetteReader, "scan", no_scan)
    lazy = open_cassette(three_sessions, verify=False)
    assert isinstance(lazy.sessions, StoredSessions) and list(lazy.sessions) == list(full.sessions)
    for name in full.sessions:
        assert lazy.sessions[name] == full.sessions[name]
    index = lazy.sessions.index
    assert [(e.agent, e.engine, e.samples) for e in index.values()] == [(2, 0, 0), (3, 3, 3)]
    monkeypatch.undo()
    rescanned = open_cassette(three_sessions, verify=True).sessions  # every frame checked, same index
    assert isinstance(rescanned, StoredSessions)
    scanned = rescanned.index
    assert {k: (list(v.frames), v.agent, v.engine, v.samples) for k, v in scanned.items()} == {
        k: (list(v.frames), v.agent, v.engine, v.samples) for k, v in index.items()
    }


def test_replay_reads_recorded_prompts_packed_and_equal_to_the_lists(three_sessions: Path) -> None:
    from tito_rl.cassette.format.packing import PackedIds
    from tito_rl.cassette.format.records import EngineRecord
    from tito_rl.replayer.replay.loading import load_cassette

    lists = open_cassette(three_sessions, verify=False)
    packed, _ = load_cassette(three_sessions, verify=False)
    prompts = 0
    for name in lists.sessions:
        assert packed.sessions[name] == lists.sessions[name]
        for record in packed.sessions[name].records:
            if isinstance(record, EngineRecord):
                assert type(record.request["input_ids"]) is PackedIds
                prompts += 1
    assert prompts == 3
    assert all(type(r.request["input_ids"]) is list for n in lists.sessions for r in lists.sessions[n].engine)


def test_a_cassette_without_a_valid_index_is_scanned(three_sessions: Path, tmp_path: Path) -> None:
    data = three_sessions.read_bytes()
    expected = summarize(three_sessions, verify=True).to_dict()
    with CassetteReader(three_sessions) as reader:
        end = reader.records_end()
    assert end < len(data) - INDEX_AT_BYTES
    damaged_index = bytearray(data)
    damaged_index[end + 20] ^= 0xFF  # inside the index record: its checksum fails
    cases = {"killed": data[:end], "cut-in-index": data[: end + 30], "cut-in-index_at": data[:-7]}
    for name, content in cases.items():
        path = tmp_path / f"{name}.tito"
        path.write_bytes(content)
        with CassetteReader(path) as reader:
            assert reader.stored_index() is None, name
        got = summarize(path, verify=False)
        assert got.sessions == summarize(three_sessions).sessions, name  # every record, from the scan
        assert got.truncated == (name.startswith("cut")), name
        cassette = open_cassette(path, verify=False)
        assert dict(cassette.sessions) == dict(read_cassette(three_sessions).sessions), name
    assert expected["truncated"] is False
    damaged = tmp_path / "damaged.tito"  # a damaged index is not trusted, and the scan calls it corrupt
    damaged.write_bytes(bytes(damaged_index))
    with pytest.raises(CorruptCassetteError, match=f"at byte {end}"):
        summarize(damaged, verify=False)


def test_version_1_cassettes_read_as_before() -> None:
    path = ROOT / "cassettes" / "mixed_concurrent.tito"
    with CassetteReader(path) as reader:
        assert reader.header.format_version == 1 and reader.stored_index() is None
    full = read_cassette(path)
    lazy = open_cassette(path, verify=False)
    assert list(lazy.sessions) == list(full.sessions) and len(full.sessions) > 5
    assert all(lazy.sessions[n] == full.sessions[n] for n in full.sessions)


def test_a_damaged_record_is_found_before_replay_through_the_checksums(three_sessions: Path, tmp_path: Path) -> None:
    data = bytearray(three_sessions.read_bytes())
    with CassetteReader(three_sessions) as reader:
        entry = reader.stored_index()["probe-run"]
    data[entry.frames[-1] + 20] ^= 0x01  # inside the probe session's last record
    damaged = tmp_path / "damaged.tito"
    damaged.write_bytes(bytes(data))
    with pytest.raises(CorruptCassetteError, match=f"checksum mismatch in the record at byte {entry.frames[-1]}"):
        open_cassette(damaged, verify=True)
    trusting = open_cassette(damaged, verify=False)  # the index is intact: the other session reads
    assert trusting.sessions[session_digest(BEARER)] == read_cassette(three_sessions).sessions[session_digest(BEARER)]
    with pytest.raises(CorruptCassetteError, match="checksum mismatch"):
        trusting.sessions["probe-run"]


def test_a_record_that_does_not_decode_stops_the_replay_with_one_line(
    three_sessions: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checksums pass (the bytes are as written) but a record does not decode: found when its session is read."""
    from tito_rl.cassette.format.frames import FRAME_HEADER, _header_check
    from tito_rl.main import main

    data = bytearray(three_sessions.read_bytes())
    with CassetteReader(three_sessions) as reader:
        offset = reader.stored_index()[session_digest(BEARER)].frames[1]
    length = FRAME_HEADER.unpack_from(data, offset)[0]
    garbage = b"\xc1" * length  # a byte msgpack never uses
    data[offset : offset + FRAME_HEADER.size + length] = (
        FRAME_HEADER.pack(length, 0, _header_check(length, 0), zlib.crc32(garbage)) + garbage
    )
    crafted = tmp_path / "crafted.tito"
    crafted.write_bytes(bytes(data))
    assert main(["replay", str(crafted)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"tito replay: {crafted}: corrupt cassette: undecodable record at byte {offset}"
    )
