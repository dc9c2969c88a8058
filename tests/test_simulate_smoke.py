"""One smoke test per pinned client: `tito simulate` re-records a short tool loop with the real CLI (the fake
engine, the recording proxy, the CLI in a local sandbox; no GPU) into tmp_path, and the cassette replays clean
against the golden it wrote. A CLI that is not installed is skipped with the reason and how to install it:
these tests never reach the npm registry themselves (`make test` stays offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tito_rl.cassette.reader import read_cassette
from tito_rl.recorder.agents.install import install_dir, is_installed
from tito_rl.recorder.agents.pins import PINS
from tito_rl.recorder.simulate import simulate
from tito_rl.replayer.goldens import files as goldens
from tito_rl.replayer.replay.cassette_replay import replay_cassette
from tito_rl.trajectory.golden import TokenizerNames
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

# The word is the session's own: it comes back in the tool result and the answer.
WORDS = {"claude-code": "anchor", "codex": "beacon", "qwen-code": "canyon", "opencode": "delta", "gemini-cli": "echo"}


def smoke_scenario(agent: str, word: str) -> dict:
    """A shell call (each client's own shell tool: the engine maps `shell` onto what the CLI offers) and an
    answer; named per client, so its sandbox path is its own even beside a corpus recording."""
    return {
        "name": f"smoke_{agent.replace('-', '_')}",
        "after_last": "repeat",  # a client's extra request (a title, a next-speaker check) gets the answer again
        "sessions": [
            {"match": {"prompt_contains": "title generator"}, "turns": [{"text": "Smoke test"}]},
            {
                "turns": [
                    {
                        "reasoning": f"I echo {word}.",
                        "text": f"Running echo {word}.",
                        "tool_calls": [
                            {"name": "shell", "arguments": {"command": f"echo {word}", "description": "Echo the word"}}
                        ],
                    },
                    {"reasoning": "The shell answered.", "text": f"The shell printed {word}."},
                ]
            },
        ],
        "client": {
            "agent": agent,
            "task": f"Run echo {word} in the shell.",
            "timeout_s": 120,
            "record_args": ["--reward", "1"],
        },
    }


@pytest.mark.slow
@pytest.mark.parametrize("agent", sorted(WORDS))
def test_client_rerecords_a_tool_loop_that_replays_clean(agent: str, tmp_path: Path) -> None:
    pin = PINS[agent]
    if not is_installed(pin):
        pytest.skip(
            f"{agent}: {pin.spec} is not installed in {install_dir(pin)}; `make corpus` or "
            f"`tito simulate --agent {agent} ...` installs it with npm (cached there)"
        )
    scenario = tmp_path / f"smoke_{agent}.yaml"
    scenario.write_text(yaml.safe_dump(smoke_scenario(agent, WORDS[agent]), sort_keys=False))
    out = tmp_path / f"smoke_{agent}.tito"

    done = simulate(scenario, out, timeout_s=300)

    assert f"{agent} {pin.version} session smoke-{agent}-{agent}-0000 run 0: ok" in done.log, done.log
    cassette = read_cassette(out)
    assert cassette.header.agent is not None and cassette.header.agent["client"] == agent
    assert cassette.header.agent["version"] == pin.version
    (log,) = cassette.sessions.values()
    turns = [a for a in log.agent if not a.side and a.status == 200]
    assert len(turns) >= 2, "the CLI sent the tool result back for a second turn"
    assert WORDS[agent] in turns[1].body.decode(errors="replace"), "the CLI ran echo and sent its output"
    (sample,) = log.samples
    assert sample["reward"] == 1.0 and sum(sample["loss_mask"]) > 0
    golden = out.with_suffix(".golden").read_text()
    assert "samples 1, forks none" in golden
    # What `tito replay` checks, in this process (its tokenizer is loaded once for all five tests).
    result = replay_cassette(out)
    goldens.check(result, result.all_sessions, TokenizerNames(load_tokenizer(result.tokenizer_dir)))
    assert [(s.differences, s.golden) for s in result.sessions] == [([], "ok")], [
        s.golden_diff for s in result.sessions
    ]
