"""Splicing the model's own output ids into the next prompt (`trajectory/adapters/rendering/splice.py`).

Over loopback HTTP, with the real Qwen3 tokenizer: engine outputs that carry non-canonical token splits (the
drift a sampled model produces) come back in the next prompt as the very ids emitted, so the manager trains
every emitted token once (coverage 1.0) where rendering from text realigned and lost them. Where splicing
cannot be proven safe, the prompt is the render and the decision log says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.adapter_double import EOS, qwen3_output
from tests.adapter_support import HTTP_SCENARIOS, load_capture, running_stack, script_for
from tests.gemini_support import GeminiConversation
from tests.replay_support import Live, record, tool_loop, tool_loop_scenario
from tests.test_adapter_captures import SKIP_HEADERS
from tito_rl.cassette.format.records import Header
from tito_rl.fake_engine.drift import inject_split
from tito_rl.main import main
from tito_rl.replayer.replay.cassette_replay import replay_cassette_async
from tito_rl.replayer.replay.loading import adapter_settings
from tito_rl.trajectory.events import coverage_text

# One worker runs this module (tests/xdist_groups.py): its module-scoped fixture is made once.
pytestmark = pytest.mark.xdist_group("splice")

TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
NEWLINE = 198


def drifting(stack: Any, tokenizer: Any) -> list[list[int]]:
    """Make the engine double emit every output with one token split non-canonically; returns its outputs."""
    emitted: list[list[int]] = []

    def output_ids(text: str) -> list[int]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        drifted = inject_split(tokenizer, ids)
        emitted.append((drifted[0] if drifted else ids) + [EOS])
        return emitted[-1]

    stack.double.output_ids = output_ids
    return emitted


def coverage(stats: Any) -> str:
    return coverage_text(stats.trained_tokens, stats.emitted_tokens)


async def ask(
    http: aiohttp.ClientSession,
    url: str,
    sid: str,
    messages: list[dict[str, Any]],
    max_tokens: int = 256,
    tools: list[dict[str, Any]] = TOOLS,
    system: str = "S",
) -> dict[str, Any]:
    """One Anthropic-wire turn; the history gains the reply as Claude Code echoes it (its content blocks)."""
    body = {"model": "m", "max_tokens": max_tokens, "system": system, "tools": tools, "messages": messages}
    async with http.post(url + "/v1/messages", json=body, headers={"Authorization": f"Bearer {sid}"}) as resp:
        assert resp.status == 200, await resp.text()
        reply = await resp.json()
    messages.append({"role": "assistant", "content": reply["content"]})
    return reply


def result_for(reply: dict[str, Any], output: str = "ok") -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": b["id"], "content": output}
            for b in reply["content"]
            if b["type"] == "tool_use"
        ],
    }


def kinds(stack: Any, sid: str) -> list[str]:
    return [e.describe() for e in stack.manager.events(sid)]


# ---- the drift scenario: the fake engine's drift fault through real HTTP ----------------------------------------

SID = "splice-drift-session-01"


async def _drifting_loop(live: Live) -> None:
    conversation = live.conversation(SID)
    await tool_loop(conversation)
    await conversation.turn("And what is in src?")  # a second user prompt: history spliced across it too
    await live.finish(SID, 1.0)


def _drift_scenario() -> dict[str, Any]:
    scenario = tool_loop_scenario(4, t0={"drift": True}, t1={"drift": True}, t2={"drift": True})
    scenario["turns"].append({"reasoning": "src holds the code.", "text": "The code.", "faults": {"drift": True}})
    return scenario


@pytest.fixture(scope="module")
def drift_cassette(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[dict[str, Any]]]]:
    path = tmp_path_factory.mktemp("splice") / "drift.tito"
    live = record(path, _drift_scenario(), _drifting_loop)
    assert main(["replay", str(path), "--update-goldens"]) == 0
    return path, live


def test_drift_fault_every_emitted_token_is_trained_once(drift_cassette, capsys) -> None:
    from tests.scripted_support import generations, session_log
    from tito_rl.cassette.reader import read_cassette
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    path, live = drift_cassette
    cassette = read_cassette(path)
    assert cassette.header.adapter["splice"] is True  # the setting is recorded
    engine = generations(session_log(cassette, SID))
    outputs = [e.response["output_ids"] for e in engine]
    tokenizer = load_tokenizer()
    drifted = [o for o in outputs if tokenizer.encode(tokenizer.decode(o[:-1]), add_special_tokens=False) != o[:-1]]
    assert len(outputs) == 5 and len(drifted) == 4  # the fault really emitted non-canonical splits
    # Each prompt holds the previous prompt and output exactly as sent and emitted, then the template's "\n".
    for before, after in zip(engine, engine[1:], strict=False):
        held = before.request["input_ids"] + before.response["output_ids"]
        assert after.request["input_ids"][: len(held) + 1] == held + [NEWLINE]
    (sample,) = live[SID]
    emitted = sum(len(o) for o in outputs)
    assert sum(sample["loss_mask"]) == emitted  # coverage 1.0: every emitted token trained, once
    trained = [t for t, m in zip(sample["tokens"][-sample["response_length"] :], sample["loss_mask"], strict=True) if m]
    assert trained == [t for o in outputs for t in o]

    assert main(["replay", str(path)]) == 0  # strict: the recorded spliced prompts are what replay sends
    line = capsys.readouterr().out
    assert "samples 1  forks none  realigns 0" in line and f"trained {emitted}  coverage 1.0  ok" in line


def test_no_splice_what_if_shows_what_splicing_changes(drift_cassette, capsys) -> None:
    path, _ = drift_cassette
    assert main(["replay", str(path), "--no-splice"]) == 1  # rendered prompts differ from the recorded ones
    assert "first difference: engine request differs" in capsys.readouterr().out
    assert main(["replay", str(path), "--no-splice", "--engine-match", "order"]) == 1
    out = capsys.readouterr().out
    assert "realigns 3" in out and "coverage 0.183" in out  # the three drifted, echoed replies are lost
    assert "-stats: turns 5" in out and "+  realign(divergence inside the response of turn 0) turn=1" in out
    assert main(["diff", str(path), "--no-splice"]) == 1
    out = capsys.readouterr().out
    assert f"B: {path} under --no-splice" in out
    assert "samples 1 -> 1" in out and "trained 180 -> 33  coverage 1.0 -> 0.183  differs" in out


def test_a_header_without_the_setting_replays_as_recorded_before_splicing(monkeypatch, tmp_path: Path, capsys) -> None:
    """Cassettes from before splicing lack the key: their prompts were rendered, so they replay unspliced."""
    assert adapter_settings(Header("fingerprint", adapter={}), None, {}).splice is False
    assert adapter_settings(Header("fingerprint", adapter={"splice": True}), None, {}).splice is True
    assert adapter_settings(Header("fingerprint", adapter={"splice": True}), None, {"splice": False}).splice is False
    import tito_rl.recorder.taps.proxy as proxy

    original = proxy.adapter_settings_dict
    monkeypatch.setattr(
        proxy, "adapter_settings_dict", lambda settings: {k: v for k, v in original(settings).items() if k != "splice"}
    )
    path = tmp_path / "old.tito"
    record(path, tool_loop_scenario(3, t0={"drift": True}), _loop_and_finish, splice=False)
    monkeypatch.undo()
    assert main(["replay", str(path), "--update-goldens"]) == 0
    from tito_rl.cassette.reader import read_cassette

    assert "splice" not in read_cassette(path).header.adapter
    assert main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    assert "realigns 1" in out and "ok" in out


async def _loop_and_finish(live: Live) -> None:
    await tool_loop(live.conversation(SID))
    await live.finish(SID, 1.0)


# ---- the scenario: drift on some turns of several concurrent Claude-Code-like sessions ------------------


def _drifting_sessions_scenario(sessions: int = 6) -> dict[str, Any]:
    """Each session a tool loop of 7 or 8 model turns over two user prompts (thinking, text, one parallel call),
    on the Anthropic wire, streamed or not; the engine splits tokens on some turns: one token (the reasoning's
    first word) or several spread over the output, so also inside tool-call JSON, the text and the last token."""
    engine, client = [], []
    for k in range(sessions):
        turns: list[dict[str, Any]] = []
        for t in range(5 + k % 2):
            calls = [{"name": "shell", "arguments": {"command": f"ls part{k}/dir{t}", "description": f"List {t}"}}]
            if t == 2:
                calls.append({"name": "read", "arguments": {"file_path": f"/work/part{k}/notes{t}.md"}})
            turns.append(
                {
                    "reasoning": f"Session {k}, step {t}: I need to see what part{k}/dir{t} holds.",
                    "text": f"Looking at dir{t}.",
                    "tool_calls": calls,
                }
            )
        turns.append({"reasoning": "I have seen every folder.", "text": f"Part {k} holds {len(turns)} folders."})
        turns.append({"reasoning": "The user asks for a summary.", "text": f"In short: part {k} is all folders."})
        for t, turn in enumerate(turns):
            if (t + k) % 3 == 0:
                turn["faults"] = {"drift": True}
            elif (t + k) % 3 == 1:
                turn["faults"] = {"drift": True, "drift_splits": 4}
        engine.append({"match": {"prompt_contains": f"part {k} of the repository"}, "turns": turns})
        client.append(
            {
                "id": f"drift-session-{k}",
                "wire": "anthropic",
                "stream": k % 2 == 0,
                "system": "You are a coding agent working in /work. Be brief.",
                "tools": ["Bash", "Read"],
                "results": {"Bash": [f"file{n}.py" for n in range(6)], "Read": "# notes"},
                "steps": [
                    {"prompt": f"What is in part {k} of the repository?"},
                    {"prompt": "Summarise it in one line."},
                    {"finish": 1.0},
                ],
            }
        )
    return {"name": "drifting_sessions", "sessions": engine, "client": {"sessions": client}}


async def test_drift_on_some_turns_of_concurrent_sessions_trains_every_emitted_token_once(tmp_path: Path) -> None:
    from tests.scripted_support import generations, record_scenario, session_log
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    cassette, results = await record_scenario(_drifting_sessions_scenario(), tmp_path / "drifting.tito")
    tokenizer = load_tokenizer()
    assert len(results) == 6 and all(r.ok and r.samples == 1 for r in results), [r.line() for r in results]
    outputs_seen, drifted = 0, 0
    for result in results:
        log = session_log(cassette, result.session_id)
        outputs = [e.response["output_ids"] for e in generations(log)]
        outputs_seen += len(outputs)
        drifted += sum(tokenizer.encode(tokenizer.decode(o[:-1]), add_special_tokens=False) != o[:-1] for o in outputs)
        (sample,) = log.samples
        trained = [
            t for t, m in zip(sample["tokens"][-sample["response_length"] :], sample["loss_mask"], strict=True) if m
        ]
        assert trained == [t for o in outputs for t in o], result.session_id  # each emitted token, once, in order
    assert outputs_seen == 45 and drifted >= 25  # the fault really split tokens on most turns
    replayed = await replay_cassette_async(tmp_path / "drifting.tito")  # no golden: the recording is the check
    assert len(replayed.sessions) == 6 and all(not s.differences for s in replayed.sessions)
    for session in replayed.sessions:
        c = session.counts()
        assert (c["samples"], c["realigns"], c["forks"], c["trained"]) == (1, 0, {}, c["emitted"]), session.line()
        assert "coverage 1.0" in session.line()


# ---- what the spliced prompt is ---------------------------------------------------------------------------------


async def test_the_spliced_prompt_is_the_previous_prompt_and_output_then_the_rendered_rest(qwen_tokenizer) -> None:
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        emitted = drifting(stack, qwen_tokenizer)
        stack.double.script += [
            qwen3_output("Looking.", "I list.", [("Bash", {"command": "ls"})]),
            qwen3_output("A long answer that the token limit will cut short here.", "Done."),
            "Fine.",
        ]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        reply = await ask(http, stack.url, "p", messages)
        messages.append(result_for(reply, "README.md"))
        await ask(http, stack.url, "p", messages, max_tokens=12)  # cut: finish length, no <|im_end|>
        messages.append({"role": "user", "content": "go on"})
        await ask(http, stack.url, "p", messages)
    p0, p1, p2 = (r["input_ids"] for r in stack.double.requests)
    o0, o1 = emitted[0], emitted[1][:12]
    assert o0[-1] == EOS and o1[-1] != EOS
    assert p1[: len(p0) + len(o0) + 1] == p0 + o0 + [NEWLINE]  # the model's <|im_end|>, then the template's "\n"
    assert p2[: len(p1) + len(o1) + 2] == p1 + o1 + [EOS, NEWLINE]  # a cut reply: the template closes the turn
    adapter = stack.adapter
    rendered = adapter.renderer.encode(
        adapter.renderer.render(adapter.renderer_messages(adapter.state("p"), _turn(messages[:-1])), _openai_tools())
    )
    cut = len(p1) + len(o1) + 1
    # What follows the spliced history is exactly the template's render of the new messages, as ids.
    assert p2[cut:] == rendered[len(rendered) - (len(p2) - cut) :]
    assert p2 != rendered and qwen_tokenizer.decode(p2) == qwen_tokenizer.decode(rendered)  # drift only
    stats = stack.manager.stats("p")
    assert (stats.realigns, stats.samples, coverage(stats)) == (0, 1, "1.0")
    assert not [e for e in kinds(stack, "p") if e.startswith("unspliced")]


def _turn(messages: list[dict[str, Any]]) -> Any:
    from tito_rl.trajectory.adapters.wires import anthropic

    return anthropic.parse_request({"model": "m", "max_tokens": 1, "system": "S", "tools": TOOLS, "messages": messages})


def _openai_tools() -> list[dict[str, Any]]:
    return _turn([{"role": "user", "content": "x"}]).tools


async def test_text_the_template_normalises_is_kept_as_the_model_emitted_it(qwen_tokenizer) -> None:
    """Compact tool-call JSON and no newline before <tool_call>: the template renders both otherwise, but the
    reply is the model's own, echoed unchanged, so its ids are spliced in as emitted."""
    raw = 'Let me check.<tool_call>\n{"name":"Bash","arguments":{"command":"ls"}}\n</tool_call>'
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        stack.double.script += [raw, "Done."]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        reply = await ask(http, stack.url, "n", messages)
        messages.append(result_for(reply))
        await ask(http, stack.url, "n", messages)
    p0, p1 = (r["input_ids"] for r in stack.double.requests)
    o0 = stack.double.output_ids(raw)
    assert p1[: len(p0) + len(o0)] == p0 + o0
    assert "Let me check.\n<tool_call>" not in qwen_tokenizer.decode(p1)  # the template's spelling is not used
    stats = stack.manager.stats("n")
    assert (stats.realigns, sum(stats.forks.values()), coverage(stats)) == (0, 0, "1.0")

    async with running_stack(qwen_tokenizer, splice=False) as stack, aiohttp.ClientSession() as http:
        stack.double.script += [raw, "Done."]
        messages = [{"role": "user", "content": "go"}]
        reply = await ask(http, stack.url, "n", messages)
        messages.append(result_for(reply))
        await ask(http, stack.url, "n", messages)
    stats = stack.manager.stats("n")
    assert stats.realigns == 1 and coverage(stats) != "1.0"  # rendered: the reply is re-spelled and lost


