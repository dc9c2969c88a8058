"""Every endpoint of the fake engine over real loopback HTTP."""

from __future__ import annotations

import asyncio

from tests.fake_engine_helpers import first_prompt, gen_body, serve, sse_events, until_generating, until_queued


async def test_info_endpoints_and_health():
    async with serve(model_name="tito/Qwen3-test", context_length=8192) as (url, s, _):
        for path in ("/health", "/health_generate"):
            async with s.get(url + path) as r:
                assert r.status == 200 and await r.read() == b""
        for path in ("/model_info", "/get_model_info"):
            async with s.get(url + path) as r:
                info = await r.json()
                assert info["served_model_name"] == "tito/Qwen3-test" and info["is_generation"] is True
        for path in ("/server_info", "/get_server_info"):
            async with s.get(url + path) as r:
                info = await r.json()
                assert info["context_length"] == 8192 and info["incremental_streaming_output"] is False
        async with s.get(url + "/v1/models") as r:
            models = await r.json()
            assert models["object"] == "list"
            assert models["data"][0]["id"] == "tito/Qwen3-test" and models["data"][0]["max_model_len"] == 8192
        async with s.post(url + "/flush_cache") as r:
            assert r.content_type == "text/plain" and (await r.text()).startswith("Cache flushed.")
        async with s.get(url + "/workers") as r:
            assert r.status == 404  # only the router serves it


async def test_old_profile_lacks_new_info_routes():
    async with serve(version_profile="0.5.2") as (url, s, _):
        async with s.get(url + "/model_info") as r:
            assert r.status == 404
        async with s.get(url + "/get_model_info") as r:
            assert r.status == 200
        async with s.post(url + "/generate", json=gen_body(first_prompt(), sampling_params={"max_tokens": 3})) as r:
            assert r.status == 500  # before the contract gate an unknown sampling key crashed the handler


async def test_generate_non_stream_body():
    ids = first_prompt()
    async with serve() as (url, s, _), s.post(url + "/generate", json=gen_body(ids, rid="abc")) as r:
        assert r.status == 200
        body = await r.json()
    assert list(body) == ["text", "output_ids", "meta_info"]
    meta = body["meta_info"]
    assert meta["id"] == "abc" and meta["prompt_tokens"] == len(ids)
    assert meta["finish_reason"] == {"type": "stop", "matched": 151645}
    assert body["output_ids"][-1] == 151645 and body["output_ids"][0] == 151667
    assert [e[1] for e in meta["output_token_logprobs"]] == body["output_ids"]
    assert all(e[0] < 0 and e[2] is None for e in meta["output_token_logprobs"])
    assert meta["completion_tokens"] == len(body["output_ids"]) == meta["output_token_logprobs_length"]
    assert body["text"].endswith("</tool_call><|im_end|>")  # no_stop_trim + skip_special_tokens=False


async def test_stop_token_trimmed_from_text_by_default():
    async with serve() as (url, s, _), s.post(url + "/generate", json={"input_ids": first_prompt()}) as r:
        body = await r.json()
    assert body["output_ids"][-1] == 151645 and "<|im_end|>" not in body["text"]
    assert "output_token_logprobs" not in body["meta_info"]


async def test_stream_cumulative_then_done_and_last_equals_non_stream():
    ids = first_prompt()
    async with serve() as (url, s, _):
        async with s.post(url + "/generate", json=gen_body(ids, rid="x")) as r:
            plain = await r.json()
        async with s.post(url + "/generate", json=gen_body(ids, rid="x", stream=True)) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            events = await sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == len(plain["output_ids"])
    assert [len(c["output_ids"]) for c in chunks] == list(range(1, len(chunks) + 1))
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    last = chunks[-1]
    assert last["output_ids"] == plain["output_ids"] and last["text"] == plain["text"]
    assert last["meta_info"]["finish_reason"] == plain["meta_info"]["finish_reason"]


async def test_stream_incremental_deltas_concatenate():
    async with serve(incremental_streaming=True) as (url, s, _):
        async with s.post(url + "/generate", json=gen_body(first_prompt(), stream=True)) as r:
            events = await sse_events(r)
        async with s.post(url + "/generate", json=gen_body(first_prompt())) as r:
            plain = await r.json()
    chunks = events[:-1]
    assert all(len(c["output_ids"]) == 1 for c in chunks)
    assert [i for c in chunks for i in c["output_ids"]] == plain["output_ids"]
    assert [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]] == plain["meta_info"][
        "output_token_logprobs"
    ]
    assert chunks[-1]["meta_info"]["completion_tokens"] == len(plain["output_ids"])


