"""The scripted agent client against a real adapter app and the scripted fake engine on loopback: what it
sends (echoes, retries, disconnects, sub-agents, compaction), and `tito record --agent scripted`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.cassette_helpers import serve
from tests.process_helpers import free_port
from tests.scripted_support import (
    SCENARIOS,
    bodies,
    generations,
    output_tokens,
    record_scenario,
    session_log,
    side_flags,
    statuses,
    trained_tokens,
)
from tito_rl import main as tito_cli
from tito_rl.cassette.format.records import DropRecord
from tito_rl.cassette.reader import CassetteReader, read_cassette
from tito_rl.fake_engine.app import EngineOptions
from tito_rl.fake_engine.app import create_app as create_engine
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, load_scenario
from tito_rl.recorder import cli as record_cli
from tito_rl.recorder.scripted.client import COMPACTION_PREFIX, generated_output
from tito_rl.recorder.scripted.runs import unapplied_record_args
from tito_rl.recorder.scripted.script import parse_client_script
from tito_rl.trajectory.adapters.session import session_digest
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer


def _json_reply(body: bytes | None) -> Any:
    """A JSON reply's body, parsed."""
    assert body is not None, "a stream, not a JSON reply"
    return json.loads(body)


def _reply_blocks(events: list[str] | None) -> list[dict[str, Any]]:
    """The assistant blocks an Anthropic stream carried, rebuilt here independently of the client's parser."""
    assert events is not None, "a JSON reply, not a stream"
    blocks: list[dict[str, Any]] = []
    for event in events:
        data = json.loads(event.split("data: ", 1)[1])
        if data["type"] == "content_block_start":
            blocks.append(dict(data["content_block"]))
        elif data["type"] == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            if delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            elif delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                block["input"] = json.loads(delta["partial_json"])
    return blocks


async def test_anthropic_tool_loop_echoes_every_reply_exactly(tmp_path: Path) -> None:
    cassette, (result,) = await record_scenario(SCENARIOS / "tool_loop.yaml", tmp_path / "c.tito")
    assert result.ok and result.requests == 7 and result.samples == 1, result.line()
    log = session_log(cassette, "corpus-tool-loop-0000")
    assert statuses(log) == [200] * 7 and [a.turn_index for a in log.agent] == list(range(7))
    sent = bodies(log)
    for i in range(1, 7):
        echoed = sent[i]["messages"][-2]  # the reply, then the tool results
        assert echoed == {"role": "assistant", "content": _reply_blocks(log.agent[i - 1].reply_events)}
        assert sent[i]["messages"][:-2] == [_without_cache_control(m) for m in sent[i - 1]["messages"]]
    assert [b["type"] for b in sent[4]["messages"][-2]["content"]] == ["thinking", "tool_use", "tool_use"]
    assert len(sent[4]["messages"][-1]["content"]) == 2  # both results, in one user message, in call order
    # Claude Code's rewrites: cache_control only on the newest message; a one-block prompt later a string.
    assert [("cache_control" in json.dumps(m)) for m in sent[3]["messages"]] == [False] * 6 + [True]
    assert (
        isinstance(sent[0]["messages"][0]["content"], list)
        and sent[1]["messages"][0]["content"] == "What does this project do? Then make its tests pass."
    )
    assert all(
        a.body == json.dumps(b, separators=(",", ":"), ensure_ascii=False).encode()
        for a, b in zip(log.agent, sent, strict=True)
    )  # compact JSON, raw UTF-8
    assert trained_tokens(log) == output_tokens(generations(log))  # every turn CLEAN: all output trained


def _without_cache_control(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, list):
        blocks = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
        if message["role"] == "user" and len(blocks) == 1 and blocks[0]["type"] == "text":
            return {**message, "content": blocks[0]["text"]}
        return {**message, "content": blocks}
    return message


async def test_retry_after_529_resends_the_identical_body(tmp_path: Path) -> None:
    cassette, (result,) = await record_scenario(SCENARIOS / "retry_529.yaml", tmp_path / "c.tito")
    assert result.ok and result.retries == 1 and result.sent == 4, result.line()
    log = session_log(cassette, "corpus-retry-529-0000")
    assert statuses(log) == [200, 529, 200, 200]
    assert [a.retry_of for a in log.agent] == [None, None, 1, None]
    assert log.agent[1].body == log.agent[2].body and log.agent[2].turn_index == 1
    assert [e.status for e in generations(log)] == [200, 529, 200, 200]
    assert len(log.samples) == 1