# ---- where splicing is refused, and says so ---------------------------------------------------------------------


async def test_reasoning_dropped_on_purpose_is_rendered_and_named(qwen_tokenizer) -> None:
    """--no-preserve-reasoning: a tool loop keeps reasoning (spliced); a new user message makes the template
    drop it, which splicing must not undo: the render is sent, and both refusals are in the decisions."""
    async with running_stack(qwen_tokenizer, preserve_reasoning=False) as stack, aiohttp.ClientSession() as http:
        drifting(stack, qwen_tokenizer)
        stack.double.script += [
            qwen3_output("", "First I list.", [("Bash", {"command": "ls"})]),
            qwen3_output("It holds README.md.", "The listing is short."),
            qwen3_output("Yes.", "The user asks again."),
        ]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "what is here?"}]
        reply = await ask(http, stack.url, "r", messages)
        messages.append(result_for(reply, "README.md"))
        await ask(http, stack.url, "r", messages)  # tool loop: reasoning kept by the template, spliced
        messages.append({"role": "user", "content": "sure?"})
        await ask(http, stack.url, "r", messages)  # new query: the template drops both turns' reasoning
    p2 = stack.double.requests[2]["input_ids"]
    adapter = stack.adapter
    text = adapter.renderer.render(adapter.renderer_messages(adapter.state("r"), _turn(messages[:-1])), _openai_tools())
    assert p2 == qwen_tokenizer.encode(text, add_special_tokens=False)  # exactly the render
    assert "First I list." not in qwen_tokenizer.decode(p2)
    events = kinds(stack, "r")
    assert events[0] == (
        "unspliced(turn 1's prompt no longer renders as a prefix of this one (earlier history "
        "rendered otherwise)) turn=2"
    )
    assert stack.manager.stats("r").forks == {"earlier-response": 1}  # the manager sees the dropped reasoning


