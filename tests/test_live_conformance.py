"""The live conformance table (`replayer/live_conformance.py`) built from canned `tito audit --json` reports: the
live recordings need real runs (`make conformance`), the table building does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tito_rl.replayer import live_conformance as live
from tito_rl.replayer import live_table
from tito_rl.replayer.live_conformance import Run, Scenario, build, figures, place, read_scenario, runs_through

ROOT = Path(__file__).resolve().parent.parent


def _rule(total: int, kinds: dict[str, int] | None = None) -> dict[str, object]:
    return {"total": total, "sessions": {}, "kinds": kinds or {}, "allowed": None, "examples": []}


def _cassette(path: str, target: str, emitted: int, covered: int | None, **rules: dict[str, object]) -> dict:
    return {
        "path": path,
        "target": target,
        "sessions": 1,
        "truncated": False,
        "emitted": emitted,
        "covered": covered or 0,
        "coverage": None if covered is None else covered / emitted,
        "failing": [],
        "allowed": {},
        "rules": {k.replace("_", "-"): v for k, v in rules.items()},
        "session_figures": [],
    }


REPORT = {
    "schema": "tito-audit",
    "version": 1,
    "fail_on": [],
    "failed": False,
    "rules": {},
    "cassettes": [
        _cassette("/r/loop.tito.tito", "tito", 100, 100),
        _cassette(
            "/r/loop.slime.tito",
            "slime",
            100,
            40,
            never_trained=_rule(60, {"realign": 60}),
            prefix_break=_rule(3, {"reasoning-dropped": 2, "rewritten": 1}),
            stop_token_leak=_rule(2, {"<|im_end|>": 2}),
            tool_call_lost=_rule(1),
            sampling_override=_rule(4, {"max_tokens": 4}),
            status_changed=_rule(1, {"529 → 500": 1}),
        ),
        _cassette("/r/loop.rllm.tito", "rllm", 100, 100, prefix_break=_rule(6, {"separator": 6})),
        _cassette("/r/claude.tito.tito", "tito", 50, 50),
        _cassette("/r/claude.slime.tito", "slime", 50, None),  # no finish recorded: coverage unknown, not 0
    ],
}
RUNS = [
    Run("loop", "tito", Path("/r/loop.tito.tito")),
    Run("loop", "slime", Path("/r/loop.slime.tito")),
    Run("loop", "rllm", Path("/r/loop.rllm.tito")),
    Run("claude", "tito", Path("/r/claude.tito.tito")),
    Run("claude", "slime", Path("/r/claude.slime.tito")),
    Run("qwen", "tito", error="exit 1"),
    Run("qwen", "rllm", error="API Error: 400 Requested token count"),
]


def test_figures_sum_the_audit_per_target_and_keep_unknown_coverage_apart() -> None:
    slime = figures(REPORT, ["/r/loop.slime.tito", "/r/claude.slime.tito"])
    assert (slime.cassettes, slime.emitted, slime.covered) == (2, 150, 40)
    assert slime.cell("prefix-break", "kinds") == "3: reasoning-dropped 2, rewritten 1"
    assert slime.cell("tool-call-lost", "count") == "1"
    assert slime.cell("status-changed", "kinds") == "1: 529 → 500 1"
    assert slime.cell("regenerated-retry", "count") == "0"
    unfinished = figures(REPORT, ["/r/claude.slime.tito"])
    assert unfinished.coverage() == "-" and unfinished.fired() == "coverage -"
    assert figures(REPORT, ["/r/loop.tito.tito"]).coverage() == "1.000 (100/100)"


def test_an_audit_of_another_schema_is_refused() -> None:
    with pytest.raises(ValueError, match="tito-audit version 1"):
        figures({"schema": "tito-audit", "version": 2, "cassettes": []})


def test_the_table_puts_gateways_side_by_side_on_the_scenarios_all_recorded() -> None:
    text = build(RUNS, REPORT, ["tito", "slime", "rllm"], {"miles": "needs a GPU"})
    lines = text.splitlines()
    assert "not run here: miles (needs a GPU)" in lines[0]
    common = lines.index("**On the 1 scenario(s) every target recorded (loop).**")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[common : common + 20] if line.startswith("| ")}
    assert rows["emitted-token coverage (trained once, engine's logprob)"].endswith(
        "| 1.000 (100/100) | 0.400 (40/100) | 1.000 (100/100) |"
    )
    assert rows["prefix breaks, by kind"].endswith("| 0 | 3: reasoning-dropped 2, rewritten 1 | 6: separator 6 |")
    assert rows["stop-token leaks (replies)"].endswith("| 0 | 2: <\\|im_end\\|> 2 | 0 |")  # the pipe escaped
    everything = lines.index("**On every scenario each target recorded.**")
    assert "| scenarios (sessions) | 2 (2) | 2 (2) | 1 (1) |" in lines[everything:]
    per = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:]
        for line in lines
        if line.startswith("| qwen ") or line.startswith("| claude ") or line.startswith("| loop ")
    }
    assert per["qwen"] == ["not recorded: exit 1", "-", "not recorded: API Error: 400 Requested token count |"]
    assert per["claude"][2] == "- |"  # not through rllm: its wire is not served
    assert per["loop"][1].startswith("coverage 0.40; never-trained 60 (realign 60); prefix-break 3 (")


def test_the_table_goes_between_its_markers_and_the_rest_of_the_page_is_kept() -> None:
    page = "# Conformance\n\nfindings\n\n<!-- conformance:live:start -->\nold\n<!-- conformance:live:end -->\n\nafter\n"
    updated = place(page, "new table")
    assert updated == page.replace("\nold\n", "\nnew table\n")


def test_the_corpus_goes_through_the_targets_that_serve_its_wires() -> None:
    scenarios = {p.stem: read_scenario(p) for folder in live.SCENARIOS for p in folder.glob("*.yaml")}
    tito, slime, rllm, miles, verifiers, agentlightning, nemogym = live.TARGETS
    assert scenarios["tool_loop"].wires == {"anthropic"}  # a scripted session's default wire
    assert scenarios["mixed_concurrent"].wires == {"anthropic", "responses", "gemini", "chat"}
    assert [t.name for t in live.TARGETS if runs_through(scenarios["qwen_tool_loop"], t)] == [
        "tito",
        "slime",
        "rllm",
        "miles",
        "verifiers",
        "nemogym",
    ]
    assert not runs_through(scenarios["codex_tool_loop"], slime) and runs_through(scenarios["codex_tool_loop"], tito)
    assert not runs_through(scenarios["claude_tool_loop"], rllm)
    url_sessions = Scenario(Path("x.yaml"), frozenset({"chat"}), path_prefix=True)  # /sessions/{id} in the URL
    assert runs_through(url_sessions, rllm) and runs_through(url_sessions, miles)
    assert not runs_through(url_sessions, tito)
    # Agent Lightning: its own URL prefix, and no streaming (every real CLI streams)
    assert [t.name for t in live.TARGETS if runs_through(scenarios["agentlightning_mixed"], t)] == ["agentlightning"]
    assert not runs_through(scenarios["rllm_mixed"], agentlightning) and not runs_through(scenarios["rllm_mixed"], tito)
    assert not runs_through(scenarios["opencode_tool_loop"], agentlightning)
    # ... but mini-swe-agent's unstreamed chat, its base URL given the target's session path, goes through all seven
    mini = scenarios["agentlightning_mini_tool_loop"]
    assert mini.wires == {"chat"} and not mini.streams and mini.clis_only
    assert [t.name for t in live.TARGETS if runs_through(mini, t)] == [t.name for t in live.TARGETS]
    assert not scenarios["agentlightning_mixed"].clis_only and not scenarios["tool_loop"].clis_only
    assert runs_through(scenarios["verifiers_mixed"], verifiers) and not runs_through(scenarios["tool_loop"], verifiers)
    # scripted sessions with no URL prefix are not sessions to rllm's gateway (traced under none of tito's: no
    # samples) or miles' server (404); a CLI is handed the session's URL, so it runs through either
    assert not scenarios["verifiers_mixed"].clis_only and scenarios["opencode_tool_loop"].clis_only
    assert not runs_through(scenarios["verifiers_mixed"], rllm) and not runs_through(
        scenarios["verifiers_mixed"], miles
    )
    assert runs_through(scenarios["opencode_tool_loop"], miles) and runs_through(scenarios["opencode_tool_loop"], rllm)
    # NeMo Gym: its rollout in its own URL (/ng-rollout/<id>/...); it streams (synthesized SSE), so the CLIs go through
    assert [t.name for t in live.TARGETS if runs_through(scenarios["nemogym_mixed"], t)] == ["nemogym"]
    assert runs_through(scenarios["opencode_tool_loop"], nemogym) and not runs_through(scenarios["rllm_mixed"], nemogym)
    assert not runs_through(scenarios["verifiers_mixed"], nemogym)
    # ... and its signed session cookie: the scripted sessions keyed by it go through NeMo Gym alone
    assert scenarios["nemogym_cookie"].cookies == {"VLLMModel___policy_model"}
    assert [t.name for t in live.TARGETS if runs_through(scenarios["nemogym_cookie"], t)] == ["nemogym"]


def test_a_failed_recording_says_why_in_one_line() -> None:
    text = (
        'tito simulate: qwen.yaml: tito record exited with 1\n  stdout: ..."error":{"message":'
        "\"[API Error: 400 Requested token count exceeds the model's maximum\n"
    )
    assert live._why(text).startswith("API Error: 400 Requested token count")


def test_a_target_that_shares_no_scenario_is_set_apart_from_the_common_table_not_emptying_it() -> None:
    """Agent Lightning's proxy records only its own scenario: the common table compares the others on theirs."""
    cassettes = list(REPORT["cassettes"])  # type: ignore[call-overload]  # the canned report's list
    report = {**REPORT, "cassettes": [*cassettes, _cassette("/r/agl.agl.tito", "agl", 30, 30)]}
    runs = [*RUNS, Run("agl", "agl", Path("/r/agl.agl.tito"))]
    lines = build(runs, report, ["tito", "slime", "rllm", "agl"], {}).splitlines()
    title = (
        "**On the 1 scenario(s) every other target recorded (loop; agl recorded none of them, only its own: "
        "agl: agl).**"
    )
    common = lines.index(title)
    assert lines[common + 2] == "| | tito | slime | rllm |"  # agl is not a column of it, rather than a row of zeros
    everything = lines.index("**On every scenario each target recorded.**")
    assert lines[everything + 2] == "| | tito | slime | rllm | agl |"
    assert "| scenarios (sessions) | 2 (2) | 2 (2) | 1 (1) | 1 (1) |" in lines[everything:]
    assert live.shared({"a": {"x": "1"}, "b": {"x": "2"}}) == (["a", "b"], [])
    assert live.shared({"a": {"x": ""}, "b": {"y": ""}}) == (["a", "b"], [])  # two: nothing to set apart


