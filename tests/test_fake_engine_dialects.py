"""The fake engine speaks every engine dialect (issue #31, point 4), seen by a real HTTP client on loopback.

Each dialect answers from the same scripted policy as `/generate`: its normalized view
(`trajectory/dialects/registry.view_of`) reads back exactly the ids and logprobs `/generate` gives for the same
prompt, streamed and not. Every response field the field table (`trajectory/dialects/fields.py`) pins for a
dialect is where the table puts it, except the version-gated ones listed in `NOT_SERVED`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.fake_engine_helpers import (
    BASH,
    TOOL_LOOP,
    first_prompt,
    gen_body,
    prompt_ids,
    serve,
    sse_events,
    until_generating,
)
from tito_rl.trajectory.dialects.fields import NOT_STREAMED, fields_of
from tito_rl.trajectory.dialects.registry import detect_dialect, view_of
from tito_rl.trajectory.dialects.view import SGLANG_OPENAI, VLLM_GENERATE, VLLM_OPENAI

CHAT, COMPLETIONS, TOKENS = "/v1/chat/completions", "/v1/completions", "/inference/v1/generate"
SYSTEM = {"role": "system", "content": "You are a coding agent."}
USER = {"role": "user", "content": "list the files"}
MESSAGES = [SYSTEM, USER]
THINK, THINK_END, TOOL_CALL, TOOL_CALL_END, IM_END = 151667, 151668, 151657, 151658, 151645

# Fields of the table the fake engine does not serve by default: other releases than the ones it mimics (vLLM 0.32.0,
# the release the engine contract checks live, unless --vllm-version says otherwise; SGLang 0.5.23).
NOT_SERVED = {
    "choices[].token_ids@sglang-openai" + CHAT,  # SGLang 0.5.17 only; 0.5.18 on: response_token_ids
    "sglext.input_ids",
    "sglext.output_ids",  # SGLang's sglext: only when asked (return_*_in_sglext)
    "choices[].message.reasoning_content@vllm-openai" + CHAT,  # vLLM up to 0.15.1 (--vllm-version 0.15.1)
    "choices[].delta.reasoning_content@vllm-openai" + CHAT,
    "choices[].logprobs.content[].token@vllm-generate" + TOKENS,  # vLLM 0.11.1 to 0.31 (--vllm-version 0.31.0)
    "choices[].text@vllm-generate" + TOKENS,  # vLLM 0.32 output_mode text: only when asked
    # Per-token channels: only when asked of (or started with) them, and with slime's top-p patch.
    "meta_info.routed_experts",
    "meta_info.top_p_token_ids",
    "meta_info.top_p_token_offsets",
    "choices[].routed_experts",
}


def _values(body: Any, path: str) -> list[Any]:
    """Every value at `path` (`a[].b`: each item of a), or [] where the path is absent."""
    found = [body]
    for part in path.split("."):
        many = part.endswith("[]")
        key = part[:-2] if many else part
        nxt = []
        for item in found:
            if isinstance(item, dict) and key in item:
                value = item[key]
                if many:
                    nxt.extend(value if isinstance(value, list) else [])
                else:
                    nxt.append(value)
        found = nxt
    return found


def _has(body: Any, path: str) -> bool:
    return bool(_values(body, path))


async def _post(s: Any, url: str, path: str, body: dict[str, Any], **kw: Any) -> Any:
    r = await s.post(url + path, json=body, **kw)
    assert r.status == 200, await r.text()
    if body.get("stream"):
        events = await sse_events(r)
        assert events[-1] == "[DONE]"
        return events[:-1]
    return await r.json()


async def _reference(s: Any, url: str, ids: list[int]) -> tuple[list[int], list[float]]:
    """What /generate answers for the prompt: the policy's ids and logprobs."""
    body = await (await s.post(url + "/generate", json=gen_body(ids))).json()
    return body["output_ids"], [t[0] for t in body["meta_info"]["output_token_logprobs"]]