async def test_a_single_reply_whose_reasoning_the_template_drops_is_rendered_then_realigned(qwen_tokenizer) -> None:
    async with running_stack(qwen_tokenizer, preserve_reasoning=False) as stack, aiohttp.ClientSession() as http:
        stack.double.script += [qwen3_output("Answer one.", "Thinking about one."), "Answer two."]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "one"}]
        await ask(http, stack.url, "d", messages)
        messages.append({"role": "user", "content": "two"})
        await ask(http, stack.url, "d", messages)
    assert kinds(stack, "d") == [
        "unspliced(the template renders turn 0's reply otherwise than as ongoing history (e.g. reasoning dropped)) "
        "turn=1",
        f"realign(divergence inside the response of turn 0, prompt rendered: not spliced) turn=1 at="
        f"{len(stack.double.requests[0]['input_ids'])} leaf=5 tokens=12",
    ]


async def test_a_client_that_rewrites_the_reply_gets_the_render(qwen_tokenizer) -> None:
    """An echo with other reasoning is the same message to the manager (reasoning is not identity), but not
    the reply sent: the client's version is what the template renders."""
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        stack.double.script += [qwen3_output("", "I list.", [("Bash", {"command": "ls"})]), "Done."]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        reply = await ask(http, stack.url, "w", messages)
        thinking = next(b for b in messages[-1]["content"] if b["type"] == "thinking")
        thinking["thinking"] = "I list the files, as the client remembers it."
        messages.append(result_for(reply))
        await ask(http, stack.url, "w", messages)
    assert "as the client remembers it" in qwen_tokenizer.decode(stack.double.requests[1]["input_ids"])
    assert kinds(stack, "w")[0] == "unspliced(the client's echo of turn 0's reply differs from the reply sent) turn=1"


