"""A one-time build (a gateway's Python, an agent CLI) says when it starts and when it ends, with its size on disk
and its time (recorder/one_time_build.py), whether it ends well or not."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from tito_rl.recorder.one_time_build import announced, size_mb


def fake_build(folder: Path, megabytes: int) -> None:
    """A tiny build: a folder holding `megabytes` of data, a hard link to it (counted once) and a symbolic link."""
    (folder / "lib").mkdir(parents=True)
    (folder / "lib" / "data.bin").write_bytes(b"\1" * megabytes * 1_000_000)
    (folder / "lib" / "again.bin").hardlink_to(folder / "lib" / "data.bin")
    (folder / "python").symlink_to("/usr/bin/python3")


def test_a_build_prints_a_line_when_it_starts_and_one_with_its_size_and_time_when_done(tmp_path: Path) -> None:
    out = io.StringIO()
    folder = tmp_path / "gw-venv"
    with announced("gw==1.0", folder, "gateway_envs", stream=out):
        assert out.getvalue() == f"gateway_envs: installing gw==1.0 into {folder} (once; cached)\n"  # before it runs
        fake_build(folder, 3)
    start, done = out.getvalue().splitlines()
    assert re.fullmatch(r"gateway_envs: installed gw==1\.0: 3 MB in [0-9]+ s", done), done
    assert 3.0 <= size_mb(folder) < 3.1


def test_a_build_that_fails_says_so_raised_or_not(tmp_path: Path) -> None:
    out = io.StringIO()
    with pytest.raises(OSError, match="no space"), announced("cli@2", tmp_path / "cli", stream=out):
        raise OSError("no space")
    with announced("cli@2", tmp_path / "cli", stream=out) as build:
        build.ok = False  # a builder that reports its failure itself, returning instead of raising
    lines = out.getvalue().splitlines()
    assert lines[0] == lines[2] == f"tito: installing cli@2 into {tmp_path / 'cli'} (once; cached)"
    assert all(re.fullmatch(r"tito: installing cli@2 failed after [0-9]+ s", line) for line in lines[1::2]), lines


def test_the_default_stream_is_stderr_read_when_printing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with announced("x==1", tmp_path / "x"):
        pass
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("tito: installing x==1 into ")
    assert captured.err.splitlines()[1].startswith("tito: installed x==1: 0 MB in ")