def _pinned(dialect: str, endpoint: str, body: Any, chunks: list[Any]) -> None:
    """Each response row of the table is where it says: in the body (every row but a delta's), and, for a stream,
    in some chunk (every row the table says is streamed)."""
    rows = [
        f
        for f in fields_of(dialect, endpoint, "response")
        if f.name not in NOT_SERVED and f"{f.name}@{dialect}{endpoint}" not in NOT_SERVED
    ]
    assert rows
    for f in rows:
        if body is not None and f.place != "delta":
            assert _has(body, f.name), f"{dialect} {endpoint}: {f.name}"
        if chunks and f.streamed != NOT_STREAMED and "400" not in f.streamed:
            assert any(_has(c, f.name) for c in chunks), f"{dialect} {endpoint} stream: {f.name}"


# ---- vllm-openai: messages in ------------------------------------------------------------------------


async def test_vllm_chat_renders_parses_and_reads_back():
    async with serve() as (url, s, _):
        req = {
            "model": "Qwen/Qwen3-8B",
            "messages": MESSAGES,
            "tools": [BASH],
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
        }
        body = await _post(s, url, CHAT, req)
        ids, lps = await _reference(s, url, first_prompt())
    assert detect_dialect(CHAT, req) == VLLM_OPENAI
    choice, message = body["choices"][0], body["choices"][0]["message"]
    assert body["prompt_token_ids"] == first_prompt()  # the engine rendered the template as the gateway would
    assert "prompt_token_ids" not in choice
    assert choice["token_ids"] == ids and ids[-1] == IM_END  # the stop token included
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == lps
    assert set(choice["logprobs"]["content"][0]) == {"token", "logprob", "bytes", "top_logprobs"}
    assert choice["finish_reason"] == "tool_calls" and choice["stop_reason"] is None
    # vLLM's qwen3 reasoning parser and hermes tool parser: nothing stripped, arguments as json.dumps writes them.
    assert message["reasoning"] == "\nThe user wants a listing.\n"
    assert "reasoning_content" not in message  # gone in vLLM 0.16.0; the fake engine mimics 0.32.0
    assert message["content"] == "\n\nLet me list the files.\n"
    [call] = message["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-") and call["type"] == "function"
    assert call["function"] == {"name": "Bash", "arguments": json.dumps({"command": "ls"})}
    assert list(body) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "service_tier",
        "system_fingerprint",
        "usage",
        "prompt_logprobs",
        "prompt_token_ids",
        "kv_transfer_params",
    ]
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    view = view_of(None, CHAT, req, body)
    assert (view.dialect, view.prompt_ids, view.output_ids, view.logprobs) == (VLLM_OPENAI, first_prompt(), ids, lps)
    assert view.messages_in and view.finish_reason == "tool_calls"
    _pinned(VLLM_OPENAI, CHAT, body, [])