async def test_a_template_that_renders_history_around_a_turn_otherwise_is_not_spliced(qwen_tokenizer) -> None:
    """enable_thinking=False: the generation prompt's empty think block is not rendered for history, so the
    earlier prompt is not a prefix of the new render. Changed tools: the same, in the system block."""
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        stack.adapter.renderer.template_kwargs["enable_thinking"] = False
        stack.double.script += [qwen3_output("", "", [("Bash", {"command": "ls"})]), "Done."]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        reply = await ask(http, stack.url, "t", messages)
        messages.append(result_for(reply))
        await ask(http, stack.url, "t", messages)
        stack.adapter.renderer.template_kwargs.pop("enable_thinking")
        stack.double.script += [qwen3_output("", "", [("Bash", {"command": "pwd"})]), "Done."]
        messages = [{"role": "user", "content": "go"}]
        reply = await ask(http, stack.url, "u", messages)
        messages.append(result_for(reply))
        await ask(http, stack.url, "u", messages, tools=[*TOOLS, {**TOOLS[0], "name": "Read"}])
    expected = (
        "unspliced(turn 0's prompt no longer renders as a prefix of this one (earlier history rendered "
        "otherwise)) turn=1"
    )
    assert kinds(stack, "t")[0] == expected and kinds(stack, "u")[0] == expected