async def test_client_disconnect_aborts_the_engine_then_the_body_is_resent(tmp_path: Path) -> None:
    cassette, (result,) = await record_scenario(SCENARIOS / "client_abort.yaml", tmp_path / "c.tito")
    assert result.ok and result.disconnects == 1, result.line()
    log = session_log(cassette, "corpus-client-abort-0000")
    assert statuses(log) == [200, 499, 200, 200] and side_flags(log) == [False, True, False, False]
    assert log.agent[2].retry_of == 1 and log.agent[1].body == log.agent[2].body
    (abort,) = [e for e in log.engine if e.path == "/abort_request"]
    aborted = next(e for e in generations(log) if e.response["meta_info"]["finish_reason"]["type"] == "abort")
    assert abort.request["rid"] == aborted.request["rid"]
    resent = generations(log)[-2]
    assert resent.request["input_ids"] == aborted.request["input_ids"]
    assert 0 < len(aborted.response["output_ids"]) < len(resent.response["output_ids"])
    (sample,) = log.samples
    assert sum(sample["loss_mask"]) == output_tokens([e for e in generations(log) if e is not aborted])


async def test_subagent_runs_between_main_turns_and_compaction_restarts_the_history(tmp_path: Path) -> None:
    cassette, (result,) = await record_scenario(SCENARIOS / "subagent.yaml", tmp_path / "s.tito")
    assert result.ok and result.samples == 2, result.line()
    sent = bodies(session_log(cassette, "corpus-subagent-0000"))
    kinds = ["sub" if "sub-agent" in b["system"][0]["text"] else "main" for b in sent]
    assert kinds == ["main", "sub", "sub", "sub", "main", "main"]
    sub_answer = _reply_blocks(session_log(cassette, "corpus-subagent-0000").agent[3].reply_events)[-1]["text"]
    agent_result = sent[4]["messages"][-1]["content"][0]
    assert agent_result["type"] == "tool_result" and agent_result["content"] == sub_answer
    assert (
        sent[1]["messages"][0]["content"][0]["text"]
        == "Find where the configuration file is loaded and which path it reads."
    )  # the Agent call's prompt

    cassette, (result,) = await record_scenario(SCENARIOS / "compaction.yaml", tmp_path / "c.tito")
    assert result.ok and result.samples == 2, result.line()
    sent = bodies(session_log(cassette, "corpus-compaction-0000"))
    assert len(sent) == 5 and len(sent[2]["messages"]) == 5  # prompt, call, result, answer, summary request
    assert (
        sent[3]["messages"][0]["content"]
        == COMPACTION_PREFIX + "Summary: the user asked how many TODO comments src holds; grep found 3."
    )
    assert sent[3]["messages"][1]["content"][0]["text"] == "And how many FIXME comments?"


def _json_wires_scenario() -> dict[str, Any]:
    turns = [
        {
            "reasoning": "Look first.",
            "text": "Listing.",
            "tool_calls": [{"name": "shell", "arguments": {"command": "ls"}}],
        },
        {"reasoning": "Done.", "text": "Two files."},
    ]
    systems = {"anthropic": "You are agent A.", "chat": "You are agent C.", "responses": "You are agent R."}
    tools = {"anthropic": ["Bash"], "chat": ["run_shell_command"], "responses": ["exec_command"]}
    return {
        "name": "json_wires",
        "after_last": "error",
        "sessions": [{"match": {"prompt_contains": s}, "turns": turns} for s in systems.values()],
        "client": {
            "sessions": [
                {
                    "id": f"json-{wire}",
                    "wire": wire,
                    "stream": False,
                    "system": system,
                    "tools": tools[wire],
                    "results": {tools[wire][0]: "a.txt\nb.txt"},
                    "steps": [
                        {"prompt": "List the files."},
                        {"finish": 0.5} if wire != "responses" else {"drop": True},
                    ],
                }
                for wire, system in systems.items()
            ]
        },
    }


