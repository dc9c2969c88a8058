"""The committed mixed_concurrent cassette: ten sessions of five real CLIs recorded at once stay apart. Each
session's sample holds its own word (the engine answers it by routing key) and no other session's, each
session is one chain with one sample and no fork, and opencode's title requests are side turns."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tito_rl.cassette.reader import read_cassette
from tito_rl.recorder.agents.cli_script import load_cli_script
from tito_rl.trajectory.adapters.session import session_digest

CASSETTES = Path(__file__).resolve().parent.parent / "cassettes"
SCENARIO = CASSETTES / "scenarios" / "mixed_concurrent.yaml"


def words() -> dict[str, str]:
    """session id -> its word, from the engine script's routing keys."""
    data = yaml.safe_load(SCENARIO.read_text())
    found = {}
    for s in data["sessions"]:
        key = (s.get("match") or {}).get("routing_key")
        if key:
            found[key] = re.search(r"This session's word is (\w+)", s["turns"][0]["reasoning"]).group(1)
    return found


def test_ten_sessions_of_five_clients_each_with_its_own_word_only(qwen_tokenizer) -> None:
    script = load_cli_script(SCENARIO)
    by_word = words()
    assert len(script.sessions) == 10 and sorted(set(by_word.values())) == sorted(by_word.values())
    assert {a: sum(s.agent == a for s in script.sessions) for a in script.agents} == {
        "claude-code": 2,
        "codex": 2,
        "qwen-code": 2,
        "opencode": 2,
        "gemini-cli": 2,
    }
    cassette = read_cassette(CASSETTES / "mixed_concurrent.tito")
    assert cassette.header.agent is not None and cassette.header.agent["client"] == "mixed"
    assert sorted(cassette.header.agent["agents"]) == sorted(script.agents)
    assert len(cassette.sessions) == 10
    for session in script.sessions:
        log = cassette.sessions[session_digest(session.id)]
        (sample,) = log.samples
        text = qwen_tokenizer.decode(sample["tokens"][-sample["response_length"] :])
        own = by_word[session.id]
        assert own in text, (session.id, text[-300:])
        others = [w for w in by_word.values() if w != own and re.search(rf"\b{w}\b", text)]
        assert not others, (session.id, others)
        sides = [a for a in log.agent if a.side]
        assert len(sides) == (1 if session.agent == "opencode" else 0), session.id


def test_the_golden_shows_one_chain_per_session_and_no_fork() -> None:
    golden = (CASSETTES / "mixed_concurrent.golden").read_text()
    stats = re.findall(r"^stats: turns (\d+), side turns (\d), leaves 1, samples 1, forks none,", golden, re.M)
    assert len(stats) == 10 and all(turns == "2" for turns, _ in stats)
    assert sorted(side for _, side in stats) == ["0"] * 8 + ["1"] * 2