async def test_an_output_ending_on_another_special_token_is_not_spliced(qwen_tokenizer) -> None:
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        # the double's method, replaced for this test: every output ends on <|endoftext|>
        stack.double.output_ids = (  # type: ignore[method-assign]
            lambda text: qwen_tokenizer.encode(text, add_special_tokens=False) + [151643]
        )
        stack.double.script += [qwen3_output("", "", [("Bash", {"command": "ls"})]), "Done."]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        reply = await ask(http, stack.url, "e", messages)
        messages.append(result_for(reply))
        await ask(http, stack.url, "e", messages)
    assert kinds(stack, "e")[0] == (
        "unspliced(turn 0's output ends on a special token other than the end of turn) turn=1"
    )


async def main_sub_main(stack: Any, http: aiohttp.ClientSession, sid: str, sub_calls: int) -> list[list[int]]:
    """A main-thread turn, a sub-agent of `sub_calls` tool calls and its answer, then the main thread again, every
    output drifted; returns the prompts sent to the engine."""
    drifting(stack, stack.adapter.renderer.tokenizer)
    call = qwen3_output("", "Delegate.", [("Bash", {"command": "ls"})])
    stack.double.script += [call] * (sub_calls + 1) + ["Sub done.", "Main done."]
    main_thread: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    sub: list[dict[str, Any]] = [{"role": "user", "content": "explore"}]
    main_reply = await ask(http, stack.url, sid, main_thread)
    for _ in range(sub_calls):
        sub_reply = await ask(http, stack.url, sid, sub, system="You explore.")
        sub.append(result_for(sub_reply))
    await ask(http, stack.url, sid, sub, system="You explore.")
    main_thread.append(result_for(main_reply, "sub done"))
    await ask(http, stack.url, sid, main_thread)
    return [r["input_ids"] for r in stack.double.requests]