def test_reuse_takes_a_recording_already_kept_and_records_nothing(tmp_path: Path) -> None:
    scenario = read_scenario(ROOT / "cassettes" / "scenarios" / "tool_loop.yaml")
    kept = tmp_path / "tool_loop.tito.tito"
    kept.write_bytes(b"an earlier run's recording")
    run = live.record(scenario, live.TARGETS[0], tmp_path, timeout_s=1.0, reuse=True)
    assert (run.cassette, run.error) == (kept, "")
    assert kept.read_bytes() == b"an earlier run's recording"  # not re-recorded
    with pytest.raises(SystemExit):
        live.main(["--reuse"])  # it needs --keep


# ---- one gateway recorded later, its columns merged into the page's table (--merge) -------------------------------

NEMOGYM = [
    _cassette("/r/loop.nemogym.tito", "nemogym", 100, 10, never_trained=_rule(90, {"masked": 90})),
    _cassette("/r/ngmix.nemogym.tito", "nemogym", 20, 20),
]
NEMOGYM_RUNS = [
    Run("loop", "nemogym", Path("/r/loop.nemogym.tito")),
    Run("ngmix", "nemogym", Path("/r/ngmix.nemogym.tito")),
    Run("qwen", "nemogym", error="exit 2"),
]


def _page(block: str) -> str:
    return f"# Conformance\n\n<!-- conformance:live:start -->\n{block}\n<!-- conformance:live:end -->\n"


