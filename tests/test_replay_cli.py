"""`tito replay` as a user runs it: a cassette from the real `tito record` (real processes, loopback HTTP)
replays clean, exports the live samples, replays one session when asked, gives identical bytes twice, and
refuses unusable input with exit 2 and one line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.process_helpers import ROOT, free_port, tito
from tests.replay_support import Conversation, tool_loop, tool_loop_scenario
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.recorder.taps.proxy import build_header
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.session import session_digest

SESSIONS = ("cli-live-token-a-0001", "cli-live-token-b-0002")


def replay(*args: str, seed: str = "0") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


async def _drive(url: str) -> dict[str, list[dict[str, Any]]]:
    samples = {}
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(tool_loop(Conversation(http, url, sid, stream=True)) for sid in SESSIONS))
        for sid in SESSIONS:
            async with http.post(f"{url}/tito/sessions/{sid}/finish", json={"reward": 1.0}) as resp:
                samples[sid] = (await resp.json())["samples"]
    return samples


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    folder = tmp_path_factory.mktemp("cli")
    script, out = folder / "scenario.yaml", folder / "run.tito"
    script.write_text(yaml.safe_dump(tool_loop_scenario(3)))
    engine_port, proxy_port = free_port(), free_port()
    engine, proxy = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{proxy_port}"
    with (
        tito("fake-engine", "--script", str(script), "--port", str(engine_port), ready=engine + "/health"),
        tito(
            "record",
            "--engine",
            engine,
            "--listen",
            f"127.0.0.1:{proxy_port}",
            "--out",
            str(out),
            "--quiet",
            ready=proxy + "/health",
        ),
    ):
        samples = asyncio.run(_drive(proxy))
    return out, samples


def test_a_recording_replays_clean_and_its_exported_samples_equal_the_live_ones(recorded, tmp_path: Path) -> None:
    path, live = recorded
    first = replay(str(path), "--update-goldens")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "golden written" in first.stdout and path.with_suffix(".golden").is_file()

    exported, live_file = tmp_path / "replayed.jsonl", tmp_path / "live.jsonl"
    run = replay(str(path), "--export-samples", str(exported), "--export-live-samples", str(live_file))
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stderr == ""  # nothing from third parties, no progress bar when not on a terminal
    lines = run.stdout.splitlines()
    assert lines[0] == str(path) and lines[-1] == "2 session(s): 2 ok, 0 failed"
    assert all(line.endswith("  ok") for line in lines[1:3]) and "turns 3" in lines[1]
    order = [session_digest(sid) for sid in SESSIONS]  # the sessions ran at once: the cassette's order varies
    rows = sorted(
        (json.loads(line) for line in exported.read_text().splitlines()),
        key=lambda row: (order.index(row["session"]), row["index"]),
    )
    expected = [
        {"session": session_digest(sid), "index": i, **s, "metadata": {**s["metadata"], "session": session_digest(sid)}}
        for sid in SESSIONS
        for i, s in enumerate(live[sid])
    ]
    assert rows == expected and exported.read_bytes() == live_file.read_bytes()

    one = replay(str(path), "--session", session_digest(SESSIONS[1]))
    assert one.returncode == 0 and one.stdout.splitlines()[1].startswith("  " + session_digest(SESSIONS[1]))
    assert one.stdout.splitlines()[-1] == "1 session(s): 1 ok, 0 failed"


def test_two_replays_print_and_export_the_same_bytes_whatever_the_concurrency_and_hash_seed(
    recorded, tmp_path: Path
) -> None:
    path, _ = recorded
    a = replay(str(path), "--jobs", "1", "--export-samples", str(tmp_path / "a.jsonl"), seed="1")
    b = replay(str(path), "--jobs", "4", "--export-samples", str(tmp_path / "b.jsonl"), seed="2")
    assert a.returncode == b.returncode and a.stdout == b.stdout and a.stdout
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_unusable_input_exits_2_with_one_clear_line(recorded, tmp_path: Path) -> None:
    path, _ = recorded
    corrupt = tmp_path / "corrupt.tito"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    other = tmp_path / "other-tokenizer.tito"
    header = build_header(AdapterSettings(), None)
    header.tokenizer_fingerprint = "sha256:00000000000000000000000000000000"
    CassetteWriter(other, header).close()
    cases = {
        (str(corrupt),): "corrupt cassette",
        (str(other),): "recorded with tokenizer sha256:0000",
        (str(path), "--session", "sid-0000000000000000"): "no session 'sid-0000000000000000'",
        (str(tmp_path / "missing.tito"),): "no such cassette",
    }
    for args, expected in cases.items():
        run = replay(*args)
        assert run.returncode == 2 and run.stdout == "", (args, run.stdout, run.stderr)
        assert run.stderr.count("\n") == 1 and run.stderr.startswith("tito replay: ") and expected in run.stderr, (
            run.stderr
        )
