"""The fake engine's /generate options and routes as the real SGLang 0.5.23 answered them (the engine contract's
live run, docs/engine-dialects.md): values, not only structure — batches answer each row, top logprobs hold the
sampled token first, input logprobs start where asked, unknown routes answer FastAPI's bodies."""

from __future__ import annotations

from tests.fake_engine_helpers import first_prompt, gen_body, serve, sse_events

SCENARIO = {"turns": [{"text": "Hi there."}, {"text": "Hi there."}, {"text": "Hi there."}]}


async def test_a_batch_and_n_answer_a_list_and_stream_rows_by_index():
    prompt = first_prompt()
    async with serve(SCENARIO) as (url, s, _):
        body = gen_body([], rid=None) | {"input_ids": [prompt, prompt]}
        async with s.post(url + "/generate", json=body) as r:
            batch = await r.json()
        with_n = gen_body(prompt, rid=None)
        with_n["sampling_params"]["n"] = 2
        async with s.post(url + "/generate", json=with_n) as r:
            copies = await r.json()
        async with s.post(url + "/generate", json={**body, "stream": True}) as r:
            events = await sse_events(r)
    assert isinstance(batch, list) and len(batch) == 2 and isinstance(copies, list) and len(copies) == 2
    assert all(answer["meta_info"]["prompt_tokens"] == len(prompt) for answer in batch)
    chunks = events[:-1]
    assert events[-1] == "[DONE]" and {c["index"] for c in chunks} == {0, 1}
    last = {c["index"]: c for c in chunks}  # cumulative: each row's last chunk is its whole answer
    assert all(last[i]["output_ids"] == batch[i]["output_ids"] for i in (0, 1))
    assert all(last[i]["meta_info"]["finish_reason"] is not None for i in (0, 1))
    assert all("weight_versions" not in c["meta_info"] for c in chunks if c["meta_info"]["finish_reason"] is None)


async def test_top_logprobs_start_len_and_text_lay_out_as_sglang_does():
    prompt = first_prompt()
    asked = gen_body(prompt, return_logprob=True, top_logprobs_num=3, logprob_start_len=2, return_text_in_logprobs=True)
    async with serve(SCENARIO) as (url, s, _):
        async with s.post(url + "/generate", json=asked) as r:
            meta = (await r.json())["meta_info"]
        async with s.post(url + "/generate", json=gen_body(prompt, return_logprob=True, logprob_start_len=0)) as r:
            whole = (await r.json())["meta_info"]
    output = meta["output_token_logprobs"]
    assert all(isinstance(text, str) for _, _, text in output)
    assert meta["input_top_logprobs"] == []
    assert [len(row) for row in meta["output_top_logprobs"]] == [3] * len(output)
    assert [row[0][:2] for row in meta["output_top_logprobs"]] == [entry[:2] for entry in output]  # sampled first
    assert [entry[1] for entry in meta["input_token_logprobs"]] == prompt[2:]
    assert whole["input_token_logprobs"][0] == [None, prompt[0], None]  # nothing predicts the first token
    assert len(whole["input_token_logprobs"]) == len(prompt)


async def test_unknown_routes_methods_and_sglang_tokenize_answer_as_the_real_servers():
    async with serve(SCENARIO) as (url, s, _):
        async with s.post(url + "/no_such_route", json={}) as r:
            assert r.status == 404 and await r.json() == {"detail": "Not Found"}
        async with s.delete(url + "/generate") as r:
            assert r.status == 405 and await r.json() == {"detail": "Method Not Allowed"}
        async with s.post(url + "/v1/tokenize", json={"prompt": "The capital of France is"}) as r:
            tokens = await r.json()
        async with s.post(url + "/v1/detokenize", json={"tokens": tokens["tokens"]}) as r:
            text = await r.json()
        async with s.post(url + "/generate", json={"input_ids": [1], "sampling_params": [1]}) as r:
            refused = (r.status, await r.json())
    assert tokens["tokens"] == [785, 6722, 315, 9625, 374] and tokens["count"] == 5
    assert text == {"text": "The capital of France is"}
    assert refused[0] == 400 and refused[1]["object"] == "error"  # pydantic's envelope, as the real one
