"""The conformance page (`docs/conformance.md`, `make conformance`): CI replays the cassettes recorded around slime
through tito's adapter and checks the page's table is what that replay gives, with no slime installed; and the
parts of the table that read replays (a foreign target's figures from its golden, divergences, sampling params)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tito_rl.cassette.reader import read_cassette
from tito_rl.replayer import conformance
from tito_rl.replayer.comparison.differences import Difference
from tito_rl.replayer.conformance import Side, block, golden_sides, place

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ROOT / "cassettes" / "targets"
SLIME_CASSETTE = TARGETS / "slime_mixed.tito"
PAGE = ROOT / "docs" / "conformance.md"


@pytest.fixture(scope="module")
def through_tito() -> tuple[str, str]:
    return block([str(SLIME_CASSETTE)], "tito")  # the slime table only: cassettes/targets/ holds rllm's too


def test_ci_checks_the_slime_cassettes_table_through_tito_without_slime() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TITO_SLIME_PATH"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tito_rl.replayer.conformance",
            "--target",
            "tito",
            "cassettes/targets/slime_mixed.tito",
            "--check",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr  # out of date: make conformance, read the diff, commit the page
    assert run.stdout == ""


def test_rllm_recordings_replay_through_tito_and_their_table_is_current() -> None:
    """rllm's recordings are vLLM chat calls: tito's adapter calls /generate, served from them translated, so the
    prompts compare as ids (the table the page holds), and no session stalls on an engine call it cannot make."""
    rllm = sorted(str(p.relative_to(ROOT)) for p in TARGETS.glob("rllm_*.tito"))
    assert len(rllm) == 3
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl.replayer.conformance", "--target", "tito", *rllm, "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    marker, text = block([str(ROOT / p) for p in rllm], "tito")
    assert marker == "rllm-through-tito"
    assert "| rllm_opencode_tool_loop | " in text and "| 8/8 |" in text  # opencode's prompts render alike
    assert "input_ids at token 9486" in text  # Qwen Code's parameter-less tool: `null` vs an empty schema


@pytest.mark.parametrize(
    ("prefix", "count", "expected"),
    [
        ("verifiers_", 3, "| verifiers_opencode_tool_loop | "),  # vllm-generate calls: prompt ids in the request
        # sessions in its own URL (/proxy/rollout/{sid}); mini-swe-agent's prompts come out alike through tito
        (
            "agentlightning_",
            2,
            "| agentlightning_mini_tool_loop | agentlightning-mini- | OpenAI/Python, Chat JSON | 4/4 |",
        ),
        # NeMo Gym: vLLM chat calls with no prompt ids (a /tokenize follows each), served from their token_id:N output
        ("nemogym_", 3, "| nemogym_opencode_tool_loop | nemogym-opencode-too | opencode/1.18.33, Chat SSE | 8/8 |"),
    ],
)
def test_verifiers_and_agent_lightning_recordings_replay_through_tito_and_their_tables_are_current(
    prefix: str, count: int, expected: str
) -> None:
    """Recordings made around verifiers (token ids in, /inference/v1/generate) and Agent Lightning (vLLM chat, the
    session in the proxy's URL) replay through tito's adapter, and the page holds their tables as they come out."""
    paths = sorted(str(p.relative_to(ROOT)) for p in TARGETS.glob(f"{prefix}*.tito"))
    assert len(paths) == count
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl.replayer.conformance", "--target", "tito", *paths, "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    marker, text = block([str(ROOT / p) for p in paths], "tito")
    assert marker == f"{prefix.rstrip('_')}-through-tito" and expected in text


def test_the_slime_table_is_what_the_committed_corpus_gives_through_slime() -> None:
    """Where slime is installed (TITO_SLIME_PATH), the first table is checked too: a cassette added to the corpus
    (or a change in how it replays) without `make conformance` fails here."""
    from tito_rl.recorder.targets import slime_env
    from tito_rl.recorder.targets.base import TargetError

    try:
        slime_env.locate()
    except TargetError as exc:
        pytest.skip(f"needs slime: {exc}")
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl.replayer.conformance", "--target", "slime", "cassettes/", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]  # out of date: make conformance, read the diff, commit the page


def test_the_page_holds_that_table_and_a_stale_one_is_caught(through_tito: tuple[str, str]) -> None:
    marker, text = through_tito
    assert marker == "slime-through-tito"
    page = PAGE.read_text(encoding="utf-8")
    assert place(page, marker, text) == page
    stale = place(page, marker, text.replace("→", "->", 1))
    assert stale != page and place(stale, marker, text) == page  # the findings around the markers are kept


def test_the_table_through_tito_says_what_slime_did(through_tito: tuple[str, str]) -> None:
    _, text = through_tito
    rows = {line.split(" | ")[2]: line for line in text.splitlines() if line.startswith("| slime_mixed |")}
    assert set(rows) == {
        "scripted, Anthropic SSE",
        "scripted, Anthropic JSON",
        "scripted, Chat SSE",
        "scripted, Chat JSON",
    }
    # slime capped every request at its own default; the client asked for 32000
    assert all("max_new_tokens 4096 → 32000" in row for row in rows.values())
    # the engine's 529: slime answered 500, tito answers 529
    assert "status: 500 vs 529" in rows["scripted, Anthropic JSON"]
    # slime replied with the first of two parallel calls and dropped the text before them
    assert (
        "tool calls 1" in rows["scripted, Chat SSE"]
        and "text: '' vs 'Reading both files.'" in rows["scripted, Chat SSE"]
    )
    # slime's prompt for the second user question lacks the earlier reasoning (Qwen3's template): its fork
    assert "exchange 4, token 279 (message 2, assistant" in rows["scripted, Anthropic SSE"]
    # prompts and replies only: what slime trains is the live table's, its samples columns are gone
    assert all(row.count(" | ") == 6 for row in rows.values())
    assert "samples" not in text.splitlines()[2]


def test_a_foreign_target_s_figures_come_from_its_golden() -> None:
    sides = golden_sides(str(SLIME_CASSETTE))
    cassette = read_cassette(SLIME_CASSETTE)
    assert set(sides) == set(cassette.sessions)
    for name, log in cassette.sessions.items():  # the golden was written from a replay equal to the live run
        assert sides[name].samples == len(log.samples)
        assert sides[name].trained == sum(sum(s["loss_mask"]) for s in log.samples)
        assert sides[name].untrained_turns is not None
    assert sum(s.forks["earlier-response"] for s in sides.values()) == 1
    assert sorted(s.realigns for s in sides.values()) == [0, 0, 2, 2]


def test_cells_read_the_replay_s_differences() -> None:
    difference = Difference(
        "engine-request",
        "engine request differs: input_ids at token 17 (recorded 280 tokens, replayed 286)",
        0,
        0,
        [
            "recorded: …'SDK' | '.You are a helpful assistant.'  (ids from 17: [13, 2610])",
            "replayed: …'SDK' | '.\\nYou are a helpful assistant.'  (ids from 17: [624, 2610])",
            "in rendered message 0 (system): 'You are…'",
            "sampling params also differ: max_new_tokens: recorded 32000, replayed 4096",
        ],
    )
    cell = conformance._divergence_cell(difference)
    assert cell.startswith("exchange 0, token 17 (message 0, system; 280 → 286 tokens): '.You are a helpful")
    assert "→ '.\\nYou are a helpful" in cell
    sampling = conformance._sampling(
        [
            difference,
            Difference(
                "engine-request",
                "engine request differs: sampling params",
                1,
                1,
                ["max_new_tokens: recorded 29000, replayed 4096"],
            ),
        ]
    )
    assert conformance._sampling_text(sampling) == "max_new_tokens 29000–32000 → 4096 (×2)"
    side = Side(samples=1, forks=Counter(), trained=5, untrained_turns=3, realigns=1, merges=2)
    assert side.why_untrained() == "1 realign, 2 merges"


def test_a_target_that_cannot_be_loaded_is_one_line_and_exit_2() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tito_rl.replayer.conformance",
            "--target",
            "no-such-target",
            "cassettes/tool_loop.tito",
            "--print",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