async def test_json_replies_on_all_three_wires_concurrently(tmp_path: Path) -> None:
    cassette, results = await record_scenario(_json_wires_scenario(), tmp_path / "c.tito")
    assert [(r.ok, r.requests, r.finishes) for r in results] == [(True, 2, {"tool_calls": 1, "stop": 1})] * 3
    assert [r.samples for r in results] == [1, 1, None] and results[2].dropped
    a, c, r = (session_log(cassette, f"json-{w}") for w in ("anthropic", "chat", "responses"))
    assert [x.reply_events for log in (a, c, r) for x in log.agent] == [None] * 6  # JSON replies
    tool_use = _json_reply(a.agent[0].reply_body)["content"][-1]
    assert bodies(a)[1]["messages"][-1]["content"][0]["tool_use_id"] == tool_use["id"]
    call = _json_reply(c.agent[0].reply_body)["choices"][0]["message"]["tool_calls"][0]
    echoed = bodies(c)[1]["messages"][2]
    assert "reasoning_content" not in echoed and echoed["tool_calls"][0]["id"] == call["id"]
    assert echoed["tool_calls"][0]["function"]["arguments"] == '{"command":"ls"}'  # re-serialised compactly
    assert call["function"]["arguments"] == '{"command": "ls"}'
    output = _json_reply(r.agent[0].reply_body)["output"]
    sent = bodies(r)[1]
    assert sent["input"][0]["role"] == "developer" and sent["input"][-1]["call_id"] == output[-1]["call_id"]
    assert sent["input"][2] == {**output[0], "content": None} and list(sent["input"][2])[:3] == [
        "type",
        "id",
        "summary",
    ]
    assert isinstance(r.records[-1], DropRecord) and not r.samples
    for wire, log in zip(("anthropic", "chat", "responses"), (a, c, r), strict=True):  # the token stays in the header
        assert all(session_digest(f"json-{wire}").encode() not in x.body for x in log.agent)
    assert all(s["reward"] == 0.5 for s in a.samples + c.samples)


async def test_concurrency_runs_sessions_in_turn_and_generated_outputs_differ_per_session(tmp_path: Path) -> None:
    turns = [
        {
            "reasoning": "Read it.",
            "text": "Reading.",
            "tool_calls": [{"name": "shell", "arguments": {"command": "cat a"}}],
        },
        {"reasoning": "Done.", "text": "Read."},
    ]
    ids = [f"gen-{i}" for i in range(3)]
    scenario: dict[str, Any] = {
        "name": "generated",
        "after_last": "error",
        "turns": turns,
        "client": {
            "concurrency": 1,
            "sessions": [
                {
                    "id": sid,
                    "wire": "chat",
                    "stream": False,
                    "system": "You are agent G.",
                    "tools": ["run_shell_command"],
                    "results": {"run_shell_command": {"lines": 30}},
                    "steps": [{"prompt": "Read a."}, {"finish": 1.0}],
                }
                for sid in ids
            ],
        },
    }
    cassette, results = await record_scenario(scenario, tmp_path / "g.tito")
    assert [r.ok for r in results] == [True] * 3, [r.line() for r in results]
    order = [session_digest(sid) for sid in ids]
    assert list(cassette.sessions) == order
    outputs = [bodies(session_log(cassette, sid))[1]["messages"][-1]["content"] for sid in ids]
    assert outputs == [generated_output(f"{sid}/run_shell_command/0", 30) for sid in ids]
    assert len(set(outputs)) == 3 and all(o.count("\n") == 29 for o in outputs)
    assert len(load_tokenizer().encode(outputs[0])) > 300  # about as many tokens a line as real output
    with CassetteReader(tmp_path / "g.tito") as reader:  # one session at a time: each one's records after the last's
        written = [r.session for r in reader.records()]
    assert written == sorted(written, key=order.index)
    with pytest.raises(ValueError, match="client.concurrency"):
        parse_client_script({**scenario["client"], "concurrency": 0})
    with pytest.raises(ValueError, match="lines"):
        parse_client_script({"sessions": [{**scenario["client"]["sessions"][0], "results": {"Bash": {"lines": 0}}}]})