async def test_sub_agents_splice_onto_their_own_chains(qwen_tokenizer) -> None:
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        p = await main_sub_main(stack, http, "a", 1)
    stats = stack.manager.stats("a")
    assert (stats.samples, stats.realigns, sum(stats.forks.values()), coverage(stats)) == (2, 0, 0, "1.0")
    assert p[2][: len(p[1])] == p[1] and p[3][: len(p[0])] == p[0]  # each continues its own chain's ids


async def test_a_rewritten_reply_is_rendered_after_the_turns_before_it_stay_spliced(qwen_tokenizer) -> None:
    """Turns 0 and 1 drift; the client rewrites turn 1's reasoning. The prompt keeps turn 0's ids and renders
    from turn 1 on: the one change the manager sees is inside turn 1, the reply the client changed (a realign
    named as not spliced), never a false fork inside turn 0, which came back unchanged."""
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        emitted = drifting(stack, qwen_tokenizer)
        stack.double.script += [
            qwen3_output("", "I list.", [("Bash", {"command": "ls"})]),
            qwen3_output("", "I look closer.", [("Bash", {"command": "ls -la"})]),
            "Done.",
        ]
        messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
        reply = await ask(http, stack.url, "r", messages)
        messages.append(result_for(reply))
        reply = await ask(http, stack.url, "r", messages)
        thinking = next(b for b in messages[-1]["content"] if b["type"] == "thinking")
        thinking["thinking"] = "I look closer, as the client remembers it."
        messages.append(result_for(reply))
        await ask(http, stack.url, "r", messages)
    p0, p1, p2 = (r["input_ids"] for r in stack.double.requests)
    held = p0 + emitted[0] + [NEWLINE]
    assert p1[: len(held)] == held and p2[: len(held)] == held  # turn 0's drifted ids, in both later prompts
    assert p2[: len(p1) + len(emitted[1])] != p1 + emitted[1]  # turn 1 rendered as the client rewrote it
    assert "as the client remembers it" in qwen_tokenizer.decode(p2[len(held) :])
    stats = stack.manager.stats("r")
    assert (stats.samples, sum(stats.forks.values()), stats.realigns) == (1, 0, 1)
    unspliced, realign = kinds(stack, "r")[:2]
    assert unspliced == (
        "unspliced(the client's echo of turn 1's reply differs from the reply sent; spliced onto "
        "turn 0, rendered after it) turn=2"
    )
    assert realign.startswith("realign(divergence inside the response of turn 1, prompt rendered: not spliced) turn=2")


