"""OpenAI-style engine calls in a cassette: stored small (deltas on the session's context and on its last chat
history), read back exactly, and attributed to their session by the taps' rule without a routing key."""

from __future__ import annotations

import copy
import io
import random
from typing import Any

import pytest

from tito_rl.cassette.format.records import FORMAT_VERSION, EngineRecord, Header
from tito_rl.cassette.reader import CassetteReader
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.recorder.taps.agent_tap import gateway_session
from tito_rl.recorder.taps.attribution import Attribution
from tito_rl.recorder.taps.engine_tap import streamed_response
from tito_rl.trajectory.adapters.tap import EngineExchange
from tito_rl.trajectory.dialects.registry import record_view

SESSION = "sess-1"
WORDS = [f"w{i:03d}" for i in range(500)]


def tool_result(i: int) -> str:
    """~9 kB of text zlib cannot shrink much (a repeated string would hide a whole-history store)."""
    return " ".join(random.Random(i).choices(WORDS, k=1800))


def chat_call(turn: int, stream: bool) -> EngineExchange:
    """A vLLM messages-in chat call of turn `turn`: the whole history in, prompt ids returned at the root."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Fix the bug. ünïcödé ✓"}]
    for i in range(turn):
        messages += [{"role": "assistant", "content": f"calling tool {i}"}, {"role": "user", "content": tool_result(i)}]
    prompt = list(range(1000, 1000 + 50 + 2000 * turn))
    output = [7, 8, 9, 151645]
    request = {
        "model": "m",
        "messages": messages,
        "logprobs": True,
        "return_token_ids": True,
        "stream": stream,
        "max_tokens": 100,
    }
    entries = [
        {"token": f"token_id:{t}", "logprob": -0.25 * (i + 1), "bytes": [65], "top_logprobs": []}
        for i, t in enumerate(output)
    ]
    if stream:
        response: Any = [
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "prompt_token_ids": prompt,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}],
            }
        ]
        response += [
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [
                    {
                        "index": 0,
                        "delta": {"content": "x"} if t != 151645 else {},
                        "token_ids": [t],
                        "logprobs": {"content": [e]},
                        "finish_reason": "stop" if t == 151645 else None,
                    }
                ],
            }
            for t, e in zip(output, entries, strict=True)
        ]
    else:
        response = {
            "id": "c",
            "object": "chat.completion",
            "prompt_token_ids": prompt,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "xxx"},
                    "logprobs": {"content": entries},
                    "finish_reason": "stop",
                    "token_ids": output,
                }
            ],
        }
    return EngineExchange("POST", "/v1/chat/completions", request, 200, response, dialect="vllm-openai")


def written(calls: list[EngineExchange]) -> bytes:
    buffer = io.BytesIO()
    writer = CassetteWriter(buffer, Header(tokenizer_fingerprint="t", created="2026-01-01T00:00:00Z"))
    for call in calls:
        writer.engine_exchange(SESSION, "path", call)
    return buffer.getvalue()


def read_back(data: bytes) -> tuple[Header, list[EngineRecord]]:
    with CassetteReader(io.BytesIO(data)) as reader:
        return reader.header, [r for r in reader.records() if isinstance(r, EngineRecord)]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_calls_read_back_exactly_with_their_dialect(stream: bool) -> None:
    calls = [chat_call(turn, stream) for turn in range(4)]
    originals = copy.deepcopy(calls)
    header, records = read_back(written(calls))
    assert header.format_version == FORMAT_VERSION == 7
    assert [c.request for c in calls] == [c.request for c in originals]  # writing leaves the caller's data alone
    assert [(r.request, r.response, r.dialect) for r in records] == [
        (c.request, c.response, "vllm-openai") for c in originals
    ]
    views = [record_view(r) for r in records]
    assert [v.prompt_ids for v in views] == [
        c.response[0]["prompt_token_ids"] if stream else c.response["prompt_token_ids"] for c in originals
    ]
    assert all(v.output_ids == [7, 8, 9, 151645] and v.messages_in for v in views)


def test_a_growing_chat_history_costs_what_it_adds_not_its_whole_length() -> None:
    """Each call re-sends the whole history: stored whole, 20 turns would cost ~20x the last one's history."""
    sizes = [len(written([chat_call(t, False) for t in range(n)])) for n in (10, 20)]
    history = len(str(chat_call(19, False).request["messages"]))
    assert sizes[1] - sizes[0] < history / 2, (sizes, history)