def test_client_scripts_are_parsed_strictly() -> None:
    good = {"sessions": [{"id": "x", "wire": "chat", "steps": [{"prompt": "hi"}]}]}
    assert parse_client_script(good).sessions[0].stream is True
    bad = [
        (
            {"sessions": [{"id": "x", "wire": "grpc", "steps": [{"prompt": "hi"}]}]},
            "client.sessions[0].wire: 'grpc' is not one of 'anthropic', 'chat', 'responses'",
        ),
        (
            {"sessions": [{"id": "x", "wire": "chat", "steps": [{"prompt": "a", "finish": 1}]}]},
            "client.sessions[0].steps[0]: exactly one of prompt, compact, finish, drop (got ['prompt', 'finish'])",
        ),
        (
            {"sessions": [{"id": "x", "wire": "chat", "tools": ["Nope"], "steps": [{"prompt": "a"}]}]},
            "client.sessions[0]: unknown tool 'Nope' in tools; catalog: Agent, Bash, Read, ",
        ),
        (
            {
                "sessions": [
                    {"id": "x", "wire": "chat", "results": {"Agent": {"subagent": "ghost"}}, "steps": [{"prompt": "a"}]}
                ]
            },
            "client.sessions[0]: the result of Agent names an unknown sub-agent 'ghost'",
        ),
        (
            {"sessions": [{"id": "x", "wire": "chat", "steps": [{"prompt": "a"}]}] * 2},
            "client: session ids must be unique, got ['x', 'x']",
        ),
        ({"sessions": [{"id": "x", "wire": "chat", "step": []}]}, "client.sessions[0]: unknown key 'step'; "),
        (
            {"sessions": [{"id": "x", "wire": "chat", "results": {"Bash": [1]}, "steps": [{"prompt": "a"}]}]},
            "client.sessions[0].results.Bash[0]: expected string, got integer",
        ),
    ]
    for script, message in bad:
        with pytest.raises(ValueError) as info:
            parse_client_script(script)
        assert str(info.value).startswith(message), str(info.value)


def test_record_cli_checks_the_scripted_flags(tmp_path: Path) -> None:
    def problem(*extra: str) -> str | None:
        argv = ["record", "--engine", "http://127.0.0.1:1", "--out", str(tmp_path / "o.tito"), *extra]
        return record_cli.check(tito_cli.build_parser(argv).parse_args(argv))

    def refusal(*extra: str) -> str:
        said = problem(*extra)
        assert said is not None, extra
        return said

    assert problem("--agent", "scripted") == "--agent scripted needs --scenario FILE"
    assert "no `client:` section" in refusal(
        "--agent", "scripted", "--scenario", "fake_engine/examples/claude_tool_loop.yaml"
    )
    # Without --agent, the scenario's client: section says who plays the client.
    assert problem("--scenario", str(SCENARIOS / "tool_loop.yaml")) is None
    assert "has no client: section: name the CLI with --agent" in refusal(
        "--scenario", "fake_engine/examples/claude_tool_loop.yaml"
    )
    argv = [
        "record",
        "--engine",
        "http://127.0.0.1:1",
        "--out",
        str(tmp_path / "o.tito"),
        "--scenario",
        str(SCENARIOS / "claude_tool_loop.yaml"),
    ]
    args = tito_cli.build_parser(argv).parse_args(argv)
    assert record_cli.check(args) is None
    assert args.agent == "claude-code" and args.cli_script.sessions[0].agent == "claude-code"
    assert "needs --task (or --scenario)" in refusal("--agent", "codex")
    assert problem("--agent", "scripted", "--scenario", str(SCENARIOS / "tool_loop.yaml")) is None


