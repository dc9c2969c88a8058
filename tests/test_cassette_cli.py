"""`tito cassette info PATH [--json]` through the real `tito` entry point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cassette_helpers import BEARER, final_sample, header, play, session_traffic
from tito_rl.cassette.reader import CassetteReader
from tito_rl.cassette.redaction import session_digest
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.main import main
from tito_rl.trajectory.adapters.tap import AgentExchange


@pytest.fixture
def two_sessions(tmp_path: Path, qwen_tokenizer: Any) -> Path:
    path = tmp_path / "two.tito"
    traffic = session_traffic(qwen_tokenizer, turns=3)
    with CassetteWriter(path, header()) as writer:
        play(writer, traffic)
        writer.agent_exchange(
            "probe-run", "path", AgentExchange("HEAD", "/s/probe-run/", "", {}, b"", 200, {}, side=True)
        )
        writer.session_finished(BEARER, "api", 0.5, [final_sample(traffic), final_sample(traffic)])
    return path


def test_info_json_has_the_documented_shape(two_sessions: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cassette", "info", str(two_sessions), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"header", "sessions", "truncated"}
    assert out["header"] == header().to_dict()
    assert out["sessions"] == [
        {"session": session_digest(BEARER), "agent_exchanges": 3, "engine_exchanges": 3, "samples": 2},
        {"session": "probe-run", "agent_exchanges": 1, "engine_exchanges": 0, "samples": 0},
    ]
    assert out["truncated"] is False


def test_info_reports_a_truncated_tail(two_sessions: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cut = tmp_path / "cut.tito"
    with CassetteReader(two_sessions) as reader:  # a killed recorder leaves no index: its records, cut
        cut.write_bytes(two_sessions.read_bytes()[: reader.records_end() - 10])  # loses the samples record
    assert main(["cassette", "info", str(cut), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["truncated"] is True and out["sessions"][0]["samples"] == 0
    assert main(["cassette", "info", str(cut)]) == 0
    text = capsys.readouterr().out
    assert "truncated: yes" in text and "claude-code" in text and session_digest(BEARER) in text


def test_info_reads_the_index_of_a_closed_cassette_and_scans_one_without(
    two_sessions: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["cassette", "info", str(two_sessions), "--json"]) == 0
    scanned = json.loads(capsys.readouterr().out)
    no_index = tmp_path / "no-index.tito"  # what a recorder killed right after its last record leaves
    with CassetteReader(two_sessions) as reader:
        no_index.write_bytes(two_sessions.read_bytes()[: reader.records_end()])

    def no_scan(self: CassetteReader) -> None:
        raise AssertionError("scanned a cassette that has an index")

    monkeypatch.setattr(CassetteReader, "scan", no_scan)
    assert main(["cassette", "info", str(two_sessions), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == scanned
    monkeypatch.undo()
    assert main(["cassette", "info", str(no_index), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == scanned  # the same counts; complete records, no cut


def test_info_on_a_broken_file_is_an_error_not_a_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.tito"
    bad.write_bytes(b"definitely not a cassette")
    assert main(["cassette", "info", str(bad)]) == 2
    assert "not a tito cassette" in capsys.readouterr().err
