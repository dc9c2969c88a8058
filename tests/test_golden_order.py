"""A golden lists its sessions by name, not in cassette order: the cassette keeps arrival order, which changes
between two recordings of concurrent sessions (mixed_concurrent), while the golden must not."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
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


def _count_under_lock(golden: Path, counter: Path, times: int) -> None:
    for _ in range(times):
        with goldens._locked(golden):
            value = int(counter.read_text())
            os.sched_yield()  # a read-modify-write that another holder would interleave with
            counter.write_text(str(value + 1))


def test_the_golden_lock_excludes_across_processes_and_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    """Each holder removes the lock file before it lets go (issue 40: one `tito-golden-*.lock` per golden was left
    in the temp folder after every run); a waiter that locked the removed file takes the new one instead."""
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    counter = tmp_path / "counter"
    counter.write_text("0")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_count_under_lock, args=(tmp_path / "x.golden", counter, 200)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
        assert w.exitcode == 0
    assert int(counter.read_text()) == 800  # no two holders at once: no increment lost
    assert list(temp.iterdir()) == []


def test_writing_goldens_leaves_nothing_in_the_temp_folder(tmp_path: Path, monkeypatch) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    cassette = tmp_path / "wires.tito"
    shutil.copy(CORPUS / "openai_wires.tito", cassette)
    result = replay_cassette(cassette)
    goldens.check(result, result.all_sessions, TokenizerNames(load_tokenizer(result.tokenizer_dir)), update=True)
    assert goldens.golden_path(cassette).is_file()
    assert list(temp.iterdir()) == []