def _only_nemogym(report: dict[str, object]) -> dict[str, object]:
    return {**report, "cassettes": NEMOGYM}


def test_a_target_merged_in_gets_the_columns_a_whole_run_would_have_given_it() -> None:
    old = build(RUNS, REPORT, ["tito", "slime", "rllm"], {})
    merged = live.merged(_page(old), NEMOGYM_RUNS, _only_nemogym(REPORT), ["nemogym"], {})
    cassettes = list(REPORT["cassettes"])  # type: ignore[call-overload]  # the canned report's list
    whole = build(
        [*RUNS, *NEMOGYM_RUNS],
        {**REPORT, "cassettes": [*cassettes, *NEMOGYM]},
        ["tito", "slime", "rllm", "nemogym"],
        {},
    )
    assert merged.splitlines()[0] == whole.splitlines()[0][:-1] + "; merged in a later run: nemogym."
    assert merged.splitlines()[1:] == whole.splitlines()[1:]  # every table, every cell
    assert "| emitted-token coverage (trained once, engine's logprob) | 1.000 (100/100) | 0.400 (40/100) | " in merged
    assert "| ngmix | - | - | - | coverage 1.00 |" in merged  # its own scenario: the others never run it
    # merged again (a re-run of the same gateway): its columns replaced, nothing added
    assert live.merged(_page(merged), NEMOGYM_RUNS, _only_nemogym(REPORT), ["nemogym"], {}) == merged