def test_an_agent_option_the_run_would_ignore_is_refused_in_one_line(tmp_path: Path) -> None:
    """`--sessions 24` with the scripted client used to record the script's one session and say nothing."""

    def problem(*extra: str) -> str | None:
        argv = ["record", "--engine", "http://127.0.0.1:1", "--out", str(tmp_path / "o.tito"), *extra]
        return record_cli.check(tito_cli.build_parser(argv).parse_args(argv))

    scripted = ("--agent", "scripted", "--scenario", str(SCENARIOS / "tool_loop.yaml"))
    assert problem(*scripted, "--sessions", "24") == (
        "--sessions does not apply here: the scenario's client: section says its sessions, concurrency, model and "
        "rewards"
    )
    assert problem(*scripted, "--concurrency", "2", "--reward", "1", "--task", "t").startswith(
        "--task, --concurrency, --reward do not apply here"
    )
    assert problem(*scripted, "--agent-timeout", "30") is None  # the scripted client's sessions time out with it
    cli_script = ("--scenario", str(SCENARIOS / "claude_tool_loop.yaml"))
    assert problem(*cli_script, "--sessions", "4").startswith(
        "--sessions does not apply here: the scenario's client: section lists its sessions and runs"
    )
    assert problem(*cli_script, "--reward", "1", "--agent-model", "m", "--sandbox", "local") is None
    assert problem("--sessions", "2").startswith("--sessions does not apply here: no agent is launched (--agent)")
    assert problem("--agent", "codex", "--task", "t", "--sessions", "4", "--concurrency", "2") is None
    # target options that tito's own adapter (or a driver) would ignore
    assert problem("--engine-dialect", "sglang-openai").startswith(
        "--engine-dialect sglang-openai: tito's adapter calls the engine in sglang, vllm-generate"
    )
    assert problem("--engine-dialect", "sglang") is None and problem("--engine-dialect", "vllm-openai") is None
    assert problem("--session-from", "cookie:sid").startswith(
        "--volatile, --routing-header and --session-from are for a target other"
    )
    assert problem("--engine-listen", "127.0.0.1:0") is None  # tito's adapter: the trainer's engine URL
    assert problem("--target", "rllm", "--volatile", "id").startswith(
        "--volatile and --routing-header are for an http:// target"
    )
    assert problem(
        "--target", "http://127.0.0.1:9", "--engine-listen", "127.0.0.1:9", "--session-from", "path:/x"
    ).endswith("names the session's segment once, as {sid}")
    argv = ["record", "--engine", "http://127.0.0.1:1", "--out", str(tmp_path / "o.tito"), *scripted]
    args = tito_cli.build_parser(argv).parse_args(argv)
    assert record_cli.check(args) is None and (args.sessions, args.reward, args.agent_timeout) == (1, 0.0, 600.0)


def test_record_args_left_out_of_a_run_are_named() -> None:
    def unapplied(*extra: str) -> list[str]:
        argv = ["record", "--engine", "http://127.0.0.1:1", "--out", "o.tito", *extra]
        return unapplied_record_args(tito_cli.build_parser(argv).parse_args(argv), ("--no-preserve-reasoning",))

    assert unapplied() == ["no_preserve_reasoning"]
    assert unapplied("--no-preserve-reasoning") == []


async def test_tito_record_agent_scripted_writes_the_cassette(tmp_path: Path) -> None:
    """`tito record --agent scripted --scenario` as the CLI runs it (in-process, writer process and all)."""
    scenario = SCENARIOS / "retry_529.yaml"
    out = tmp_path / "retry.tito"
    tokenizer = load_tokenizer()
    async with serve(
        create_engine(ScriptedPolicy(load_scenario(scenario), tokenizer), EngineOptions(tokenizer=tokenizer))
    ) as engine_url:
        argv = [
            "record",
            "--engine",
            engine_url,
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--out",
            str(out),
            "--agent",
            "scripted",
            "--scenario",
            str(scenario),
            "--quiet",
        ]
        rc = await asyncio.wait_for(record_cli.serve_until_signal(tito_cli.build_parser(argv).parse_args(argv)), 60)
    assert rc == 0
    cassette = read_cassette(out)
    assert not cassette.truncated
    assert cassette.header.agent is not None and cassette.header.agent["client"] == "scripted"
    assert cassette.header.agent["scenario"] == "retry_529"
    log = session_log(cassette, "corpus-retry-529-0000")
    assert statuses(log) == [200, 529, 200, 200] and log.agent[2].retry_of == 1
    assert len(log.finishes) == 1 and log.finishes[0].reward == 1.0  # the script's finish; no second one
