"""A golden lists its sessions by name, not in cassette order: the cassette keeps arrival order, which changes
between two recordings of concurrent sessions (mixed_concurrent), while the golden must not."""

from __future__ import annotations

import shutil
from pathlib import Path

from tito_rl.cassette.reader import read_cassette
from tito_rl.replayer.goldens import files as goldens
from tito_rl.replayer.replay.cassette_replay import replay_cassette
from tito_rl.trajectory.golden import TokenizerNames
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

CORPUS = Path(__file__).resolve().parent.parent / "cassettes"


def test_golden_sections_are_in_name_order_whatever_the_cassette_order(tmp_path: Path) -> None:
    cassette = tmp_path / "wires.tito"
    shutil.copy(CORPUS / "openai_wires.tito", cassette)
    arrival = list(read_cassette(cassette).sessions)
    assert len(arrival) == 2 and arrival != sorted(arrival)  # the case this test is about
    result = replay_cassette(cassette)
    goldens.check(result, result.all_sessions, TokenizerNames(load_tokenizer(result.tokenizer_dir)), update=True)
    written = goldens.golden_path(cassette).read_text()
    assert list(goldens.parse(written)[1]) == sorted(arrival)
    again = replay_cassette(cassette)
    goldens.check(again, again.all_sessions, TokenizerNames(load_tokenizer(again.tokenizer_dir)))
    assert [s.golden for s in again.sessions] == ["ok", "ok"]
