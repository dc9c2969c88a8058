"""`tito fake-engine --policy random`: a policy that samples like a model, seen by a real HTTP client on loopback.

The same request and seed give the same tokens on every server start and in every dialect; requests without a seed
follow the server's `--seed` stream. Each sampling parameter is honoured with the engines' own answer fields
(SGLang's `finish_reason.matched` and `matched_stop`, vLLM's `stop_reason`), stop strings trimmed from the text as
each engine trims them while the ids keep every token generated.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from tests.fake_engine_helpers import prompt_ids, sse_events, tokenizer
from tito_rl.fake_engine.app import EngineOptions, create_app
from tito_rl.fake_engine.cli import add_arguments
from tito_rl.fake_engine.policies.sampler.model import IM_END
from tito_rl.fake_engine.policies.sampler.policy import RandomPolicy

MESSAGES = [{"role": "user", "content": "Tell me something."}]
CHAT, COMPLETIONS, GENERATE, VLLM_GENERATE = (
    "/v1/chat/completions",
    "/v1/completions",
    "/generate",
    "/inference/v1/generate",
)
COMMA = 11  # ","


@asynccontextmanager
async def random_engine(seed: int = 0) -> AsyncIterator[tuple[str, ClientSession, RandomPolicy]]:
    policy = RandomPolicy(tokenizer(), seed=seed)
    server = TestServer(create_app(policy, EngineOptions(tokenizer=tokenizer())), host="127.0.0.1")
    await server.start_server()
    try:
        async with ClientSession() as session:
            yield str(server.make_url("")).rstrip("/"), session, policy
    finally:
        await server.close()


async def post(s: ClientSession, url: str, path: str, body: dict[str, Any]) -> Any:
    async with s.post(url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


async def stream(s: ClientSession, url: str, path: str, body: dict[str, Any]) -> list[Any]:
    async with s.post(url + path, json={**body, "stream": True}) as resp:
        assert resp.status == 200, await resp.text()
        return [e for e in await sse_events(resp) if e != "[DONE]"]


def prompt() -> list[int]:
    return prompt_ids(MESSAGES)


def generate(**sampling: Any) -> dict[str, Any]:
    return {"input_ids": prompt(), "sampling_params": sampling, "return_logprob": True}


def lps_of(body: dict[str, Any]) -> list[float]:
    return [t[0] for t in body["meta_info"]["output_token_logprobs"]]


async def every_dialect(s: ClientSession, url: str, seed: int, **extra: Any) -> dict[str, list[int]]:
    """The output ids one seeded request gets in each dialect (the same prompt everywhere)."""
    ids = prompt()
    sglang = await post(s, url, GENERATE, generate(sampling_seed=seed, **extra))
    sglang_chat = await post(
        s, url, CHAT, {"messages": MESSAGES, "input_ids": ids, "seed": seed, "return_token_ids": True, **extra}
    )
    chat = await post(s, url, CHAT, {"messages": MESSAGES, "seed": seed, "return_token_ids": True, **extra})
    completions = await post(s, url, COMPLETIONS, {"prompt": ids, "seed": seed, "return_token_ids": True, **extra})
    tokens = await post(s, url, VLLM_GENERATE, {"token_ids": ids, "sampling_params": {"seed": seed, **extra}})
    return {
        "sglang": sglang["output_ids"],
        "sglang-openai": sglang_chat["choices"][0]["response_token_ids"],
        "vllm chat": chat["choices"][0]["token_ids"],
        "vllm completions": completions["choices"][0]["token_ids"],
        "vllm-generate": tokens["choices"][0]["token_ids"],
    }


async def test_a_seeded_request_repeats_across_starts_and_dialects() -> None:
    async with random_engine(seed=1) as (url, s, _):
        first = await every_dialect(s, url, 42)
        again = await every_dialect(s, url, 42)
        other = await every_dialect(s, url, 43)
    async with random_engine(seed=2) as (url, s, _):  # the server's seed does not move a seeded request
        restarted = await every_dialect(s, url, 42)
    ids = first["sglang"]
    assert ids and all(v == ids for v in first.values()), first
    assert again == first and restarted == first
    assert other["sglang"] != ids and all(v == other["sglang"] for v in other.values())


async def test_unseeded_requests_follow_the_servers_seed() -> None:
    async def three(seed: int) -> list[list[int]]:
        async with random_engine(seed=seed) as (url, s, _):
            return [(await post(s, url, GENERATE, generate()))["output_ids"] for _ in range(3)]

    one, again, other = await three(7), await three(7), await three(8)
    assert one == again  # the same requests in the same order on a fresh start
    assert len({tuple(ids) for ids in one}) == 3  # each request its own draws
    assert other != one


async def test_logprobs_are_the_models_as_each_engine_reports_them() -> None:
    """SGLang's after temperature (and logit_bias), vLLM's raw; the same at temperature 1 without a bias."""
    async with random_engine() as (url, s, policy):
        model = policy.model

        def expected(ids: list[int], temperature: float, raw: bool) -> list[float]:
            digest, out = model.prompt_digest(prompt()), []
            for pos, token in enumerate(ids):
                dist = model.distribution(digest, pos)
                out.append(round(dist.logprob(token, 1.0 if raw else temperature), 6))
                digest = model.next_digest(digest, token)
            return out

        sglang = await post(s, url, GENERATE, generate(sampling_seed=3, max_new_tokens=12, ignore_eos=True))
        vllm = await post(
            s,
            url,
            VLLM_GENERATE,
            {
                "token_ids": prompt(),
                "sampling_params": {"seed": 3, "max_tokens": 12, "logprobs": 0, "ignore_eos": True},
            },
        )
        ids = sglang["output_ids"]
        assert vllm["choices"][0]["token_ids"] == ids
        assert lps_of(sglang) == [e["logprob"] for e in vllm["choices"][0]["logprobs"]["content"]]
        assert lps_of(sglang) == pytest.approx(expected(ids, 1.0, False), abs=1e-6)
        hot = await post(
            s, url, GENERATE, generate(sampling_seed=3, max_new_tokens=12, temperature=0.5, ignore_eos=True)
        )
        hot_vllm = await post(
            s,
            url,
            VLLM_GENERATE,
            {
                "token_ids": prompt(),
                "sampling_params": {"seed": 3, "max_tokens": 12, "temperature": 0.5, "logprobs": 0, "ignore_eos": True},
            },
        )
        hot_ids = hot["output_ids"]
        assert hot_vllm["choices"][0]["token_ids"] == hot_ids
        assert lps_of(hot) == pytest.approx(expected(hot_ids, 0.5, False), abs=1e-6)
        raw = [e["logprob"] for e in hot_vllm["choices"][0]["logprobs"]["content"]]
        assert raw == pytest.approx(expected(hot_ids, 0.5, True), abs=1e-6)
        assert raw != lps_of(hot)


async def test_greedy_is_the_argmax_whatever_the_seed() -> None:
    async with random_engine(seed=1) as (url, s, policy):
        one = await post(s, url, GENERATE, generate(temperature=0, max_new_tokens=20, sampling_seed=1))
        two = await post(s, url, GENERATE, generate(temperature=0, max_new_tokens=20, sampling_seed=2))
        chat = await post(
            s, url, CHAT, {"messages": MESSAGES, "temperature": 0, "max_tokens": 20, "return_token_ids": True}
        )
    async with random_engine(seed=9) as (url, s, _):
        unseeded = await post(s, url, GENERATE, generate(temperature=0, max_new_tokens=20))
    assert one["output_ids"] == two["output_ids"] == unseeded["output_ids"] == chat["choices"][0]["token_ids"]
    digest = policy.model.prompt_digest(prompt())
    for pos, token in enumerate(one["output_ids"]):  # the model's most likely token at every position
        dist = policy.model.distribution(digest, pos)
        assert token == int(dist.ids[int(np.argmax(dist.logits))])
        digest = policy.model.next_digest(digest, token)


async def test_max_tokens_finish_length_in_every_dialect() -> None:
    async with random_engine() as (url, s, _):
        sglang = await post(s, url, GENERATE, generate(sampling_seed=5, max_new_tokens=4, ignore_eos=True))
        chat = await post(
            s,
            url,
            CHAT,
            {"messages": MESSAGES, "seed": 5, "max_tokens": 4, "ignore_eos": True, "return_token_ids": True},
        )
        comp = await post(
            s,
            url,
            COMPLETIONS,
            {"prompt": prompt(), "seed": 5, "max_tokens": 4, "ignore_eos": True, "return_token_ids": True},
        )
    assert sglang["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert len(sglang["output_ids"]) == 4
    for body in (chat, comp):
        choice = body["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"], choice["token_ids"]) == (
            "length",
            None,
            sglang["output_ids"],
        )


async def test_min_tokens_hold_back_the_end_token() -> None:
    """The end token forced by logit_bias still waits for min_tokens; then it stops (vLLM: stop_reason null)."""
    force_end = {str(IM_END): 100}
    async with random_engine() as (url, s, _):
        free = await post(s, url, GENERATE, generate(logit_bias=force_end))
        held = await post(s, url, GENERATE, generate(logit_bias=force_end, min_new_tokens=4))
        chat = await post(
            s, url, CHAT, {"messages": MESSAGES, "logit_bias": force_end, "min_tokens": 4, "return_token_ids": True}
        )
        sglang_chat = await post(
            s, url, CHAT, {"messages": MESSAGES, "input_ids": prompt(), "logit_bias": force_end, "min_tokens": 4}
        )
    assert free["output_ids"] == [IM_END] and free["text"] == ""
    assert len(held["output_ids"]) == 5 and held["output_ids"][-1] == IM_END and IM_END not in held["output_ids"][:4]
    assert held["meta_info"]["finish_reason"] == {"type": "stop", "matched": IM_END}
    choice = chat["choices"][0]
    assert len(choice["token_ids"]) == 5 and choice["token_ids"][-1] == IM_END
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", None)
    assert "<|im_end|>" not in choice["message"]["content"]
    assert (sglang_chat["choices"][0]["finish_reason"], sglang_chat["choices"][0]["matched_stop"]) == ("stop", IM_END)


async def test_stop_token_ids_and_logit_bias_forcing() -> None:
    """A forced `,` that is a stop id ends the answer at once: kept in the ids, left out of the text."""
    force = {str(COMMA): 100}
    async with random_engine() as (url, s, _):
        forced = await post(s, url, GENERATE, generate(logit_bias=force, max_new_tokens=6, sampling_seed=1))
        stopped = await post(s, url, GENERATE, generate(logit_bias=force, stop_token_ids=[COMMA]))
        chat = await post(
            s,
            url,
            CHAT,
            {"messages": MESSAGES, "logit_bias": force, "stop_token_ids": [COMMA], "return_token_ids": True},
        )
        tokens = await post(
            s,
            url,
            VLLM_GENERATE,
            {"token_ids": prompt(), "sampling_params": {"logit_bias": force, "stop_token_ids": [COMMA]}},
        )
    assert forced["output_ids"] == [COMMA] * 6 and forced["text"] == "," * 6
    assert forced["meta_info"]["finish_reason"]["type"] == "length"
    assert stopped["output_ids"] == [COMMA] and stopped["text"] == ""
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": COMMA}
    choice = chat["choices"][0]
    assert (choice["token_ids"], choice["finish_reason"], choice["stop_reason"]) == ([COMMA], "stop", COMMA)
    assert choice["message"]["content"] in ("", None)
    assert tokens["choices"][0]["stop_reason"] == COMMA


async def test_logit_bias_bans_a_token() -> None:
    async with random_engine() as (url, s, _):
        free = await post(s, url, GENERATE, generate(sampling_seed=4, max_new_tokens=16, ignore_eos=True))
        banned_id = free["output_ids"][0]
        banned = await post(
            s,
            url,
            GENERATE,
            generate(sampling_seed=4, max_new_tokens=16, ignore_eos=True, logit_bias={str(banned_id): -100}),
        )
        greedy = await post(s, url, GENERATE, generate(temperature=0, max_new_tokens=16))
        greedy_banned = await post(
            s,
            url,
            GENERATE,
            generate(temperature=0, max_new_tokens=16, logit_bias={str(t): -100 for t in greedy["output_ids"]}),
        )
    assert banned_id not in banned["output_ids"]
    assert banned["output_ids"] != free["output_ids"]
    assert not set(greedy["output_ids"]) & set(greedy_banned["output_ids"])


async def test_ignore_eos_goes_on_past_the_end_token() -> None:
    force_end = {str(IM_END): 100}
    async with random_engine() as (url, s, _):
        sglang = await post(s, url, GENERATE, generate(logit_bias=force_end, ignore_eos=True, max_new_tokens=3))
        chat = await post(
            s,
            url,
            CHAT,
            {
                "messages": MESSAGES,
                "logit_bias": force_end,
                "ignore_eos": True,
                "max_tokens": 3,
                "return_token_ids": True,
            },
        )
    assert sglang["output_ids"] == [IM_END] * 3
    assert sglang["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert (chat["choices"][0]["token_ids"], chat["choices"][0]["finish_reason"]) == ([IM_END] * 3, "length")


def _stop_string(ids: list[int], k: int) -> tuple[str, int]:
    """A stop string that the token at index k completes (it starts in token k-1's text), and where it starts."""
    tok = tokenizer()
    before, upto = tok.decode(ids[: k - 1]), tok.decode(ids[:k])
    text = tok.decode(ids[: k + 1])
    start = max(len(before), len(upto) - 2)
    stop = text[start : len(upto) + 2]
    assert len(upto) + 2 <= len(text) and stop not in tok.decode(ids[:k])
    return stop, start


async def test_stop_strings_trimmed_as_each_engine_trims() -> None:
    async with random_engine() as (url, s, _):
        free = await post(s, url, GENERATE, generate(sampling_seed=6, max_new_tokens=24, ignore_eos=True))
        ids = free["output_ids"]
        k = next(
            i
            for i in range(3, 20)
            if len(tokenizer().decode([ids[i]])) >= 2 and len(tokenizer().decode([ids[i - 1]])) >= 2
        )
        stop, start = _stop_string(ids, k)
        kept = tokenizer().decode(ids[: k + 1])
        base: dict[str, Any] = {"seed": 6, "max_tokens": 24, "ignore_eos": True, "return_token_ids": True}

        sglang = await post(
            s, url, GENERATE, generate(sampling_seed=6, max_new_tokens=24, ignore_eos=True, stop=[stop])
        )
        untrimmed = await post(
            s,
            url,
            GENERATE,
            generate(sampling_seed=6, max_new_tokens=24, ignore_eos=True, stop=stop, no_stop_trim=True),
        )
        sglang_chat = await post(s, url, CHAT, {"messages": MESSAGES, "input_ids": prompt(), "stop": [stop], **base})
        chat = await post(s, url, CHAT, {"messages": MESSAGES, "stop": [stop], **base})
        included = await post(
            s, url, CHAT, {"messages": MESSAGES, "stop": [stop], "include_stop_str_in_output": True, **base}
        )
        comp = await post(s, url, COMPLETIONS, {"prompt": prompt(), "stop": [stop], **base})
        comp_events = await stream(s, url, COMPLETIONS, {"prompt": prompt(), "stop": [stop], **base})
        chat_events = await stream(s, url, CHAT, {"messages": MESSAGES, "stop": [stop], **base})
        sglang_events = await stream(
            s, url, GENERATE, generate(sampling_seed=6, max_new_tokens=24, ignore_eos=True, stop=[stop])
        )
        sglang_chat_events = await stream(
            s,
            url,
            CHAT,
            {
                "messages": MESSAGES,
                "input_ids": prompt(),
                "stop": [stop],
                "seed": 6,
                "max_tokens": 24,
                "ignore_eos": True,
            },
        )
        tokens = await post(
            s,
            url,
            VLLM_GENERATE,
            {
                "token_ids": prompt(),
                "output_mode": "text",
                "sampling_params": {"seed": 6, "ignore_eos": True, "stop": [stop]},
            },
        )

    assert sglang["output_ids"] == ids[: k + 1]  # the token that completed the string is kept
    assert sglang["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert sglang["text"] == kept[:start]
    assert untrimmed["text"] == kept and untrimmed["meta_info"]["finish_reason"]["matched"] == stop
    assert sglang_chat["choices"][0]["matched_stop"] == stop
    assert sglang_chat["choices"][0]["message"]["content"] == kept[:start]
    for body in (chat, comp, tokens):
        choice = body["choices"][0]
        assert (choice["token_ids"], choice["finish_reason"], choice["stop_reason"]) == (ids[: k + 1], "stop", stop)
    assert chat["choices"][0]["message"]["content"] == kept[:start]
    assert included["choices"][0]["message"]["content"] == kept[: start + len(stop)]
    assert comp["choices"][0]["text"] == tokens["choices"][0]["text"] == kept[:start]
    assert "".join(e["choices"][0]["text"] for e in comp_events if e["choices"]) == kept[:start]
    assert comp_events[-1]["choices"][0]["stop_reason"] == stop
    streamed = "".join(
        e["choices"][0]["delta"].get("content") or ""
        for e in chat_events
        if e["choices"] and "delta" in e["choices"][0]
    )
    assert streamed == kept[:start]
    last = [e for e in chat_events if e["choices"]][-1]["choices"][0]
    assert (last["finish_reason"], last["stop_reason"]) == ("stop", stop)
    assert sglang_events[-1]["text"] == kept[:start] and sglang_events[-1]["output_ids"] == ids[: k + 1]
    sglang_streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in sglang_chat_events if e["choices"])
    assert sglang_streamed == kept[:start]
    assert sglang_chat_events[-1]["choices"][0]["matched_stop"] == stop


async def test_n_choices_each_their_own_stream() -> None:
    async with random_engine() as (url, s, _):
        one = await post(s, url, CHAT, {"messages": MESSAGES, "seed": 8, "max_tokens": 10, "return_token_ids": True})
        three = await post(
            s, url, CHAT, {"messages": MESSAGES, "seed": 8, "max_tokens": 10, "n": 3, "return_token_ids": True}
        )
        again = await post(
            s, url, CHAT, {"messages": MESSAGES, "seed": 8, "max_tokens": 10, "n": 3, "return_token_ids": True}
        )
        comp = await post(
            s, url, COMPLETIONS, {"prompt": prompt(), "seed": 8, "max_tokens": 10, "n": 3, "return_token_ids": True}
        )
        sglang = await post(s, url, GENERATE, {**generate(sampling_seed=8, max_new_tokens=10, n=2), "rid": "abc"})
        sglang_events = await stream(
            s, url, GENERATE, {**generate(sampling_seed=8, max_new_tokens=10, n=2), "rid": "x"}
        )
        streamed = await stream(
            s,
            url,
            CHAT,
            {
                "messages": MESSAGES,
                "seed": 8,
                "max_tokens": 10,
                "n": 3,
                "return_token_ids": True,
                "stream_options": {"include_usage": True},
            },
        )
        comp_streamed = await stream(
            s, url, COMPLETIONS, {"prompt": prompt(), "seed": 8, "max_tokens": 10, "n": 3, "return_token_ids": True}
        )
        async with s.post(
            url + VLLM_GENERATE,
            json={"token_ids": prompt(), "sampling_params": {"n": 2}, "stream": True},
        ) as resp:
            one_choice = resp.status, [line for line in (await resp.read()).split(b"\n\n") if line.strip()]
    choices = three["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    outputs = [c["token_ids"] for c in choices]
    assert outputs[0] == one["choices"][0]["token_ids"] and len({tuple(o) for o in outputs}) == 3
    assert [c["token_ids"] for c in again["choices"]] == outputs
    assert [c["token_ids"] for c in comp["choices"]] == outputs
    assert three["usage"]["completion_tokens"] == sum(len(o) for o in outputs)
    assert isinstance(sglang, list) and [b["meta_info"]["id"] for b in sglang] == ["abc_0", "abc_1"]
    assert [b["output_ids"] for b in sglang] == outputs[:2]
    finals = {e["index"]: e for e in sglang_events if e["meta_info"]["finish_reason"] is not None}
    assert [finals[i]["output_ids"] for i in range(2)] == outputs[:2]
    assert [finals[i]["meta_info"]["id"] for i in range(2)] == ["x_0", "x_1"]
    per_index: dict[int, list[int]] = {0: [], 1: [], 2: []}
    order = []
    for event in streamed:
        for c in event["choices"]:
            per_index[c["index"]] += c.get("token_ids") or []
            order.append(c["index"])
    assert [per_index[i] for i in range(3)] == outputs
    assert order[:3] == [0, 1, 2]  # interleaved, as the engine sends them
    assert streamed[-1]["usage"]["completion_tokens"] == sum(len(o) for o in outputs)
    texts = {i: "" for i in range(3)}
    for event in comp_streamed:
        for c in event["choices"]:
            texts[c["index"]] += c["text"]
    assert [texts[i] for i in range(3)] == [c["text"] for c in comp["choices"]]
    # streamed n > 1 on /inference/v1/generate: one choice (the contract's `one-choice`), where the real vLLM answers n
    status, events = one_choice
    assert status == 200 and events[-1] == b"data: [DONE]"
    assert {c["index"] for e in events[:-1] for c in json.loads(e[len(b"data: ") :])["choices"]} == {0}


async def test_streams_carry_the_same_tokens() -> None:
    async with random_engine() as (url, s, _):
        body = await post(s, url, GENERATE, generate(sampling_seed=2, max_new_tokens=30))
        events = await stream(s, url, GENERATE, generate(sampling_seed=2, max_new_tokens=30))
        chat = await stream(s, url, CHAT, {"messages": MESSAGES, "seed": 2, "max_tokens": 30, "return_token_ids": True})
    assert events[-1]["output_ids"] == body["output_ids"] and events[-1]["text"] == body["text"]
    streamed = [t for e in chat if e["choices"] for t in e["choices"][0].get("token_ids") or []]
    assert streamed == body["output_ids"]


def test_the_command_line_chooses_the_policy() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--policy", "random", "--seed", "3"])
    assert (args.policy, args.seed) == ("random", 3)
    with pytest.raises(SystemExit):
        parser.parse_args(["--policy", "random", "--demo"])


async def test_where_the_engines_differ_each_answers_as_its_source_does() -> None:
    """SGLang checks the length before the stop ids, turns every stop id off with ignore_eos and looks for stop
    strings during min_new_tokens; vLLM checks stop ids first, keeps `stop_token_ids` under ignore_eos and looks
    for stop strings only once the output is longer than min_tokens."""
    force_end, force_comma = {str(IM_END): 100}, {str(COMMA): 100}
    async with random_engine() as (url, s, _):
        sglang_last = await post(s, url, GENERATE, generate(logit_bias=force_end, max_new_tokens=1))
        vllm_last = await post(
            s,
            url,
            VLLM_GENERATE,
            {"token_ids": prompt(), "sampling_params": {"logit_bias": force_end, "max_tokens": 1}},
        )
        sglang_ignored = await post(
            s,
            url,
            GENERATE,
            generate(logit_bias=force_comma, stop_token_ids=[COMMA], ignore_eos=True, max_new_tokens=3),
        )
        vllm_kept = await post(
            s,
            url,
            VLLM_GENERATE,
            {
                "token_ids": prompt(),
                "sampling_params": {"logit_bias": force_comma, "stop_token_ids": [COMMA], "ignore_eos": True},
            },
        )
        held: dict[str, Any] = {"seed": 6, "max_tokens": 24, "min_tokens": 20, "ignore_eos": True}
        base = await post(s, url, VLLM_GENERATE, {"token_ids": prompt(), "sampling_params": held})
        ids = base["choices"][0]["token_ids"]
        tok = tokenizer()
        k = next(i for i in range(3, 18) if len(tok.decode([ids[i]])) >= 2 and len(tok.decode([ids[i - 1]])) >= 2)
        stop, _ = _stop_string(ids, k)
        sglang_stop = await post(
            s,
            url,
            GENERATE,
            generate(sampling_seed=6, max_new_tokens=24, min_new_tokens=20, ignore_eos=True, stop=[stop]),
        )
        vllm_stop = await post(
            s, url, VLLM_GENERATE, {"token_ids": prompt(), "sampling_params": {**held, "stop": [stop]}}
        )
    assert sglang_last["output_ids"] == [IM_END] and sglang_last["meta_info"]["finish_reason"]["type"] == "length"
    last = vllm_last["choices"][0]
    assert (last["token_ids"], last["finish_reason"], last["stop_reason"]) == ([IM_END], "stop", None)
    assert sglang_ignored["output_ids"] == [COMMA] * 3
    assert sglang_ignored["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    kept = vllm_kept["choices"][0]
    assert (kept["token_ids"], kept["finish_reason"], kept["stop_reason"]) == ([COMMA], "stop", COMMA)
    assert sglang_stop["output_ids"] == ids[: k + 1]
    assert sglang_stop["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    held_ids = vllm_stop["choices"][0]["token_ids"]
    assert held_ids[: k + 1] == ids[: k + 1] and len(held_ids) > 20


def test_the_pytest_fixture_serves_a_policy_object() -> None:
    """`tito_fake_engine(policy)` (the plugin's `start_fake_engine`) answers with the policy it is given."""
    import json
    import urllib.request

    from tito_rl.replayer.pytest_plugin.fixtures import start_fake_engine

    server = start_fake_engine(RandomPolicy(tokenizer(), seed=5))
    try:
        body = json.dumps(generate(sampling_seed=9, max_new_tokens=6, ignore_eos=True)).encode()
        request = urllib.request.Request(server.url + GENERATE, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())
    finally:
        server.stop()
    assert len(answer["output_ids"]) == 6
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
