"""The Gemini API wire (Gemini CLI 0.61): captured requests, replies as JSON and SSE, the CLI's echo on one
chain, thoughts, side requests, bad input as 400s in Gemini's envelope, countTokens, sessions, replay."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adapter_double import qwen3_output
from tests.adapter_support import running_stack
from tests.gemini_support import SHELL, GeminiConversation, history_parts, sse_chunks
from tests.process_helpers import capture_dir
from tests.replay_support import recording, tool_loop_scenario
from tito_rl.cassette.reader import read_cassette
from tito_rl.cassette.redaction import REDACTED
from tito_rl.replayer.comparison.differences import samples_difference
from tito_rl.replayer.replay.cassette_replay import replay_cassette
from tito_rl.trajectory.adapters.canonical import fold_system_messages, message, tool_call
from tito_rl.trajectory.adapters.rendering import qwen3_template
from tito_rl.trajectory.adapters.rendering.render import ChatRenderer, IncrementalEncoder
from tito_rl.trajectory.adapters.session import resolve_session, session_digest
from tito_rl.trajectory.adapters.turns import BadRequest
from tito_rl.trajectory.adapters.wires import gemini

CAPTURED = ["gemini_001", "gemini_002"]
STREAM = "/v1beta/models/gemini-2.5-flash:streamGenerateContent"
GENERATE = "/v1beta/models/gemini-2.5-flash:generateContent"
SIMPLE = {
    "contents": [{"role": "user", "parts": [{"text": "list files"}]}],
    "tools": [{"functionDeclarations": [SHELL]}],
}


def assert_one_chain(stats: Any, turns: int) -> None:
    """Every turn on one root-to-leaf chain, trained as one sample: no fork, merge, realign or branch."""
    assert (stats.turns, stats.leaves, stats.samples, stats.forks) == (turns, 1, 1, {})
    assert (stats.merges, stats.realigns, stats.branches) == (0, 0, 0)


def captured() -> list[tuple[bytes, dict[str, Any]]]:
    """The CLI's request bytes and the reply the capture's stub sent, in order."""
    folder = capture_dir("gemini")
    replies = [json.loads(line)["reply"] for line in (folder / "requests.jsonl").read_text().splitlines()]
    return [
        ((folder / "bodies" / f"{name}.json").read_bytes(), reply)
        for name, reply in zip(CAPTURED, replies, strict=True)
    ]


def test_captured_requests_parse_into_canonical_messages() -> None:
    (first, _), (second, _) = captured()
    one = gemini.parse_request(json.loads(first), "gemini-2.5-flash", "streamGenerateContent")
    two = gemini.parse_request(json.loads(second), "gemini-2.5-flash", "streamGenerateContent")
    assert [m["role"] for m in one.messages] == ["system", "user"]
    assert [m["role"] for m in two.messages] == ["system", "user", "assistant", "tool"]
    assert two.messages[:2] == one.messages
    # The context part and the task part of the first content are one user message.
    assert one.messages[1]["content"].startswith("<session_context>")
    assert one.messages[1]["content"].endswith("</session_context>\n\nlist files")
    # The echo's id and thoughtSignature are gone: it equals the reply the stub sent, by value.
    assert two.messages[2] == message(
        "assistant",
        "I'll run a command.",
        None,
        [
            tool_call(
                "run_shell_command",
                {
                    "command": "echo stub-was-here > proof.txt && ls -la",
                    "description": "Create proof file and list directory",
                },
            )
        ],
    )
    assert two.messages[3]["content"].startswith("<untrusted_context>\nOutput: total 12")
    assert len(one.tools) == 16 and one.tools == two.tools
    shell = next(t["function"] for t in one.tools if t["function"]["name"] == "run_shell_command")
    assert shell["parameters"]["required"] == ["command"]
    assert one.sampling == {"temperature": 1.0, "top_p": 0.95, "top_k": 64}
    assert one.stream and one.model == "gemini-2.5-flash" and not one.structured_output
    assert one.options == {"sse": True, "array": False, "include_thoughts": True}


def test_captured_requests_render_alike_in_python_and_jinja_and_encode_incrementally(qwen_tokenizer: Any) -> None:
    renderer = ChatRenderer(qwen_tokenizer)
    encoder = IncrementalEncoder(renderer)
    reused = 0
    for body, _ in captured():
        turn = gemini.parse_request(json.loads(body))
        msgs = fold_system_messages(turn.messages)
        text = qwen3_template.render(msgs, turn.tools, keep_reasoning=True)
        assert text is not None and text == renderer.render_jinja(msgs, turn.tools)
        result = encoder.encode(renderer.render(msgs, turn.tools))
        assert result.ids == qwen_tokenizer.encode(text, add_special_tokens=False)
        reused += result.reused
    assert reused > 10_000  # the follow-up turn extended the first one's render


async def test_captured_session_replies_in_sse_and_the_clis_echo_stays_on_one_chain(qwen_tokenizer: Any) -> None:
    (first, reply_one), (second, reply_two) = captured()
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        outputs = [
            qwen3_output(
                "".join(p.get("text", "") for p in reply["parts"]),
                calls=[
                    (p["functionCall"]["name"], p["functionCall"]["args"])
                    for p in reply["parts"]
                    if "functionCall" in p
                ],
            )
            for reply in (reply_one, reply_two)
        ]
        stack.double.script += outputs
        seen = []
        for body, reply in ((first, reply_one), (second, reply_two)):
            headers = {"x-goog-api-key": "gem-key-000001", "Content-Type": "application/json"}
            async with http.post(stack.url + STREAM + "?alt=sse", data=body, headers=headers) as resp:
                assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
                chunks = sse_chunks(await resp.text())
            assert history_parts(chunks) == reply["parts"]  # what the stub sent, as the CLI reads it
            assert all(c["modelVersion"] == "gemini-2.5-flash" for c in chunks)
            assert len({c["responseId"] for c in chunks}) == 1
            assert [c["candidates"][0].get("finishReason") for c in chunks][-1] == "STOP"
            assert all("finishReason" not in c["candidates"][0] for c in chunks[:-1])
            seen.append(chunks[-1]["usageMetadata"])
        prompts = [r["input_ids"] for r in stack.double.requests]
        assert [u["promptTokenCount"] for u in seen] == [len(p) for p in prompts]
        # The second prompt extends the first prompt and its output, token for token: the echo was restored.
        first_turn = prompts[0] + stack.double.output_ids(outputs[0])
        assert prompts[1][: len(first_turn)] == first_turn
        assert "<tool_response>\n<untrusted_context>" in qwen_tokenizer.decode(prompts[1])
        assert_one_chain(stack.manager.stats("gem-key-000001"), turns=2)


async def test_thought_parts_are_reasoning_whether_the_echo_keeps_them_or_not(qwen_tokenizer: Any) -> None:
    call = qwen3_output("Listing.", "I should list the files.", [("run_shell_command", {"command": "ls"})])
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        for key, keep_thoughts in (("gem-drops-thoughts", False), ("gem-keeps-thoughts", True)):
            stack.double.script += [call, qwen3_output("Two files.", "Done listing.")]
            talk = GeminiConversation(http, stack.url, key)
            talk.contents.append({"role": "user", "parts": [{"text": "list files"}]})
            status, chunks = await talk.post()
            assert status == 200
            assert chunks[0]["candidates"][0]["content"]["parts"] == [
                {"text": "I should list the files.", "thought": True}
            ]
            output = stack.double.output_ids(call)
            usage = chunks[-1]["usageMetadata"]
            assert usage["thoughtsTokenCount"] == output.index(151668) + 1  # up to and including </think>
            assert usage["candidatesTokenCount"] + usage["thoughtsTokenCount"] == len(output)
            assert usage["totalTokenCount"] == usage["promptTokenCount"] + len(output)
            parts = history_parts(chunks)
            if keep_thoughts:  # a client that keeps them, signed, as the API's own clients may
                parts = [{"text": "I should list the files.", "thought": True, "thoughtSignature": "c2ln"}, *parts]
            talk.contents.append({"role": "model", "parts": parts})
            assert talk.tool_results()
            await talk.turn()
            prompt = qwen_tokenizer.decode(stack.double.requests[-1]["input_ids"])
            assert "<think>\nI should list the files.\n</think>" in prompt  # kept in the history's render
            assert_one_chain(stack.manager.stats(key), turns=2)
        parsed = gemini.parse_request(
            {
                "contents": [
                    {
                        "role": "model",
                        "parts": [{"text": "why", "thought": True, "thoughtSignature": "x"}, {"text": "what"}],
                    }
                ]
            }
        )
        assert parsed.messages == [message("assistant", "what", "why")]


async def test_json_replies_max_tokens_and_the_stream_without_alt_sse(qwen_tokenizer: Any) -> None:
    answer = qwen3_output("A fairly long answer that will not fit.", "Thinking first.")
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        stack.double.script += [answer, answer, answer]
        headers = {"x-goog-api-key": "gem-json-0001"}
        async with http.post(stack.url + GENERATE, json=SIMPLE, headers=headers) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "application/json"
            reply = await resp.json()
        (candidate,) = reply["candidates"]
        # No includeThoughts: no thought part (the reasoning is still recorded).
        assert candidate == {
            "content": {"role": "model", "parts": [{"text": "A fairly long answer that will not fit."}]},
            "finishReason": "STOP",
            "index": 0,
        }
        assert set(reply) == {"candidates", "usageMetadata", "modelVersion", "responseId"}
        assert reply["modelVersion"] == "gemini-2.5-flash" and len(reply["responseId"]) == 22
        limited = {**SIMPLE, "generationConfig": {"maxOutputTokens": 3, "stopSequences": ["END"], "topK": 5}}
        async with http.post(stack.url + GENERATE, json=limited, headers=headers) as resp:
            reply = await resp.json()
        assert reply["candidates"][0]["finishReason"] == "MAX_TOKENS"
        params = stack.double.requests[-1]["sampling_params"]
        assert (params["max_new_tokens"], params["stop"], params["top_k"]) == (3, ["END"], 5)
        async with http.post(stack.url + STREAM, json=SIMPLE, headers=headers) as resp:  # no alt=sse
            assert resp.headers["Content-Type"] == "application/json"
            chunks = await resp.json()
        assert isinstance(chunks, list) and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
        assert history_parts(chunks) == [{"text": "A fairly long answer that will not fit."}]
        # One body to two actions is two requests, not a retry of the first.
        assert len(stack.double.requests) == 3


async def test_structured_output_requests_are_side_requests(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        stack.double.script += ['{"next_speaker": "user", "reasoning": "done"}', "main answer"]
        headers = {"x-goog-api-key": "gem-side-0001"}
        check = {
            **SIMPLE,
            "generationConfig": {
                "responseMimeType": "application/json",
                "responseJsonSchema": {"type": "object", "properties": {"next_speaker": {"type": "string"}}},
            },
        }
        async with http.post(stack.url + GENERATE, json=check, headers=headers) as resp:
            reply = await resp.json()
        assert json.loads(reply["candidates"][0]["content"]["parts"][0]["text"])["next_speaker"] == "user"
        async with http.post(stack.url + STREAM + "?alt=sse", json=SIMPLE, headers=headers) as resp:
            assert resp.status == 200
        stats = stack.manager.stats("gem-side-0001")
        assert (stats.turns, stats.side_turns, stats.samples) == (1, 1, 1)
        assert [e.side for s, _, e in stack.tap.agent] == [True, False]
    for schema_key in ("responseSchema", "response_json_schema"):
        config = {"response_mime_type": "application/json", schema_key: {"type": "OBJECT"}}
        assert gemini.parse_request({**SIMPLE, "generation_config": config}).structured_output
    assert not gemini.parse_request(
        {**SIMPLE, "generationConfig": {"responseMimeType": "application/json"}}
    ).structured_output


def _content(*parts: Any, role: str = "user") -> dict[str, Any]:
    return {"contents": [{"role": role, "parts": list(parts)}]}


BAD_BODIES = [
    (b"[]", "JSON object"),
    (b"{nope", "JSON object"),
    (b"{}", "contents must be a non-empty list"),
    (b'{"contents": "hi"}', "contents must be a non-empty list"),
    (b'{"contents": []}', "contents must be a non-empty list"),
    (json.dumps({"contents": ["hi"]}).encode(), "contents[0] must be an object"),
    (json.dumps({"contents": [{"role": "user"}]}).encode(), "contents[0].parts must be a non-empty list"),
    (json.dumps(_content()).encode(), "contents[0].parts must be a non-empty list"),
    (json.dumps(_content("hi")).encode(), "parts[0] must be an object"),
    (json.dumps(_content({"executableCode": {"code": "1"}})).encode(), "no supported data field"),
    (json.dumps(_content({"mystery": 1})).encode(), "no supported data field"),
    (json.dumps(_content({"text": "a", "functionCall": {"name": "f"}})).encode(), "more than one"),
    (json.dumps(_content({"text": 7})).encode(), "text must be a string"),
    (json.dumps(_content({"text": "x"}, role="system")).encode(), "role must be user or model"),
    (json.dumps(_content({"text": "x", "thought": "yes"}, role="model")).encode(), "thought must be a boolean"),
    (json.dumps(_content({"functionCall": {"args": {}}}, role="model")).encode(), "name must be a non-empty"),
    (json.dumps(_content({"functionCall": {"name": "f", "args": [1]}}, role="model")).encode(), "args must be"),
    (json.dumps(_content({"functionCall": {"name": "f"}})).encode(), "belongs in a model content"),
    (json.dumps(_content({"functionResponse": {"name": "f", "response": "ok"}})).encode(), "response must be"),
    (
        json.dumps(_content({"functionResponse": {"name": "f", "response": {}}}, role="model")).encode(),
        "belongs in a user content",
    ),
    (json.dumps(_content({"inlineData": "abc"})).encode(), "inlineData must be an object"),
    (json.dumps({**SIMPLE, "systemInstruction": {"parts": "x"}}).encode(), "systemInstruction.parts"),
    (json.dumps({**SIMPLE, "generationConfig": []}).encode(), "generationConfig must be an object"),
    (json.dumps({**SIMPLE, "generationConfig": {"temperature": "hot"}}).encode(), "temperature must be a number"),
    (json.dumps({**SIMPLE, "generationConfig": {"stopSequences": [1]}}).encode(), "stopSequences must be"),
    (json.dumps({**SIMPLE, "generationConfig": {"candidateCount": 2}}).encode(), "candidateCount must be 1"),
    (json.dumps({**SIMPLE, "tools": {"functionDeclarations": []}}).encode(), "tools must be a list"),
    (json.dumps({**SIMPLE, "tools": [{"functionDeclarations": {}}]}).encode(), "functionDeclarations must be"),
    (
        json.dumps({**SIMPLE, "tools": [{"functionDeclarations": [{"description": "x"}]}]}).encode(),
        "non-empty string name",
    ),
    (json.dumps({**SIMPLE, "cachedContent": "cachedContents/abc"}).encode(), "cachedContent is not supported"),
    (b'{"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"temperature": NaN}}', "finite"),
    (b'{"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": Infinity}}', "finite"),
    (
        b'{"contents": [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"n": NaN}}}]}]}',
        "non-finite",
    ),
    (b'{"contents": [{"parts": [{"functionResponse": {"name": "f", "response": {"v": [-Infinity]}}}]}]}', "non-finite"),
]


@pytest.mark.parametrize("raw,says", BAD_BODIES, ids=[s for _, s in BAD_BODIES])
async def test_bad_input_is_a_400_in_geminis_envelope_and_reaches_no_engine(
    qwen_tokenizer: Any, raw: bytes, says: str
) -> None:
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        for path in (STREAM + "?alt=sse", GENERATE):
            async with http.post(stack.url + path, data=raw, headers={"x-goog-api-key": "gem-bad-0001"}) as resp:
                assert resp.status == 400
                error = (await resp.json())["error"]
            assert set(error) == {"code", "message", "status"}
            assert (error["code"], error["status"]) == (400, "INVALID_ARGUMENT") and says in error["message"]
        assert stack.double.requests == []


FIELDS = st.sampled_from(
    [
        "contents",
        "role",
        "parts",
        "text",
        "thought",
        "functionCall",
        "functionResponse",
        "name",
        "args",
        "response",
        "inlineData",
        "mimeType",
        "systemInstruction",
        "tools",
        "functionDeclarations",
        "parameters",
        "parametersJsonSchema",
        "generationConfig",
        "temperature",
        "topK",
        "maxOutputTokens",
        "stopSequences",
        "thinkingConfig",
        "responseMimeType",
        "responseSchema",
        "x",
    ]
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.sampled_from(["", "user", "model"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(FIELDS, inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.dictionaries(FIELDS, JSONISH, max_size=5))
def test_any_json_object_parses_or_is_a_bad_request(body: dict[str, Any]) -> None:
    """Never another exception (the app would answer 500); what parses is finite JSON the template can render."""
    try:
        turn = gemini.parse_request(body)
    except BadRequest:
        return
    json.dumps(turn.messages, allow_nan=False)
    assert all(isinstance(m["content"], str) for m in turn.messages)


async def test_unknown_actions_and_engine_errors_answer_in_geminis_envelope(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        async with http.post(stack.url + "/v1beta/models/gemini-2.5-flash:embedContent", json=SIMPLE) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["status"] == "NOT_FOUND"
        async with http.post(stack.url + "/v1beta/models/gemini-2.5-flash", json=SIMPLE) as resp:
            assert resp.status == 404
        for failure, status, name in (
            (("status", 500), 502, "UNAVAILABLE"),
            (("status", 400), 400, "INVALID_ARGUMENT"),
        ):
            stack.double.failures.append(failure)
            async with http.post(
                stack.url + STREAM + "?alt=sse", json=SIMPLE, headers={"x-goog-api-key": "gem-err-0001"}
            ) as resp:
                assert resp.status == status
                error = (await resp.json())["error"]
            assert (error["code"], error["status"]) == (status, name)
        assert stack.manager.stats("gem-err-0001").turns == 0


async def test_count_tokens_renders_the_prompt_as_a_turn_would(qwen_tokenizer: Any) -> None:
    (first, _), _ = captured()
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        async with http.post(stack.url + STREAM + "?alt=sse", data=first, headers={"x-goog-api-key": "gem-c"}):
            pass
        prompt_len = len(stack.double.requests[0]["input_ids"])
        body = json.loads(first)
        count = stack.url + "/v1beta/models/gemini-2.5-flash:countTokens"
        for payload in (body, {"generateContentRequest": {"model": "models/gemini-2.5-flash", **body}}):
            async with http.post(count, json=payload) as resp:
                assert resp.status == 200 and await resp.json() == {"totalTokens": prompt_len}
        async with http.post(stack.url + "/s/gem-path/v1beta/models/m:countTokens", json=SIMPLE) as resp:
            assert (await resp.json())["totalTokens"] > 0
        for bad in (b"{}", b"[1]", b"{oops", b'{"generateContentRequest": 3}'):
            async with http.post(count, data=bad) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["status"] == "INVALID_ARGUMENT"
        assert len(stack.double.requests) == 1  # counting generates nothing


def test_the_gemini_api_key_names_the_session_after_bearer_and_x_api_key() -> None:
    body = {"metadata": {"session_id": "b1"}}
    goog = resolve_session({"x-goog-api-key": "g1"}, body, "p1", {"key": "q1"})
    assert (goog.sid, goog.source, goog.name) == ("g1", "x-goog-api-key", session_digest("g1"))
    query = resolve_session({}, body, "p1", {"alt": "sse", "key": "q1"})
    assert (query.sid, query.source, query.name) == ("q1", "query-key", session_digest("q1"))
    assert resolve_session({"x-api-key": "k1", "x-goog-api-key": "g1"}, None, None).source == "x-api-key"
    assert resolve_session({"Authorization": "Bearer t1", "x-goog-api-key": "g1"}, None, None).source == "bearer"
    assert resolve_session({"x-goog-api-key": "bad key"}, body, None, {"key": ""}).source == "body"
    assert resolve_session({}, None, "p1", {"key": "<redacted>"}).source == "path"


async def test_sessions_from_the_header_the_query_and_the_path_prefix(qwen_tokenizer: Any) -> None:
    async with running_stack(qwen_tokenizer) as stack, aiohttp.ClientSession() as http:
        for talk in (
            GeminiConversation(http, stack.url, "gem-header-01"),
            GeminiConversation(http, stack.url, "gem-query-01", key_in_query=True),
        ):
            talk.contents.append({"role": "user", "parts": [{"text": "hi"}]})
            assert (await talk.post())[0] == 200
        async with http.post(stack.url + "/s/gem-prefix-01" + GENERATE, json=SIMPLE) as resp:
            assert resp.status == 200
        assert [(s, src) for s, src, _ in stack.tap.agent] == [
            ("gem-header-01", "x-goog-api-key"),
            ("gem-query-01", "query-key"),
            ("gem-prefix-01", "path"),
        ]
        assert [h["X-SMG-Routing-Key"] for h in stack.double.headers] == [
            "gem-header-01",
            "gem-query-01",
            "gem-prefix-01",
        ]


def test_a_recorded_gemini_session_replays_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / "gemini.tito"
    keys = {"gem-live-header-0001": False, "gem-live-query-0002": True}
    turns: dict[str, int] = {}

    async def drive() -> None:
        async with recording(path, tool_loop_scenario(3)) as live:

            async def one(key: str, in_query: bool) -> None:
                talk = GeminiConversation(live.http, live.url, key, key_in_query=in_query, stream=not in_query)
                turns[key] = await talk.tool_loop()
                await live.finish(key, 1.0)

            await asyncio.gather(*(one(k, q) for k, q in keys.items()))

    asyncio.run(drive())
    assert turns == {key: 3 for key in keys}
    raw = path.read_bytes()
    assert not any(key.encode() in raw for key in keys)  # the credentials never reach the cassette
    cassette = read_cassette(path)
    assert sorted(cassette.sessions) == sorted(session_digest(k) for k in keys)
    queried = cassette.sessions[session_digest("gem-live-query-0002")]
    assert all("key=" in a.query and REDACTED in a.query.replace("%3C", "<").replace("%3E", ">") for a in queried.agent)
    result = replay_cassette(path)
    for session in result.sessions:
        assert session.ok and not session.differences, session.differences
        assert session.exchanges == 3 and session.counts()["turns"] == 3
        (finish,) = session.finishes
        assert len(finish.samples) == 1 and finish.live is not None
        assert samples_difference(finish.live, finish.samples, str) is None  # as replay compares them (arrays)