async def test_abort_running_request_returns_partial_output():
    scenario = {"turns": [{"text": " ".join(["step"] * 80), "faults": {"token_delay_ms": 30}}]}  # 2.4 s whole
    async with serve(scenario) as (url, s, app):
        task = asyncio.ensure_future(s.post(url + "/generate", json=gen_body(first_prompt(), rid="run-1")))
        await until_generating(app, "run-1", tokens=1)
        async with s.post(url + "/abort_request", json={"rid": "run-1"}) as r:
            assert r.status == 200 and await r.read() == b""
        resp = await task
        body = await resp.json()
    assert resp.status == 200
    assert body["meta_info"]["finish_reason"] == {
        "type": "abort",
        "message": "Aborted",
        "status_code": None,
        "err_type": None,
    }
    assert 0 < len(body["output_ids"]) < 80 and 151645 not in body["output_ids"]
    assert len(body["meta_info"]["output_token_logprobs"]) == len(body["output_ids"])


async def test_abort_prefix_all_and_unknown_rid():
    # 40 tokens of 25 ms: "other" runs to its end in 1 s, the aborts land long before the others' ends
    scenario = {"turns": [{"text": " ".join("abcdefghij" * 4), "faults": {"token_delay_ms": 25}}]}
    async with serve(scenario) as (url, s, app):
        tasks = {
            rid: asyncio.ensure_future(s.post(url + "/generate", json=gen_body(first_prompt(), rid=rid)))
            for rid in ("job", "job-2", "other")
        }
        await until_generating(app, *tasks)
        async with s.post(url + "/abort_request", json={"rid": "nope"}) as r:
            assert r.status == 200  # unknown rid: 200, nothing aborted
        async with s.post(url + "/abort_request", json={"rid": "job"}) as r:
            assert r.status == 200
        reasons = {rid: (await (await t).json())["meta_info"]["finish_reason"]["type"] for rid, t in tasks.items()}
    assert reasons == {"job": "abort", "job-2": "abort", "other": "stop"}

    async with serve(scenario) as (url, s, app):
        posts = [
            asyncio.ensure_future(s.post(url + "/generate", json=gen_body(first_prompt(), rid=f"r{i}")))
            for i in range(3)
        ]
        await until_generating(app, "r0", "r1", "r2")
        async with s.post(url + "/abort_request", json={"rid": "", "abort_all": True}) as r:
            assert r.status == 200
        kinds = [(await (await t).json())["meta_info"]["finish_reason"]["type"] for t in posts]
    assert kinds == ["abort"] * 3


async def test_abort_queued_request_gives_waiting_queue_body():
    # 30 tokens of 30 ms: the first request holds the one slot for 0.9 s, the second is aborted in the queue meanwhile
    scenario = {"turns": [{"text": " ".join("abcdefghij" * 3), "faults": {"token_delay_ms": 30}}]}
    async with serve(scenario, max_running_requests=1) as (url, s, app):
        running = asyncio.ensure_future(s.post(url + "/generate", json=gen_body(first_prompt(), rid="first")))
        await until_generating(app, "first")
        queued = asyncio.ensure_future(s.post(url + "/generate", json=gen_body(first_prompt(), rid="second")))
        await until_queued(app, "second")
        async with s.post(url + "/abort_request", json={"rid": "second"}) as r:
            assert r.status == 200
        body = await (await queued).json()
        first = await (await running).json()
    assert body["text"] == "" and body["output_ids"] == []
    meta = body["meta_info"]
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"}
    assert "prompt_tokens" not in meta and "cached_tokens" not in meta and meta["completion_tokens"] == 0
    assert first["meta_info"]["finish_reason"]["type"] == "stop"


async def test_router_mode_lists_workers_and_refuses_abort():
    async with serve(router=True) as (url, s, _):
        async with s.get(url + "/workers") as r:
            workers = (await r.json())["workers"]
        async with s.post(url + "/abort_request", json={"rid": "x"}) as r:
            assert r.status == 404
        worker_url = workers[0]["url"]
        async with s.post(worker_url + "/abort_request", json={"rid": "x"}) as r:
            assert r.status == 200
        async with s.post(
            url + "/generate", json=gen_body(first_prompt()), headers={"X-SMG-Routing-Key": "sess-1"}
        ) as r:
            assert (await r.json())["meta_info"]["finish_reason"]["type"] == "stop"
        async with s.post(worker_url + "/generate", json=gen_body(first_prompt())) as r:
            assert r.status == 200


def test_the_fake_engine_takes_listen_like_every_tito_server() -> None:
    from tests.process_helpers import free_port, tito

    port = free_port()
    with tito("fake-engine", "--demo", "--listen", f"127.0.0.1:{port}", ready=f"http://127.0.0.1:{port}/health"):
        pass