async def test_vllm_chat_stream_is_shaped_like_vllms():
    async with serve() as (url, s, _):
        req = {
            "messages": MESSAGES,
            "tools": [BASH],
            "logprobs": True,
            "return_token_ids": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        chunks = await _post(s, url, CHAT, req)
        plain = await _post(s, url, CHAT, {**req, "stream": False, "stream_options": None})
        ids, lps = await _reference(s, url, first_prompt())
    first, usage, tokens = chunks[0], chunks[-1], chunks[1:-1]
    assert first["prompt_token_ids"] == first_prompt()  # on the first chunk only, at the root
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [c["choices"][0]["token_ids"] for c in tokens] == [[i] for i in ids]  # one delta per token
    by_id = {c["choices"][0]["token_ids"][0]: c["choices"][0]["delta"] for c in tokens}
    for control in (THINK, THINK_END, TOOL_CALL, TOOL_CALL_END, IM_END):
        assert by_id[control] == {}  # control tokens: chunks with an empty delta
    fragments = [f for c in tokens for f in c["choices"][0]["delta"].get("tool_calls", [])]
    assert (
        fragments[0]["index"] == 0
        and fragments[0]["type"] == "function"
        and fragments[0]["function"] == {"name": "Bash"}
        and fragments[0]["id"] == plain["choices"][0]["message"]["tool_calls"][0]["id"]
    )
    assert all(f["index"] == 0 and set(f) == {"index", "function"} for f in fragments[1:])
    assert "".join(f["function"].get("arguments", "") for f in fragments) == json.dumps({"command": "ls"})
    assert tokens[-1]["choices"][0]["finish_reason"] == "tool_calls" and "stop_reason" in tokens[-1]["choices"][0]
    assert all(c["choices"][0]["finish_reason"] is None for c in tokens[:-1])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == len(ids)
    view = view_of(None, CHAT, req, chunks)
    assert (view.prompt_ids, view.output_ids, view.logprobs) == (first_prompt(), ids, lps)
    assert view.reasoning == plain["choices"][0]["message"]["reasoning"]
    assert view.tool_calls == plain["choices"][0]["message"]["tool_calls"]
    _pinned(VLLM_OPENAI, CHAT, plain, chunks)


async def test_vllm_chat_stream_without_ids_skips_held_back_tokens():
    async with serve() as (url, s, _):
        chunks = await _post(s, url, CHAT, {"messages": MESSAGES, "tools": [BASH], "stream": True})
    deltas = [c["choices"][0]["delta"] for c in chunks[1:]]
    assert all(d for d in deltas[:-1])  # no empty chunk but the last, which carries the finish reason
    assert all(c["choices"][0]["token_ids"] is None for c in chunks[1:]) and chunks[0]["prompt_token_ids"] is None


async def test_rendering_matches_transformers_and_honours_template_kwargs():
    from tito_rl.trajectory.tokens.tokenizer import load_transformers_tokenizer

    hf = load_transformers_tokenizer()
    history = [
        SYSTEM,
        USER,
        {
            "role": "assistant",
            "content": "Let me list the files.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "a.txt\nb.txt"}]},
    ]
    async with serve() as (url, s, _):
        for messages, kwargs in ((MESSAGES, {}), (MESSAGES, {"enable_thinking": False}), (history, {})):
            req = {"messages": messages, "tools": [BASH], "return_token_ids": True, "chat_template_kwargs": kwargs}
            body = await _post(s, url, CHAT, req)
            expected_messages = json.loads(json.dumps(messages))
            for m in expected_messages:  # what vLLM hands the template: parsed arguments, joined text parts
                for c in m.get("tool_calls", []):
                    c["function"]["arguments"] = json.loads(c["function"]["arguments"])
                if isinstance(m.get("content"), list):
                    m["content"] = "\n".join(p["text"] for p in m["content"])
            text = hf.apply_chat_template(
                expected_messages, tools=[BASH], add_generation_prompt=True, tokenize=False, **kwargs
            )
            assert body["prompt_token_ids"] == hf.encode(text, add_special_tokens=False)
        # The scripted policy sees the rendered ids: the history's turn is turn 2 of the scenario.
        assert body["choices"][0]["message"]["content"] == "There are two files."
        assert body["choices"][0]["finish_reason"] == "stop" and "tool_calls" not in body["choices"][0]["message"]


async def test_tokens_as_token_ids_and_top_logprobs():
    async with serve() as (url, s, _):
        body = await _post(
            s,
            url,
            CHAT,
            {
                "messages": MESSAGES,
                "tools": [BASH],
                "logprobs": True,
                "top_logprobs": 1,
                "return_tokens_as_token_ids": True,
                "return_token_ids": True,
            },
        )
    content = body["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == [f"token_id:{i}" for i in body["choices"][0]["token_ids"]]
    assert all(len(e["top_logprobs"]) == 1 and e["top_logprobs"][0]["logprob"] == e["logprob"] for e in content)


async def test_tool_choice_none_leaves_tool_calls_in_the_content():
    async with serve() as (url, s, _):
        body = await _post(s, url, CHAT, {"messages": MESSAGES, "tools": [BASH], "tool_choice": "none"})
    message = body["choices"][0]["message"]
    assert "tool_calls" not in message and "<tool_call>" in message["content"]
    assert body["choices"][0]["finish_reason"] == "stop"


# ---- vllm-openai: /v1/completions with a token-id prompt -----------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_vllm_completions(stream: bool):
    prompt = first_prompt()
    req = {"model": "m", "prompt": prompt, "logprobs": 0, "return_token_ids": True, "stream": stream}
    async with serve() as (url, s, _):
        answer = await _post(s, url, COMPLETIONS, req)
        ids, lps = await _reference(s, url, prompt)
        # A literal extra_body key (what rllm's gateway adds beside the root flag) is ignored, as vLLM 0.32 does.
        nested = await _post(
            s,
            url,
            COMPLETIONS,
            {**req, "return_token_ids": None, "extra_body": {"return_token_ids": True}, "stream": False},
        )
    assert nested["choices"][0]["token_ids"] is None and nested["choices"][0]["prompt_token_ids"] is None
    view = view_of(None, COMPLETIONS, req, answer)
    assert (view.dialect, view.prompt_ids, view.output_ids, view.logprobs) == (VLLM_OPENAI, prompt, ids, lps)
    assert view.finish_reason == "stop"
    if stream:
        choices = [c["choices"][0] for c in answer]
        assert choices[0]["prompt_token_ids"] == prompt and all(c["prompt_token_ids"] is None for c in choices[1:])
        assert [c["token_ids"] for c in choices] == [[i] for i in ids]
        assert all(c["object"] == "text_completion" for c in answer)
        _pinned(VLLM_OPENAI, COMPLETIONS, None, answer)
    else:
        choice = answer["choices"][0]
        assert choice["prompt_token_ids"] == prompt and "prompt_token_ids" not in answer  # on the choice
        assert choice["logprobs"]["token_logprobs"] == lps and len(choice["logprobs"]["tokens"]) == len(ids)
        assert "<tool_call>" in choice["text"] and "<|im_end|>" not in choice["text"]
        _pinned(VLLM_OPENAI, COMPLETIONS, answer, [])


# ---- vllm-generate -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_vllm_generate(stream: bool):
    prompt = first_prompt()
    req = {
        "token_ids": prompt,
        "sampling_params": {"max_tokens": 512, "temperature": 1.0, "logprobs": 0},
        "stream": stream,
        "return_token_ids": True,
    }
    async with serve() as (url, s, _):
        answer = await _post(s, url, TOKENS, req)
        ids, lps = await _reference(s, url, prompt)
    view = view_of(None, TOKENS, req, answer)
    assert (view.dialect, view.prompt_ids, view.output_ids, view.logprobs) == (VLLM_GENERATE, prompt, ids, lps)
    assert view.finish_reason == "stop" and view.sampling["max_tokens"] == 512
    body = answer if not stream else answer[-1]
    last = body["choices"][0]["logprobs"]["content"][-1]  # vLLM 0.32: ids, not "token_id:N" strings
    assert (last["token_id"], last["rank"], last["top_logprobs"][0]["token_id"]) == (ids[-1], 1, ids[-1])
    assert body["choices"][0]["weight_versions"] == [{"version": "default", "start": 0, "end": len(ids)}]
    _pinned(VLLM_GENERATE, TOKENS, None if stream else answer, answer if stream else [])


# ---- sglang-openai -----------------------------------------------------------------------------------


async def test_sglang_chat_with_input_ids_and_meta_info():
    prompt = first_prompt()
    req = {
        "model": "m",
        "messages": MESSAGES,
        "tools": [BASH],
        "input_ids": prompt,
        "logprobs": True,
        "return_meta_info": True,
        "return_prompt_token_ids": True,
        "return_token_ids": True,
        "no_stop_trim": True,
    }
    async with serve() as (url, s, _):
        body = await _post(s, url, CHAT, req)
        ids, lps = await _reference(s, url, prompt)
    assert detect_dialect(CHAT, req) == SGLANG_OPENAI
    choice = body["choices"][0]
    assert choice["prompt_token_ids"] == prompt and choice["response_token_ids"] == ids
    triples = choice["meta_info"]["output_token_logprobs"]
    assert [t[:2] for t in triples] == [[lp, i] for lp, i in zip(lps, ids, strict=True)]
    assert all(isinstance(t[2], str) for t in triples)  # serving_chat asks for the token text
    assert choice["meta_info"]["finish_reason"] == {"type": "tool_calls", "matched": None}
    assert choice["finish_reason"] == "tool_calls" and choice["matched_stop"] is None
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == lps
    message = choice["message"]
    assert message["reasoning_content"].strip() == "The user wants a listing."  # as sglang's qwen3 parser returns it
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "Bash" and json.loads(call["function"]["arguments"]) == {"command": "ls"}
    assert call["id"].startswith("call_") and call["index"] == 0
    assert body["metadata"]["weight_version"] == "default" and "reasoning_tokens" in body["usage"]
    view = view_of(None, CHAT, req, body)
    assert (view.dialect, view.prompt_ids, view.output_ids, view.logprobs) == (SGLANG_OPENAI, prompt, ids, lps)
    _pinned(SGLANG_OPENAI, CHAT, body, [])


async def test_sglang_chat_stream_carries_no_ids():
    prompt = first_prompt()
    req = {"messages": MESSAGES, "tools": [BASH], "input_ids": prompt, "logprobs": True, "stream": True}
    async with serve() as (url, s, _):
        chunks = await _post(s, url, CHAT, req)
        ids, lps = await _reference(s, url, prompt)
        refused = await s.post(url + CHAT, json={**req, "return_token_ids": True})
        assert refused.status == 400
        assert (await refused.json())["object"] == "error"
    assert all("token_ids" not in c["choices"][0] and "meta_info" not in c["choices"][0] for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    view = view_of(None, CHAT, req, chunks)
    assert view.dialect == SGLANG_OPENAI and view.prompt_ids == prompt and view.output_ids is None
    assert view.logprobs == lps
    assert view.finish_reason == "tool_calls" and view.tool_calls[0]["function"]["name"] == "Bash"
    _pinned(SGLANG_OPENAI, CHAT, None, chunks)


async def test_a_forced_dialect_wins():
    async with serve(openai_dialect=SGLANG_OPENAI) as (url, s, _):
        body = await _post(s, url, CHAT, {"messages": MESSAGES, "tools": [BASH], "input_ids": first_prompt()})
        models = await (await s.get(url + "/v1/models")).json()
    assert "matched_stop" in body["choices"][0] and models["data"][0]["owned_by"] == "sglang"
    async with serve(openai_dialect=VLLM_OPENAI) as (url, s, _):
        models = await (await s.get(url + "/v1/models")).json()
        health = await s.get(url + "/health")
    assert models["data"][0]["owned_by"] == "vllm" and models["data"][0]["max_model_len"] == 40960
    assert health.status == 200


# ---- faults, through the OpenAI dialects ------------------------------------------------------------


def _faulty(**faults: Any) -> dict[str, Any]:
    return {"turns": [{**TOOL_LOOP["turns"][0], "faults": faults}]}


async def test_overload_in_vllms_envelope():
    async with serve(_faulty(status=503, message="Overloaded")) as (url, s, _):
        r = await s.post(url + CHAT, json={"messages": MESSAGES, "tools": [BASH]})
        assert r.status == 503
        assert await r.json() == {
            "error": {"message": "Overloaded", "type": "ServiceUnavailableError", "param": None, "code": 503}
        }


async def test_abort_mid_generation_by_request_id():
    async with serve(_faulty(token_delay_ms=20)) as (url, s, app):
        req = {
            "messages": MESSAGES,
            "tools": [BASH],
            "return_token_ids": True,
            "stream": True,
            "request_id": "gateway-1",
        }
        task = asyncio.ensure_future(_post(s, url, CHAT, req))
        await until_generating(app, "gateway-1", tokens=1)  # a first token decoded: the abort lands mid-generation
        async with s.post(url + "/abort_request", json={"rid": "gateway-1"}) as aborted:
            assert aborted.status == 200
        chunks = await task
    assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
    view = view_of(None, CHAT, req, chunks)
    assert view.finish_reason == "abort" and view.output_ids is not None and 0 < len(view.output_ids) < 30


async def test_length_cut_through_completions():
    async with serve(_faulty(finish_length=5)) as (url, s, _):
        body = await _post(s, url, COMPLETIONS, {"prompt": first_prompt(), "return_token_ids": True, "logprobs": 0})
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 5
    async with serve() as (url, s, _):
        body = await _post(s, url, CHAT, {"messages": MESSAGES, "tools": [BASH], "max_tokens": 4})
    assert body["choices"][0]["finish_reason"] == "length"  # a cut stays length, calls or not


async def test_drift_splits_reach_the_openai_wire():
    async with serve(_faulty(drift=True, drift_splits=3)) as (url, s, _):
        req = {"messages": MESSAGES, "tools": [BASH], "return_token_ids": True, "logprobs": True}
        body = await _post(s, url, CHAT, req)
        ids, lps = await _reference(s, url, first_prompt())  # drifted the same way
    async with serve() as (url, s, _):
        canonical, _ = await _reference(s, url, first_prompt())
    view = view_of(None, CHAT, req, body)
    assert view.output_ids == ids and view.logprobs == lps and len(ids) == len(canonical) + 3
    # Same text, so the parsers read the same call.
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == json.dumps({"command": "ls"})


async def test_prompt_ids_helper_is_the_rendered_prompt():
    assert prompt_ids(MESSAGES, [BASH]) == first_prompt()


async def test_a_forwarded_bearer_key_picks_the_scenario_session_where_no_routing_key_comes():
    """rllm's gateway forwards the agent's headers and sends no routing key: the scripted client's key (its
    session id) still selects the scenario session that `match: {routing_key: ...}` names."""
    scenario = {
        "name": "two",
        "sessions": [
            {"match": {"routing_key": "alpha"}, "turns": [{"text": "I am alpha."}]},
            {"match": {"routing_key": "beta"}, "turns": [{"text": "I am beta."}]},
        ],
    }
    request = {"model": "Qwen/Qwen3-8B", "messages": MESSAGES}
    async with serve(scenario) as (url, s, _):
        beta = await _post(s, url, CHAT, request, headers={"Authorization": "Bearer beta"})
        alpha = await _post(s, url, CHAT, request, headers={"Authorization": "Bearer alpha"})
        routed = await _post(
            s, url, CHAT, request, headers={"Authorization": "Bearer alpha", "X-SMG-Routing-Key": "beta"}
        )
    assert "I am beta." in beta["choices"][0]["message"]["content"]
    assert "I am alpha." in alpha["choices"][0]["message"]["content"]
    assert "I am beta." in routed["choices"][0]["message"]["content"]  # a routing key still comes first


# ---- older vLLM releases (--vllm-version) ------------------------------------------------------------


async def test_older_vllm_releases_write_their_own_shapes():
    prompt = first_prompt()
    generate = {"token_ids": prompt, "sampling_params": {"max_tokens": 512, "logprobs": 0}, "return_token_ids": True}
    chat = {"messages": MESSAGES, "tools": [BASH], "return_token_ids": True}
    async with serve(vllm_version="0.31.0") as (url, s, _):
        old_generate = await _post(s, url, TOKENS, generate)
    async with serve(vllm_version="0.15.1") as (url, s, _):
        old_chat = await _post(s, url, CHAT, chat)
    entry = old_generate["choices"][0]["logprobs"]["content"][-1]
    assert entry["token"].startswith("token_id:") and "token_id" not in entry and "usage" not in old_generate
    message = old_chat["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == "\nThe user wants a listing.\n"
    assert old_chat["system_fingerprint"] is None and old_chat["usage"]["completion_tokens_details"] is None


async def test_start_flags_close_what_vllm_closes_without_them():
    async with serve(vllm_scale_out=False, vllm_auto_tool_choice=False, vllm_reasoning_parser=False) as (url, s, _):
        generate = await s.post(url + TOKENS, json={"token_ids": first_prompt(), "sampling_params": {}})
        tools = await s.post(url + CHAT, json={"messages": MESSAGES, "tools": [BASH], "tool_choice": "auto"})
        plain = await _post(s, url, CHAT, {"messages": MESSAGES, "tools": [BASH], "tool_choice": "none"})
    assert generate.status == 403 and "--enable-scale-out" in (await generate.json())["error"]["message"]
    assert tools.status == 400 and "--enable-auto-tool-choice" in (await tools.json())["error"]["message"]
    message = plain["choices"][0]["message"]  # no reasoning parser: the think block stays in the content
    assert message["reasoning"] is None and message["content"].startswith("<think>")
