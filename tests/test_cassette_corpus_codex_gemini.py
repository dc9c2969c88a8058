"""The committed real-CLI cassettes for Codex and Gemini CLI (cassettes/scenarios/codex_tool_loop.yaml,
gemini_tool_loop.yaml): each still holds what its scenario is for. These read the committed files only; a
re-recording that loses a scenario's point fails here."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.scripted_support import SCENARIOS, bodies, generations, output_tokens, session_log, side_flags, statuses
from tests.scripted_support import trained_tokens as trained
from tito_rl.cassette.reader import SessionLog, read_cassette
from tito_rl.recorder.agents.cli_script import load_cli_script


def only(name: str) -> SessionLog:
    (session,) = load_cli_script(SCENARIOS / f"{name}.yaml").sessions
    return session_log(read_cassette(SCENARIOS.parent / f"{name}.tito"), session.id)


def sse_data(log: SessionLog) -> list[dict[str, Any]]:
    """Every `data:` JSON object the adapter streamed back, over all requests, in order."""
    found = []
    for record in log.agent:
        for event in record.reply_events or []:
            found += [json.loads(line[5:]) for line in event.splitlines() if line.startswith("data:")]
    return found


def assert_one_trained_chain(log: SessionLog, turns: int) -> None:
    assert statuses(log) == [200] * turns and not any(side_flags(log))
    (sample,) = log.samples
    assert sample["reward"] == 1.0
    assert trained(log) == output_tokens(generations(log))  # every turn trained: no fork dropped one


def test_codex_echoes_reasoning_items_with_null_content_and_the_same_encrypted_content() -> None:
    log = only("codex_tool_loop")
    assert_one_trained_chain(log, turns=6)
    sent = [e["item"] for e in sse_data(log) if e.get("type") == "response.output_item.done"]
    sent_reasoning = [i for i in sent if i["type"] == "reasoning"]
    items = bodies(log)[-1]["input"]
    echoed = [i for i in items if i["type"] == "reasoning"]
    assert len(echoed) == 5 and len(sent_reasoning) == 6  # the last turn's reasoning is never sent back
    assert [i["encrypted_content"] for i in echoed] == [i["encrypted_content"] for i in sent_reasoning[:5]]
    assert all("content" in i and i["content"] is None for i in echoed)
    assert all("content" not in i for i in sent_reasoning)  # Codex adds it on echo
    assert [i["id"] for i in echoed] == [i["id"] for i in sent_reasoning[:5]]


def test_codex_parallel_calls_come_back_in_order_with_the_real_outputs() -> None:
    items = bodies(only("codex_tool_loop"))[-1]["input"]
    kinds = [i["type"] for i in items]
    at = next(n for n in range(len(kinds) - 1) if kinds[n : n + 2] == ["function_call", "function_call"])
    calls, outputs = items[at : at + 2], items[at + 2 : at + 4]
    assert [o["type"] for o in outputs] == ["function_call_output"] * 2
    assert [c["call_id"] for c in calls] == [o["call_id"] for o in outputs]
    assert [json.loads(c["arguments"])["cmd"] for c in calls][1] == "wc -l squares.py"
    results = [i["output"] for i in items if i["type"] == "function_call_output"]
    assert len(results) == 6 and all(r.startswith("Chunk ID: ") for r in results)
    assert results[1].endswith("Output:\n1\n4\n9\n16\n25\n36\n49\n64\n81\n100\n")  # python3 really ran
    assert results[2].endswith("Output:\n385\n") and results[3].endswith("Output:\n2 squares.py\n")
    assert results[5].endswith("Output:\ntotal 385\n")


def test_gemini_asks_for_thoughts_and_gets_thought_parts() -> None:
    log = only("gemini_tool_loop")
    assert_one_trained_chain(log, turns=5)
    assert {(a.path, a.query) for a in log.agent} == {("/v1beta/models/tito-policy:streamGenerateContent", "alt=sse")}
    assert all(b["generationConfig"]["thinkingConfig"]["includeThoughts"] is True for b in bodies(log))
    parts = [p for d in sse_data(log) for c in d.get("candidates", []) for p in c["content"]["parts"]]
    assert len([p for p in parts if p.get("thought") is True]) == 5


def test_gemini_echoes_calls_with_ids_and_signatures_and_wraps_shell_output() -> None:
    contents = bodies(only("gemini_tool_loop"))[-1]["contents"]
    model = [c for c in contents if c["role"] == "model"]
    assert not any(p.get("thought") for c in model for p in c["parts"])  # thoughts are dropped from history
    per_turn = [[p for p in c["parts"] if "functionCall" in p] for c in model]
    assert [len(turn) for turn in per_turn] == [1, 2, 1, 1]  # turn 2: two calls at once
    # The signature goes on each turn's first call only, as the Gemini API puts it.
    assert [["thoughtSignature" in p for p in turn] for turn in per_turn] == [[True], [True, False], [True], [True]]
    calls = [p for turn in per_turn for p in turn]
    assert all(
        re.fullmatch(rf"{p['functionCall']['name']}_\d+_{n}", p["functionCall"]["id"])
        for turn in per_turn
        for n, p in enumerate(turn)
    )
    answers = [
        p["functionResponse"] for c in contents if c["role"] == "user" for p in c["parts"] if "functionResponse" in p
    ]
    assert [a["id"] for a in answers] == [p["functionCall"]["id"] for p in calls]
    shell = [a["response"]["output"] for a in answers if a["name"] == "run_shell_command"]
    assert len(shell) == 3 and all(s.startswith("<untrusted_context>\n") for s in shell)
    # The sandbox's PID namespace: small pids that repeat in every recording, not host pids.
    assert [int(m) for s in shell for m in re.findall(r"Process Group PGID: (\d+)", s)] == [25, 27, 30]
    assert "Output: 3 words.txt" in shell[1] and "words.txt: 3 lines (alpha, beta, gamma)" in shell[2]
