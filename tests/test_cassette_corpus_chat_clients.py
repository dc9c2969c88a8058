"""The committed real-CLI cassettes for Qwen Code, opencode and the plain chat (cassettes/scenarios/
qwen_tool_loop.yaml, opencode_tool_loop.yaml, plain_chat.yaml): each still holds what its scenario is for.
These read the committed files only; a re-recording that loses a scenario's point fails here."""

from __future__ import annotations

import json

from tests.scripted_support import SCENARIOS, generations, output_tokens, session_log, side_flags, statuses
from tests.scripted_support import trained_tokens as trained
from tito_rl.cassette.reader import SessionLog, read_cassette
from tito_rl.recorder.agents.cli_script import load_cli_script
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer


def only(name: str) -> SessionLog:
    (session,) = load_cli_script(SCENARIOS / f"{name}.yaml").sessions
    return session_log(read_cassette(SCENARIOS.parent / f"{name}.tito"), session.id)


def echoed_arguments(log: SessionLog) -> list[str]:
    """The tool-call arguments the client sent back in its last request, as strings."""
    messages = json.loads(log.agent[-1].body)["messages"]
    return [c["function"]["arguments"] for m in messages for c in m.get("tool_calls") or []]


def called(log: SessionLog) -> list[str]:
    messages = json.loads(log.agent[-1].body)["messages"]
    return [c["function"]["name"] for m in messages for c in m.get("tool_calls") or []]


def engine_said_spaced_json(log: SessionLog) -> bool:
    return all('"arguments": {"' in e.response["text"] for e in generations(log) if "<tool_call>" in e.response["text"])


def assert_compact_echo_without_fork(log: SessionLog, turns: int, tool_turns: int) -> None:
    args = echoed_arguments(log)
    assert len(args) == tool_turns and engine_said_spaced_json(log)
    assert all(a == json.dumps(json.loads(a), separators=(",", ":"), ensure_ascii=False) for a in args)
    assert all('": ' not in a for a in args)  # compact: the engine's `": "` never came back
    (sample,) = log.samples
    assert sample["reward"] == 1.0
    assert len([a for a in log.agent if not a.side]) == turns


def test_qwen_code_tool_loop_echoes_compactly_and_stays_one_chain() -> None:
    log = only("qwen_tool_loop")
    assert statuses(log) == [200] * 8 and not any(side_flags(log))
    assert_compact_echo_without_fork(log, turns=8, tool_turns=7)
    names = called(log)
    assert names == ["run_shell_command", "read_file", "edit", "write_file", "glob", "grep_search", "run_shell_command"]
    assert trained(log) == output_tokens(generations(log))  # every turn trained: no fork dropped one


def test_opencode_tool_loop_keeps_its_title_request_out_and_stays_one_chain() -> None:
    log = only("opencode_tool_loop")
    assert statuses(log) == [200] * 8 and side_flags(log) == [True] + [False] * 7
    assert "You are a title generator" in json.dumps(json.loads(log.agent[0].body)["messages"][0])
    assert_compact_echo_without_fork(log, turns=7, tool_turns=6)
    names = called(log)
    assert names == ["bash", "read", "edit", "write", "bash", "bash"]
    tok = load_tokenizer()
    agent_gens = [e for e in generations(log) if "title generator" not in tok.decode(e.request["input_ids"][:600])]
    assert len(agent_gens) == 7 and trained(log) == output_tokens(agent_gens)


def test_plain_chat_without_tools_is_trained_across_both_prompts() -> None:
    log = only("plain_chat")
    bodies = [json.loads(a.body) for a in log.agent]
    assert statuses(log) == [200, 200] and not any(side_flags(log))
    assert all(b["tools"] == [] for b in bodies)  # Claude Code with --tools "": no tools at all
    assert [m["role"] for m in bodies[1]["messages"]][-2:] == ["assistant", "user"]  # --continue resumed run 1
    (sample,) = log.samples
    assert trained(log) == output_tokens(generations(log)) > 0
