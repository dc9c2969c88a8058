"""Recorded around slime's own adapters, replayed through them: the committed cassette
(`cassettes/targets/slime_mixed.tito`: Anthropic and OpenAI chat, JSON and SSE, a 529 retry, four sessions at
once, multi-turn tool loops), a re-recording of its scenario, a one-token edit in slime's translation code, and
a GRPO group recorded around slime.

Every test needs a slime checkout (`TITO_SLIME_PATH=/path/to/slime`, or slime on the path) and is skipped
with that reason elsewhere. Without slime, CI still replays the committed cassette through tito's adapter as
part of the conformance table (tests/test_conformance.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_helpers import ROOT, free_port, tito
from tests.target_support import slime_missing
from tests.test_targets_record_replay import WORDS, grpo_scenario, record
from tito_rl.cassette.reader import read_cassette
from tito_rl.recorder.simulate import simulate
from tito_rl.recorder.targets import slime_env
from tito_rl.replayer.replay.cassette_replay import replay_cassette_async
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

CASSETTE = ROOT / "cassettes" / "targets" / "slime_mixed.tito"
SCENARIO = ROOT / "cassettes" / "targets" / "scenarios" / "slime_mixed.yaml"
SESSIONS = ("slime-anthropic-sse", "slime-anthropic-json", "slime-chat-sse", "slime-chat-json")


def run_tito(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env
    )


pytestmark = pytest.mark.skipif(slime_missing() is not None, reason=f"needs slime: {slime_missing()}")


def test_the_committed_cassette_was_recorded_around_slime_on_both_wires() -> None:
    cassette = read_cassette(CASSETTE)
    target = cassette.header.target
    assert target["name"] == "slime" and target["kind"] == "driver" and target["version"]
    assert len(cassette.sessions) == len(SESSIONS)
    framings = set()
    for log in cassette.sessions.values():
        framings |= {(a.path, a.reply_events is not None) for a in log.agent}
        assert {e.headers.get("X-SMG-Routing-Key") for e in log.engine} == {log.name}  # the name, not the id
        assert log.samples and all(sum(s["loss_mask"]) > 0 for s in log.samples)
    assert framings == {(p, s) for p in ("/v1/messages", "/v1/chat/completions") for s in (True, False)}
    retried = [a for log in cassette.sessions.values() for a in log.agent if a.retry_of is not None]
    assert len(retried) == 2 and all(a.status == 200 for a in retried)  # the 529 (slime: 500), then its re-send
    assert not any(s.encode() in CASSETTE.read_bytes() for s in SESSIONS)  # session ids were bearer tokens


def test_the_committed_cassette_replays_through_slime_twice_byte_identical() -> None:
    first = run_tito("replay", str(CASSETTE))
    second = run_tito("replay", str(CASSETTE), "--jobs", "4")
    assert first.returncode == 0, first.stdout + first.stderr
    assert second.returncode == 0, second.stdout + second.stderr
    assert first.stdout == second.stdout
    assert "replayed through slime" not in first.stdout  # its own target: goldens checked
    assert f"{len(SESSIONS)} session(s): {len(SESSIONS)} ok, 0 failed" in first.stdout


def test_the_replay_through_slime_gives_the_live_samples_with_no_engine() -> None:
    """No engine runs here: every generation comes from the cassette, and slime's samples equal the live ones."""
    result = asyncio.run(replay_cassette_async(CASSETTE))
    assert [s.differences for s in result.sessions] == [[]] * len(SESSIONS)
    for session in result.sessions:
        (finish,) = session.finishes
        assert finish.live is not None and finish.samples == finish.live
        assert finish.tree["target"] == "slime"


def test_a_re_recording_around_slime_reproduces_the_golden(tmp_path: Path) -> None:
    out = tmp_path / CASSETTE.name
    simulate(SCENARIO, out, golden=False, timeout_s=300)
    shutil.copy(CASSETTE.with_suffix(".golden"), out.with_suffix(".golden"))
    run = run_tito("replay", str(out))
    assert run.returncode == 0, run.stdout + run.stderr  # the golden check included
    assert f"{len(SESSIONS)} session(s): {len(SESSIONS)} ok" in run.stdout


def test_a_one_token_edit_in_slime_s_translation_fails_the_replay_naming_that_token(tmp_path: Path) -> None:
    """slime's Anthropic translation with one character added to the system prompt: the Anthropic sessions fail
    at their first request, naming the token; the chat sessions (another module) still replay."""
    shutil.copytree(slime_env.locate() / "slime", tmp_path / "slime")
    anthropic = tmp_path / "slime" / "agent" / "adapters" / "anthropic.py"
    source = anthropic.read_text()
    line = 'translated.append({"role": "system", "content": flatten_content(system)})'
    assert source.count(line) == 1
    anthropic.write_text(source.replace(line, line.replace("flatten_content(system)", 'flatten_content(system) + "!"')))
    run = run_tito("replay", str(CASSETTE), env={**os.environ, "TITO_SLIME_PATH": str(tmp_path)})
    assert run.returncode == 1, run.stdout + run.stderr
    found = re.findall(
        r"engine request differs: input_ids at token (\d+) \(recorded (\d+) tokens, replayed (\d+)\)", run.stdout
    )
    assert len(found) == 2 and all(int(replayed) == int(recorded) + 1 for _, recorded, replayed in found), run.stdout
    replayed = [line for line in run.stdout.splitlines() if line.strip().startswith("replayed:")]
    assert len(replayed) == 2 and all("brief' | '.!\\n\\n# Tools" in line for line in replayed), replayed
    assert "in rendered message 0 (system)" in run.stdout
    assert f"{len(SESSIONS)} session(s): 2 ok, 2 failed" in run.stdout


def test_a_grpo_group_recorded_around_slime_gets_each_session_its_own_output_back(tmp_path: Path) -> None:
    scenario = grpo_scenario(tmp_path)
    out = tmp_path / "grpo.tito"
    port = free_port()
    with tito(
        "fake-engine",
        "--script",
        str(scenario),
        "--listen",
        f"127.0.0.1:{port}",
        ready=f"http://127.0.0.1:{port}/health",
    ):
        record(out, f"http://127.0.0.1:{port}", scenario, "--target", "slime")
    cassette = read_cassette(out)
    assert cassette.header.target["name"] == "slime"
    tokenizer = load_tokenizer()
    prompts = set()
    for log in cassette.sessions.values():
        (call,) = [e for e in log.engine if e.path == "/generate"]
        word = next(w for w in WORDS if w in tokenizer.decode(call.response["output_ids"]))
        (exchange,) = log.agent
        reply = "".join(exchange.reply_events or [])
        assert word in reply and not any(w in reply for w in WORDS if w != word)  # its own output, no other
        assert f"My word is {word}." in tokenizer.decode(log.samples[0]["tokens"])
        prompts.add((tuple(call.request["input_ids"]), exchange.path))
    assert len(cassette.sessions) == len(WORDS)
    assert len({p for p, _ in prompts}) <= 2  # identical first prompts (one per wire)
    assert run_tito("replay", str(out), "--update-goldens").returncode == 0
    for jobs in ("1", "8"):
        run = run_tito("replay", str(out), "--jobs", jobs)
        # each reply is compared with the recorded one and each sample with the live one: a session served
        # another session's output would differ in both
        assert run.returncode == 0 and f"{len(WORDS)} session(s): {len(WORDS)} ok" in run.stdout, run.stdout