async def test_a_long_sub_agent_leaves_the_main_thread_spliced(qwen_tokenizer) -> None:
    """Ten sub-agent turns between two main-thread turns: more than the memory holds, but the main thread's tip
    is kept before the sub-agent's superseded turns, so it resumes spliced; every emitted token trained once."""
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        p = await main_sub_main(stack, http, "l", 10)
    assert p[-1][: len(p[0])] == p[0] and len(p) == 13
    stats = stack.manager.stats("l")
    assert (stats.samples, stats.realigns, sum(stats.forks.values()), coverage(stats)) == (2, 0, 0, "1.0")
    assert not [e for e in kinds(stack, "l") if e.startswith("unspliced")]


async def test_a_turn_let_go_is_named_when_a_prompt_continues_it(qwen_tokenizer) -> None:
    """More chains than the memory holds: the oldest tip is let go, and the prompt that continues it says so
    (then the realign its drift costs is named), instead of a silent render."""
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        drifting(stack, qwen_tokenizer)
        call = qwen3_output("", "Delegate.", [("Bash", {"command": "ls"})])
        stack.double.script += [call] * 10 + ["Main done."]
        main_thread: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
        main_reply = await ask(http, stack.url, "g", main_thread)
        for k in range(9):  # nine one-turn sub-agents: nine more tips than the main thread's
            await ask(http, stack.url, "g", [{"role": "user", "content": f"explore part {k}"}], system="You explore.")
        main_thread.append(result_for(main_reply, "parts explored"))
        await ask(http, stack.url, "g", main_thread)
    capacity = stack.adapter.state("g").splices.capacity
    assert capacity == 8
    unspliced, realign = [e for e in kinds(stack, "g") if e.endswith("turn=10") or " turn=10 " in e][:2]
    assert unspliced == (
        f"unspliced(turn 0's ids are no longer held (the session holds its last {capacity} turns, "
        "chain tips first)) turn=10"
    )
    assert realign.startswith("realign(divergence inside the response of turn 0, prompt rendered: not spliced) turn=10")


# ---- every wire: the real CLIs' echoes are spliced ----------------------------------------------------------------