def test_a_merged_target_that_missed_the_common_scenarios_is_set_apart_not_compared_on_others() -> None:
    old = build(RUNS, REPORT, ["tito", "slime", "rllm"], {})
    runs = [r for r in NEMOGYM_RUNS if r.scenario != "loop"]
    lines = live.merged(_page(old), runs, _only_nemogym(REPORT), ["nemogym"], {}).splitlines()
    title = (
        "**On the 1 scenario(s) every other target recorded (loop; nemogym recorded none of them, only its own: "
        "nemogym: ngmix).**"
    )
    assert lines[lines.index(title) + 2] == "| | tito | slime | rllm |"
    everything = lines.index("**On every scenario each target recorded.**")
    assert lines[everything + 2] == "| | tito | slime | rllm | nemogym |"


def test_nemogym_merged_into_the_committed_page_leaves_every_other_column_as_written() -> None:
    """The page's own table (six gateways, recorded before NeMo Gym's driver existed) read back and NeMo Gym's
    columns put in: a scenario the old run had not got reads so for the targets that would have run it."""
    page = (ROOT / "docs" / "conformance.md").read_text(encoding="utf-8")
    block = page.split("<!-- conformance:live:start -->\n", 1)[1].split("\n<!-- conformance:live:end -->", 1)[0]
    assert live_table.render(live_table.parse(block)) == block  # read back exactly as written
    old = live_table.parse(block)
    if "nemogym" in old.targets:
        old = live_table.LiveTable(**{**old.__dict__, "targets": [t for t in old.targets if t != "nemogym"]})
    report = {
        **REPORT,
        "cassettes": [
            _cassette("/r/mini.nemogym.tito", "nemogym", 224, 19, never_trained=_rule(205, {"realign": 205})),
            _cassette("/r/ngo.nemogym.tito", "nemogym", 300, 0, prefix_break=_rule(6, {"separator": 6})),
        ],
    }
    runs = [
        Run("agentlightning_mini_tool_loop", "nemogym", Path("/r/mini.nemogym.tito")),
        Run("nemogym_opencode_tool_loop", "nemogym", Path("/r/ngo.nemogym.tito")),
    ]
    new = live_table.parse(live.merged(_page(live_table.render(old)), runs, report, ["nemogym"], {}))
    assert new.targets == [*old.targets, "nemogym"] and new.merged == ["nemogym"]
    assert new.common == old.common == ["agentlightning_mini_tool_loop"]
    for target in old.targets:  # the others' cells, as written
        assert new.first[target] == old.first[target] and new.every[target] == old.every[target]
        for name, row in old.by_scenario.items():
            assert new.by_scenario[name][target] == row[target]
    assert new.first["nemogym"]["emitted-token coverage (trained once, engine's logprob)"] == "0.085 (19/224)"
    assert new.every["nemogym"]["prefix breaks, by kind"] == "6: separator 6"
    row = new.by_scenario["nemogym_opencode_tool_loop"]  # opencode: every chat gateway would have run it
    assert row["tito"] == row["rllm"] == live_table.LATER and row["agentlightning"] == "-"  # it streams
    assert row["nemogym"].startswith("coverage 0.00; prefix-break 6")


def test_a_page_without_a_live_table_is_refused_in_one_line() -> None:
    with pytest.raises(live_table.TableError, match="no <!-- conformance:live:start -->"):
        live.merged("# Conformance\n", NEMOGYM_RUNS, _only_nemogym(REPORT), ["nemogym"], {})
    with pytest.raises(live_table.TableError, match="header line"):
        live_table.parse("| a | b |")