def test_token_id_prompts_of_every_dialect_are_deltas_on_the_context() -> None:
    prompts = [list(range(5000 + 500 * t)) for t in range(6)]
    calls = [
        EngineExchange(
            "POST",
            "/inference/v1/generate",
            {"token_ids": p, "sampling_params": {"max_tokens": 4}},
            200,
            {"choices": [{"index": 0, "token_ids": [1, 2], "finish_reason": "stop"}]},
            dialect="vllm-generate",
        )
        for p in prompts
    ]
    data = written(calls)
    assert len(data) < 4 * len(prompts[-1]) * 1.2  # about the last prompt once, not the sum of all six
    _, records = read_back(data)
    assert [r.request["token_ids"] for r in records] == prompts


def test_a_generate_call_without_a_dialect_is_stored_as_before() -> None:
    call = EngineExchange("POST", "/generate", {"input_ids": [1, 2]}, 200, {"output_ids": [3]})
    _, records = read_back(written([call]))
    assert records[0].dialect is None and record_view(records[0]).dialect == "sglang"


def test_an_openai_stream_is_kept_chunk_by_chunk_and_a_generate_stream_by_its_last() -> None:
    text = 'data: {"choices":[{"token_ids":[1]}]}\n\ndata: {"choices":[{"token_ids":[2]}]}\n\ndata: [DONE]\n\n'
    assert streamed_response("vllm-openai", text) == [
        {"choices": [{"token_ids": [1]}]},
        {"choices": [{"token_ids": [2]}]},
    ]
    assert streamed_response("sglang", text) == {"choices": [{"token_ids": [2]}]}


def test_a_gateway_session_in_the_url_names_the_session() -> None:
    assert gateway_session("/sessions/abc-1/v1/chat/completions").sid == "abc-1"
    assert gateway_session("/sessions/abc-1/v1/chat/completions").source == "path"
    assert gateway_session("/v1/chat/completions") is None and gateway_session("/sessions/") is None


def test_without_a_routing_key_a_messages_in_call_goes_to_the_request_it_forwards() -> None:
    """Two sessions in flight, one shared API key: the call carrying session b's messages is b's."""
    a = Attribution(None)
    fa = a.begin("a", "path", "Bearer shared", b'{"messages":[{"role":"user","content":"one"}]}')
    fb = a.begin("b", "path", "Bearer shared", b'{"messages":[{"role":"user","content":"two"}]}')
    headers = {"Authorization": "Bearer shared"}
    owner = a.owner("/v1/chat/completions", headers, {"messages": [{"role": "user", "content": "two"}]})
    assert owner is not None and owner.flight is fb
    owner = a.owner("/v1/chat/completions", headers, {"messages": [{"role": "user", "content": "one"}]})
    assert owner is not None and owner.flight is fa


def test_a_forwarded_authorization_ties_a_call_to_its_agent() -> None:
    a = Attribution(None)
    a.begin("a", "bearer", "Bearer key-a", b"{}")
    fb = a.begin("b", "bearer", "Bearer key-b", b"{}")
    owner = a.owner("/inference/v1/generate", {"authorization": "Bearer key-b"}, {"token_ids": [1, 2]})
    assert owner is not None and owner.flight is fb
    assert a.owner("/v1/models", {"authorization": "Bearer key-b"}, None) is None  # no generation: not recorded


def test_sglang_meta_info_names_the_output_ids_when_the_gateway_asked_for_no_token_ids() -> None:
    """miles' session server asks for `return_meta_info` only: the triples still say what was emitted."""
    from tito_rl.trajectory.dialects.registry import view_of

    request = {"messages": [{"role": "user", "content": "hi"}], "input_ids": [1, 2, 3], "return_meta_info": True}
    response = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x"},
                "finish_reason": "stop",
                "meta_info": {"output_token_logprobs": [[-0.1, 5, "a"], [-0.2, 6, "b"]]},
            }
        ]
    }
    view = view_of(None, "/v1/chat/completions", request, response)
    assert (view.dialect, view.output_ids, view.logprobs) == ("sglang-openai", [5, 6], [-0.1, -0.2])


def test_the_export_shows_each_generation_through_its_view(tmp_path: Any) -> None:
    """The normalized view is read from the raw call, never stored beside it; the export shows it for jq."""
    import json

    from tito_rl.replayer.cassette_tools.export import export

    path = tmp_path / "chat.tito"
    path.write_bytes(written([chat_call(0, True), chat_call(1, False)]))
    out = io.StringIO()
    export(path, out)
    engine = [r for r in json.loads(out.getvalue())["records"] if r["type"] == "engine"]
    assert [r["view"]["dialect"] for r in engine] == ["vllm-openai", "vllm-openai"]
    assert [r["view"]["prompt_ids"] for r in engine] == [list(range(1000, 1050)), list(range(1000, 3050))]
    assert all(r["view"]["output_ids"] == [7, 8, 9, 151645] and r["view"]["messages_in"] for r in engine)
    assert engine[0]["view"]["stream"] and engine[0]["view"]["logprobs"] == [-0.25, -0.5, -0.75, -1.0]