async def _replay_capture(tokenizer: Any, scenario: str, splice: bool) -> Any:
    sid = f"cap-{scenario}"
    async with running_stack(tokenizer, splice=splice) as stack, aiohttp.ClientSession() as http:
        drifting(stack, tokenizer)
        seen: set[bytes] = set()
        for r in load_capture(scenario):
            if r.body not in seen and (script := script_for(r.reply)) is not None:
                stack.double.script.append(script)
                seen.add(r.body)
        for r in load_capture(scenario):
            headers = {k: v for k, v in r.headers.items() if k.lower() not in SKIP_HEADERS}
            headers["Authorization"] = f"Bearer {sid}"
            url = stack.url + r.path + (f"?{r.query}" if r.query else "")
            async with http.request(r.method, url, data=r.body or None, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
        return stack.manager.stats(sid)


@pytest.mark.parametrize("scenario", HTTP_SCENARIOS)
async def test_captured_cli_echoes_are_spliced_and_drift_costs_nothing(qwen_tokenizer, scenario: str) -> None:
    spliced = await _replay_capture(qwen_tokenizer, scenario, splice=True)
    assert spliced.forks == {} and spliced.realigns == 0 and spliced.samples == 1, spliced
    assert coverage(spliced) == "1.0"
    rendered = await _replay_capture(qwen_tokenizer, scenario, splice=False)
    if rendered.turns > 1:  # the drift is real: rendered history re-tokenises it, and the reply is lost
        assert rendered.realigns >= 1 and coverage(rendered) != "1.0", rendered


async def test_gemini_echoes_are_spliced(qwen_tokenizer) -> None:
    for splice in (True, False):
        async with running_stack(qwen_tokenizer, splice=splice) as stack, aiohttp.ClientSession() as http:
            drifting(stack, qwen_tokenizer)
            stack.double.script += [
                qwen3_output("Listing.", "I list.", [("run_shell_command", {"command": "ls"})]),
                qwen3_output("README.md and src.", "Done."),
            ]
            await GeminiConversation(http, stack.url, "gem-splice-0001").tool_loop()
        stats = stack.manager.stats("gem-splice-0001")
        assert (stats.samples, stats.realigns == 0, coverage(stats) == "1.0") == (1, splice, splice), stats


def test_coverage_is_one_only_when_every_emitted_token_is_trained() -> None:
    cases = ((5, 5), (0, 0), (9996, 10000), (21, 64), (0, 3), (10001, 10000), (6, 5))
    assert [coverage_text(*c) for c in cases] == [
        "1.0",
        "-",
        "0.999",
        "0.328",
        "0.000",
        "1.001 (trained more than emitted)",
        "1.200 (trained more than emitted)",
    ]


def test_tito_serve_and_record_take_no_splice() -> None:
    import argparse

    from tito_rl.trajectory.adapters.serve import add_arguments, settings_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert settings_from(parser.parse_args(["--engine", "http://e"])).splice is True
    assert settings_from(parser.parse_args(["--engine", "http://e", "--no-splice"])).splice is False


def test_the_pytest_plugin_replays_the_committed_drift_scenario_without_splicing(tmp_path: Path) -> None:
    import shutil

    from tests.process_helpers import ROOT
    from tests.test_pytest_plugin import INI, pytest_run

    (tmp_path / "cassettes").mkdir()
    for suffix in (".tito", ".golden"):
        shutil.copy(ROOT / "cassettes" / f"drift_spliced{suffix}", tmp_path / "cassettes")
    (tmp_path / "pytest.ini").write_text(INI)
    assert pytest_run(tmp_path, "-q").returncode == 0  # spliced, as recorded: every emitted token trained
    run = pytest_run(tmp_path, "-q", "--tito-no-splice", "--tito-engine-match", "order")
    assert run.returncode == 1 and "1 failed" in run.stdout
    assert "-stats: turns 4" in run.stdout and "coverage 1.0" in run.stdout and "coverage 0.211" in run.stdout
