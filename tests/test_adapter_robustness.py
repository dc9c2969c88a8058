"""Robustness cases over loopback HTTP: official SDK clients, retries, side requests, aborts, engine errors."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from tests.adapter_double import logprob, qwen3_output
from tests.adapter_support import running_stack

# The requests below are wire JSON handed to the SDKs as they are: `Any` to mypy, not the SDKs' TypedDicts.
TOOLS_ANTHROPIC: list[Any] = [
    {
        "name": "Bash",
        "description": "run",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    }
]
TOOLS_CHAT: list[Any] = [
    {
        "type": "function",
        "function": {"name": "Bash", "description": "run", "parameters": TOOLS_ANTHROPIC[0]["input_schema"]},
    }
]
TWO_CALLS = qwen3_output("Running both.", "Two commands.", [("Bash", {"command": "ls"}), ("Bash", {"command": "pwd"})])


def body(stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 256,
        "stream": stream,
        "system": "S",
        "tools": TOOLS_ANTHROPIC,
        "messages": [{"role": "user", "content": "list files"}],
        **extra,
    }


async def test_anthropic_sdk_stream_parallel_calls_and_token_faithful_samples(qwen_tokenizer: Any) -> None:
    import anthropic  # here, not at the top: the SDK's import is a second of every worker's collection

    async with running_stack(qwen_tokenizer) as stack:
        stack.double.script += [TWO_CALLS, qwen3_output("All done.", "Finished.")]
        client = anthropic.AsyncAnthropic(base_url=stack.url, api_key="sess-a", max_retries=0)
        async with client.messages.stream(**{k: v for k, v in body().items() if k != "stream"}) as stream:
            first = await stream.get_final_message()
        assert [b.type for b in first.content] == ["thinking", "text", "tool_use", "tool_use"]
        assert [b.input for b in first.content if b.type == "tool_use"] == [{"command": "ls"}, {"command": "pwd"}]
        assert first.stop_reason == "tool_use"
        history: list[Any] = [
            {"role": "user", "content": "list files"},
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": first.content[2].id, "content": "a.txt"},
                    {
                        "type": "tool_result",
                        "tool_use_id": first.content[3].id,
                        "content": "/w",
                        "cache_control": {"type": "ephemeral"},
                    },
                ],
            },
        ]
        second = await client.messages.create(
            model="m", max_tokens=256, system="S", tools=TOOLS_ANTHROPIC, messages=history
        )
        assert second.content[-1].text == "All done."
        # The second prompt carried both tool results, in call order, as Qwen tool responses.
        prompt = qwen_tokenizer.decode(stack.double.requests[1]["input_ids"])
        assert prompt.index("<tool_response>\na.txt") < prompt.index("<tool_response>\n/w")
        assert stack.double.headers[0]["X-SMG-Routing-Key"] == "sess-a"
        assert stack.manager.stats("sess-a").forks == {}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{stack.url}/tito/sessions/sess-a/finish", json={"reward": 1.5}) as resp,
        ):
            samples = (await resp.json())["samples"]
        assert len(samples) == 1
        sample = samples[0]
        response = sample["tokens"][-sample["response_length"] :]
        trained = [t for t, m in zip(response, sample["loss_mask"], strict=True) if m]
        expected = [stack.double.output_ids(TWO_CALLS), stack.double.output_ids(qwen3_output("All done.", "Finished."))]
        assert trained == expected[0] + expected[1]
        lps = [lp for lp, m in zip(sample["rollout_log_probs"], sample["loss_mask"], strict=True) if m]
        assert lps == [logprob(k) for k in range(len(expected[0]))] + [logprob(k) for k in range(len(expected[1]))]
        assert sample["reward"] == 1.5
        assert stack.tap.finished[0][0] == "sess-a"
        assert "sess-a" not in stack.manager.sessions()


async def test_openai_chat_sdk_stream_and_compact_argument_echo(qwen_tokenizer: Any) -> None:
    import openai  # here, not at the top: the SDK's import is a second of every worker's collection

    async with running_stack(qwen_tokenizer) as stack:
        stack.double.script += [TWO_CALLS, "done"]
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="sess-c", max_retries=0)
        msgs: list[Any] = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}]
        stream = await client.chat.completions.create(
            model="m", messages=msgs, tools=TOOLS_CHAT, stream=True, stream_options={"include_usage": True}
        )
        calls: dict[int, dict[str, Any]] = {}
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                for c in choice.delta.tool_calls or []:
                    calls.setdefault(c.index, {"id": c.id, "name": c.function.name, "arguments": ""})
                    calls[c.index]["arguments"] += c.function.arguments or ""
        assert [json.loads(c["arguments"]) for c in calls.values()] == [{"command": "ls"}, {"command": "pwd"}]
        assert usage is not None and usage.completion_tokens == len(stack.double.output_ids(TWO_CALLS))
        # Qwen Code echoes arguments re-serialised compactly and drops reasoning_content.
        msgs.append(
            {
                "role": "assistant",
                "content": "Running both.",
                "tool_calls": [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {
                            "name": c["name"],
                            "arguments": json.dumps(json.loads(c["arguments"]), separators=(",", ":")),
                        },
                    }
                    for c in calls.values()
                ],
            }
        )
        msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls.values()]
        final = await client.chat.completions.create(model="m", messages=msgs, tools=TOOLS_CHAT)
        assert final.choices[0].message.content == "done"
        stats = stack.manager.stats("sess-c")
        assert stats.forks == {} and stats.samples == 1 and stats.leaves == 1


async def test_responses_sdk_stream_and_reasoning_round_trip(qwen_tokenizer: Any) -> None:
    import openai  # here, not at the top: the SDK's import is a second of every worker's collection

    async with running_stack(qwen_tokenizer) as stack:
        stack.double.script += [TWO_CALLS, "done"]
        client = openai.AsyncOpenAI(base_url=stack.url + "/v1", api_key="sess-r", max_retries=0)
        tools: list[Any] = [
            {
                "type": "function",
                "name": "Bash",
                "description": "run",
                "strict": False,
                "parameters": TOOLS_ANTHROPIC[0]["input_schema"],
            }
        ]
        inp: list[Any] = [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "S"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        ]
        stream = await client.responses.create(
            model="m", input=inp, tools=tools, stream=True, include=["reasoning.encrypted_content"], store=False
        )
        events = [e async for e in stream]
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        output = events[-1].response.output
        assert [i.type for i in output] == ["reasoning", "message", "function_call", "function_call"]
        # Codex echo: keys re-ordered, reasoning gains content null, encrypted_content kept byte-exactly.
        for item in output:
            d = item.model_dump(exclude_none=True)
            if d["type"] == "reasoning":
                d["content"] = None
            inp.append(dict(reversed(list(d.items()))))
        inp += [
            {"type": "function_call_output", "call_id": i.call_id, "output": "ok"}
            for i in output
            if i.type == "function_call"
        ]
        final = await client.responses.create(model="m", input=inp, tools=tools, store=False)
        assert final.output_text == "done"
        stats = stack.manager.stats("sess-r")
        assert stats.forks == {} and stats.samples == 1
        # Reasoning came back through encrypted_content, so the second prompt re-renders it verbatim.
        assert "<think>\nTwo commands.\n</think>" in qwen_tokenizer.decode(stack.double.requests[1]["input_ids"])


async def test_retry_after_engine_5xx_records_one_turn(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack:
        stack.double.failures.append(("status", 503))
        stack.double.script.append("hello")
        raw = json.dumps(body(stream=False)).encode()
        headers = {"x-api-key": "sess-5", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as http:
            async with http.post(stack.url + "/v1/messages", data=raw, headers=headers) as resp:
                assert resp.status == 502
                err = await resp.json()
            assert err["type"] == "error" and "503" in err["error"]["message"]
            for _ in range(2):  # the retry, then a duplicate retry of the completed turn
                async with http.post(stack.url + "/v1/messages", data=raw, headers=headers) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["content"][0]["text"] == "hello"
        assert len(stack.double.requests) == 2  # the failed call and one successful one: no third generation
        assert stack.manager.stats("sess-5").turns == 1
        agent = [e for s, _, e in stack.tap.agent if s == "sess-5"]
        assert {src for s, src, _ in stack.tap.agent if s == "sess-5"} == {"x-api-key"}
        assert [e.status for e in agent] == [502, 200, 200]
        assert [e.retry_of for e in agent] == [None, 0, 1]
        assert agent[1].turn_index == agent[2].turn_index == 0
        assert agent[2].reply_body == agent[1].reply_body
        # The tap hears of each request (its headers' secrets) before the engine calls it causes.
        assert [what for what, s in stack.tap.order if s == "sess-5"] == [
            "request",
            "engine",
            "agent",
            "request",
            "engine",
            "agent",
            "request",
            "agent",
        ]


async def test_retry_after_broken_stream_is_served_from_the_recorded_turn(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack:
        stack.double.script.append("a long enough answer " * 20)
        raw = json.dumps(body()).encode()
        headers = {"Authorization": "Bearer sess-b"}
        async with aiohttp.ClientSession() as http:
            resp = await http.post(stack.url + "/v1/messages", data=raw, headers=headers)
            await resp.content.readline()  # the client reads one line, then the stream breaks
            resp.close()
        async with (
            aiohttp.ClientSession() as http,
            http.post(stack.url + "/v1/messages", data=raw, headers=headers) as again,
        ):
            text = await again.text()
        assert "message_stop" in text
        assert len(stack.double.requests) == 1
        assert stack.manager.stats("sess-b").turns + stack.manager.stats("sess-b").side_turns == 1


async def test_side_requests_are_answered_and_kept_out_of_the_tree(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack:
        stack.double.script += ['{"title": "List files"}', "main answer"]
        headers = {"Authorization": "Bearer sess-s"}
        title = body(stream=False, tools=[], output_config={"format": {"type": "json_schema", "schema": {}}})
        async with aiohttp.ClientSession() as http:
            async with http.head(stack.url + "/api/hello", headers=headers) as resp:
                assert resp.status == 200
            async with http.post(stack.url + "/v1/messages", json=title, headers=headers) as resp:
                assert (await resp.json())["content"][0]["text"] == '{"title": "List files"}'
            async with http.post(stack.url + "/v1/messages", json=body(stream=False), headers=headers) as resp:
                assert resp.status == 200
        stats = stack.manager.stats("sess-s")
        assert (stats.turns, stats.side_turns, stats.samples) == (1, 1, 1)
        agent = [e for s, _, e in stack.tap.agent if s == "sess-s"]
        assert [(e.method, e.side) for e in agent] == [("HEAD", True), ("POST", True), ("POST", False)]
        assert agent[1].turn_index == 0 and agent[2].turn_index == 0  # side index, tree index


async def test_a_plain_chat_session_without_tools_is_trained(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack:
        stack.double.script += ["Paris.", "About two million people."]
        headers = {"Authorization": "Bearer sess-chat"}
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        async with aiohttp.ClientSession() as http:
            async with http.post(
                stack.url + "/v1/messages", json=body(False, tools=[], messages=messages), headers=headers
            ) as resp:
                first = await resp.json()
            messages += [
                {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": "How many people live there?"},
            ]
            async with http.post(
                stack.url + "/v1/messages", json=body(False, tools=[], messages=messages), headers=headers
            ) as resp:
                assert resp.status == 200
        stats = stack.manager.stats("sess-chat")
        assert (stats.turns, stats.side_turns, stats.samples) == (2, 0, 1) and stats.trained_tokens > 0


async def test_title_requests_are_side_requests_by_what_they_ask(qwen_tokenizer: Any) -> None:
    """opencode's real title request (no tools, a title-generator system prompt) and one a user's own pattern
    names are answered but never trained; the main turn is."""
    from tests.process_helpers import capture_dir
    from tito_rl.trajectory.adapters.side_requests import DEFAULT_SIDE_PATTERNS

    title, main_turn = (json.loads(p.read_bytes()) for p in sorted((capture_dir("opencode") / "bodies").glob("*"))[:2])
    assert not title.get("tools") and main_turn.get("tools")
    custom = body(False, tools=[], system="Label the ticket below for the triage board.")
    patterns = (*DEFAULT_SIDE_PATTERNS, r"\blabel the ticket\b")
    async with running_stack(qwen_tokenizer, side_patterns=patterns) as stack, aiohttp.ClientSession() as http:
        stack.double.script += ["Listing files", "ok"]
        headers = {"Authorization": "Bearer sess-t"}
        for payload in ({**title, "stream": False}, {**main_turn, "stream": False}):
            async with http.post(stack.url + "/v1/chat/completions", json=payload, headers=headers) as resp:
                assert resp.status == 200
        stack.double.script += ["Triage"]
        async with http.post(stack.url + "/v1/messages", json=custom, headers=headers) as resp:
            assert resp.status == 200
    stats = stack.manager.stats("sess-t")
    assert (stats.turns, stats.side_turns) == (1, 2)
    agent = [e for s, _, e in stack.tap.agent if s == "sess-t"]
    assert [e.side for e in agent] == [True, False, True]


def test_a_bad_side_pattern_fails_at_start_up_naming_it(qwen_tokenizer: Any) -> None:
    from tito_rl.trajectory.adapters.app import Adapter, AdapterSettings

    with pytest.raises(ValueError, match=r"side-request pattern '\(unclosed' is not a regular expression"):
        Adapter(AdapterSettings(side_patterns=("(unclosed",)))


@pytest.mark.parametrize("router", [False, True])
async def test_client_disconnect_aborts_the_generation(qwen_tokenizer: Any, router: bool) -> None:
    async with running_stack(qwen_tokenizer, router=router) as stack:
        stack.double.failures.append(("slow", 30))
        stack.double.script.append("partial output that never finishes")
        async with aiohttp.ClientSession() as http:
            task = asyncio.ensure_future(
                http.post(stack.url + "/v1/messages", json=body(), headers={"Authorization": "Bearer sess-x"})
            )
            while not stack.double.requests:
                await asyncio.sleep(0.01)
            task.cancel()
        for _ in range(12_000):  # 120 s: a hang's bound, far from the milliseconds it takes
            if stack.manager.sessions() and stack.manager.stats("sess-x").side_turns:
                break
            await asyncio.sleep(0.01)
        rid = stack.double.requests[0]["rid"]
        aborted_on = stack.double.worker if router else stack.double  # type: ignore[attr-defined]
        assert aborted_on.aborts == [rid]
        assert len(rid) == 32
        stats = stack.manager.stats("sess-x")
        assert (stats.turns, stats.side_turns, stats.samples) == (0, 1, 0)
        paths = [e.path for _, _, e in stack.tap.engine]
        assert "/generate" in paths and any(p.endswith("/abort_request") for p in paths)
        if router:
            assert "/workers" in paths


@pytest.mark.parametrize(
    "failure,status",
    [(("status", 400), 400), (("status", 500), 502), (("malformed", None), 502), (("drop", None), 502)],
)
async def test_engine_errors_map_to_client_error_formats(
    qwen_tokenizer: Any, failure: tuple[str, Any], status: int
) -> None:
    async with running_stack(qwen_tokenizer) as stack:
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS_CHAT}
        resp_body = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "Bash"}]}
        async with aiohttp.ClientSession() as http:
            for path, payload, check in [
                ("/v1/messages", body(stream=False), lambda e: e["type"] == "error" and e["error"]["message"]),
                ("/v1/chat/completions", chat, lambda e: e["error"]["message"]),
                ("/v1/responses", resp_body, lambda e: e["error"]["message"]),
            ]:
                stack.double.failures.append(failure)
                async with http.post(stack.url + path, json=payload, headers={"Authorization": "Bearer e"}) as r:
                    assert r.status == status
                    assert check(await r.json())
        assert stack.manager.sessions() == [] or stack.manager.stats("e").turns == 0


async def test_an_overloaded_engine_answers_each_wires_overloaded_status(qwen_tokenizer: Any) -> None:
    """An engine 529 is Anthropic's 529 overloaded_error (what Claude Code retries with its overloaded back-off),
    and 503 on the OpenAI and Gemini wires (what their clients retry), never a plain 502."""
    import anthropic  # here, not at the top: the SDK's import is a second of every worker's collection

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    gemini = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        for path, payload, status, kind, expected in [
            ("/v1/messages", body(stream=False), 529, lambda e: e["error"]["type"], "overloaded_error"),
            ("/v1/chat/completions", chat, 503, lambda e: e["error"]["type"], "server_error"),
            ("/v1/responses", {"model": "m", "input": "hi"}, 503, lambda e: e["error"]["type"], "server_error"),
            ("/v1beta/models/g:generateContent", gemini, 503, lambda e: e["error"]["status"], "UNAVAILABLE"),
        ]:
            stack.double.failures.append(("status", 529))
            async with http.post(stack.url + path, json=payload, headers={"Authorization": "Bearer ov"}) as r:
                assert (r.status, kind(await r.json())) == (status, expected), path
        stack.double.failures.append(("status", 529))
        client = anthropic.AsyncAnthropic(base_url=stack.url, api_key="ov-sdk", max_retries=0)
        with pytest.raises(anthropic.OverloadedError):  # the SDK's own class for 529: its retry logic's input
            await client.messages.create(**{k: v for k, v in body().items() if k != "stream"})
        stack.double.failures.append(("status", 529))
        stack.double.script.append("hello")
        retrying = anthropic.AsyncAnthropic(base_url=stack.url, api_key="ov-sdk", max_retries=1)
        answer = await retrying.messages.create(**{k: v for k, v in body().items() if k != "stream"})
        assert answer.content[-1].text == "hello" and stack.manager.stats("ov-sdk").turns == 1


async def test_engine_unreachable_and_bad_requests(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack:
        stack.adapter.engine.base_url = "http://127.0.0.1:9"  # nothing listens on the discard port
        async with aiohttp.ClientSession() as http:
            async with http.post(
                stack.url + "/v1/chat/completions",
                headers={"Authorization": "Bearer u"},
                json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            ) as r:
                assert r.status == 502 and "unreachable" in (await r.json())["error"]["message"]
            async with http.post(stack.url + "/v1/messages", data=b"{nope") as r:
                assert r.status == 400 and (await r.json())["type"] == "error"
            async with http.post(stack.url + "/v1/responses", json={"input": []}) as r:
                assert r.status == 400 and "input" in (await r.json())["error"]["message"]


async def test_sampling_params_follow_the_client_and_the_context_budget(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer, context_length=4096) as stack:
        async with aiohttp.ClientSession() as http:
            payload = body(
                stream=False, temperature=0.3, top_p=0.9, top_k=20, stop_sequences=["STOP"], max_tokens=32000
            )
            async with http.post(stack.url + "/v1/messages", json=payload) as r:
                assert r.status == 200
        sent = stack.double.requests[0]
        params = sent["sampling_params"]
        assert params["max_new_tokens"] == 4096 - len(sent["input_ids"])
        assert (params["temperature"], params["top_p"], params["top_k"], params["stop"]) == (0.3, 0.9, 20, ["STOP"])
        assert params["skip_special_tokens"] is False and params["no_stop_trim"] is True
        assert sent["return_logprob"] is True and "max_tokens" not in params


@pytest.mark.parametrize(
    "route,raw",
    [
        (
            "/v1/messages",
            b'{"model": "m", "max_tokens": 64, "temperature": NaN, "messages": [{"role": "user", "content": "x"}]}',
        ),
        ("/v1/messages", b'{"model": "m", "max_tokens": Infinity, "messages": [{"role": "user", "content": "x"}]}'),
        ("/v1/chat/completions", b'{"model": "m", "top_p": -Infinity, "messages": [{"role": "user", "content": "x"}]}'),
        ("/v1/responses", b'{"model": "m", "max_output_tokens": NaN, "input": "x"}'),
    ],
)
async def test_non_finite_sampling_numbers_are_a_clear_400_and_reach_no_engine(
    qwen_tokenizer: Any, route: str, raw: bytes
) -> None:
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        async with http.post(stack.url + route, data=raw, headers={"Content-Type": "application/json"}) as r:
            assert r.status == 400
            assert "must be a finite number" in json.dumps(await r.json())
        assert stack.double.requests == []


@pytest.mark.parametrize("failure", [("drop", None), ("status", 500)])
async def test_an_engine_error_leaves_no_cycle_holding_the_request(
    qwen_tokenizer: Any, failure: tuple[str, Any]
) -> None:
    """An engine that drops a call or answers 5xx (restarts, all day long beside a training run) must not leave the
    failed request's frames (the session's state, the prompt's ids) in a reference cycle: the servers run the
    cycle collector's full pass at most once a minute, and the soak bench saw those cycles hold hundreds of MiB.
    The error's traceback held the handler's frame, whose task held the error."""
    import gc

    from tito_rl.trajectory.adapters.engine.generation import EngineError

    async with running_stack(qwen_tokenizer) as stack:
        stack.double.failures.append(failure)
        gc.collect()
        was_enabled = gc.isenabled()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what only the cycle collector would free lands in gc.garbage
        try:
            async with (
                aiohttp.ClientSession() as http,
                http.post(
                    stack.url + "/v1/messages", json=body(stream=False), headers={"x-api-key": "sess-fail"}
                ) as resp,
            ):
                assert resp.status >= 500
                await resp.read()
            await asyncio.sleep(0.05)  # the handler's task ends and lets go of its frames
            gc.collect()
            cycles = [o for o in gc.garbage if isinstance(o, EngineError)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            if was_enabled:
                gc.enable()
        assert cycles == []
