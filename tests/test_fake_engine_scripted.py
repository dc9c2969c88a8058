"""The scripted policy: Qwen3-native output that sglang's parsers read back, sessions, turns, logprobs."""

from __future__ import annotations

import json
from functools import lru_cache

import pytest

from tests.fake_engine_helpers import BASH, EXEC, TOOL_LOOP, first_prompt, prompt_ids, serve, tokenizer
from tito_rl.fake_engine.drift import inject_split
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, load_scenario, parse_scenario
from tito_rl.fake_engine.policy import GenerateRequest
from tito_rl.fake_engine.sessions import session_key, turn_index
from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers as sglang_parsers


@lru_cache(maxsize=1)
def parsers():
    sglang = sglang_parsers()

    def parse(text: str, tools: list[dict]):
        reasoning, normal = sglang.ReasoningParser("qwen3").parse_non_stream(text)
        sg_tools = [sglang.Tool(type="function", function=sglang.Function(**t["function"])) for t in tools]
        normal, calls = sglang.FunctionCallParser(sg_tools, "qwen25").parse_non_stream(normal)
        return reasoning, normal, [(tools[c.tool_index]["function"]["name"], json.loads(c.parameters)) for c in calls]

    return parse


def request(ids, routing_key=None):
    return GenerateRequest(
        input_ids=ids,
        sampling_params={},
        rid="r",
        routing_key=routing_key,
        session_key=session_key(ids, routing_key),
        turn_index=turn_index(ids),
    )


@pytest.mark.parametrize(
    "tools,name,args", [([BASH], "Bash", {"command": "ls"}), ([EXEC], "exec_command", {"cmd": "ls"})]
)
def test_rendered_turn_parses_back_with_sglang_parsers(tools, name, args):
    policy = ScriptedPolicy(parse_scenario(TOOL_LOOP), tokenizer())
    gen = policy.generate(request(first_prompt(tools=tools)))
    assert gen.output_ids[-1] == 151645 and gen.finish == "stop"
    text = tokenizer().decode(gen.output_ids[:-1], skip_special_tokens=False)
    reasoning, normal, calls = parsers()(text, tools)
    assert reasoning.strip() == "The user wants a listing."
    assert normal.strip() == "Let me list the files."
    assert calls == [(name, args)]


def test_turn_index_follows_assistant_turns_and_session_key_ignores_rid():
    tok = tokenizer()
    policy = ScriptedPolicy(parse_scenario(TOOL_LOOP), tok)
    p1 = first_prompt()
    g1 = policy.generate(request(p1))
    reply = tok.decode(g1.output_ids[:-1], skip_special_tokens=False)
    history = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "list the files"},
        {
            "role": "assistant",
            "content": reply.split("</think>\n\n")[1].split("\n<tool_call>")[0],
            "reasoning_content": "The user wants a listing.",
            "tool_calls": [{"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}],
        },
        {"role": "tool", "content": "a.txt\nb.txt"},
    ]
    p2 = prompt_ids(history, tools=[BASH])
    assert turn_index(p1) == 0 and turn_index(p2) == 1
    assert session_key(p1, None) == session_key(p2, None)  # same opening, same session
    assert session_key(p1, "abc") == "k:abc"
    g2 = policy.generate(request(p2))
    assert tok.decode(g2.output_ids, skip_special_tokens=True) == "There are two files."


def test_sessions_match_by_routing_key_and_prompt_text():
    scenario = parse_scenario(
        {
            "sessions": [
                {"match": {"routing_key": "k1"}, "turns": ["by key"]},
                {"match": {"prompt_contains": "weather"}, "turns": ["by prompt"]},
                {"turns": ["fallback"]},
            ]
        }
    )
    policy = ScriptedPolicy(scenario, tokenizer())

    def say(ids, key=None):
        return tokenizer().decode(policy.generate(request(ids, key)).output_ids, skip_special_tokens=True)

    assert say(first_prompt(), "k1") == "by key"
    assert say(first_prompt("what is the weather")) == "by prompt"
    assert say(first_prompt()) == "fallback"


def test_logprobs_are_deterministic_negative_and_vary_by_session():
    policy = ScriptedPolicy(parse_scenario(TOOL_LOOP), tokenizer())
    a = policy.generate(request(first_prompt())).logprobs
    b = policy.generate(request(first_prompt())).logprobs
    c = policy.generate(request(first_prompt("another task"))).logprobs
    assert a == b and a != c and all(x < 0 for x in a)


def test_after_last_error_and_raw_ids_and_bad_scenarios():
    from tito_rl.fake_engine.policy import PolicyError

    policy = ScriptedPolicy(parse_scenario({"after_last": "error", "turns": [{"ids": [9707, 151645]}]}), tokenizer())
    assert policy.generate(request(first_prompt())).output_ids == [9707, 151645]
    second = prompt_ids(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}, {"role": "user", "content": "z"}]
    )
    with pytest.raises(PolicyError, match="has no turn 1"):
        policy.generate(request(second))
    bad_scenarios = [
        ({"turns": [{"txt": "x"}]}, "turns[0]: unknown key 'txt'; allowed: fault_attempts, faults, "),
        ({}, "scenario: needs `sessions` (or a top-level `turns` list)"),
        ({"turns": [{"finish": "maybe"}]}, "turns[0].finish: 'maybe' is not one of 'stop', 'length', "),
        ({"turns": [{"faults": {"status": 404}}]}, "turns[0].faults.status: 404 is not one of 500, "),
    ]
    for bad, msg in bad_scenarios:
        with pytest.raises(ValueError) as info:
            parse_scenario(bad)
        assert str(info.value).startswith(msg), str(info.value)


def test_example_scenarios_load():
    from pathlib import Path

    for path in sorted(Path("fake_engine/examples").glob("*.yaml")):
        assert load_scenario(path).sessions


def test_drift_split_decodes_the_same_but_reencodes_differently():
    tok = tokenizer()
    ids = tok.encode("Let me list the files.", add_special_tokens=False) + [151645]
    split = inject_split(tok, ids)
    assert split is not None
    drifted, pos = split
    assert len(drifted) == len(ids) + 1
    assert tok.decode(drifted) == tok.decode(ids)
    text = tok.decode(drifted[:-1])
    assert tok.encode(text, add_special_tokens=False) != drifted[:-1]


def test_several_splits_spread_from_the_first_splittable_token_to_the_last():
    from tito_rl.fake_engine.drift import inject_splits, split_token

    tok = tokenizer()
    text = (
        '<think>\nI list the files.\n</think>\n\nLooking.\n<tool_call>\n{"name": "Bash", "arguments": '
        '{"command": "ls -la src"}}\n</tool_call>'
    )
    ids = tok.encode(text, add_special_tokens=False) + [151645]
    splittable = [p for p, t in enumerate(ids) if t < 151643 and split_token(tok, t) is not None]
    splits = inject_splits(tok, ids, 4)
    assert splits is not None
    drifted, positions = splits
    assert len(drifted) == len(ids) + 4 and tok.decode(drifted) == tok.decode(ids) and drifted[-1] == 151645
    originals = [p - k for k, p in enumerate(positions)]  # each split shifts the later ones by one
    assert originals[0] == splittable[0] and originals[-1] == splittable[-1] and len(set(originals)) == 4
    assert all(
        tok.decode(drifted[p : p + 2]) == tok.decode([ids[o]]) for p, o in zip(positions, originals, strict=True)
    )
    assert any('"' in tok.decode([ids[o]]) for o in originals)  # some land inside the tool call's JSON
    all_splits = inject_splits(tok, ids, 1000)
    assert all_splits is not None
    every, _ = all_splits
    assert len(every) == len(ids) + len(splittable)  # more than there are: each splittable token once
    assert inject_splits(tok, ids, 1) == (inject_split(tok, ids)[0], [inject_split(tok, ids)[1]])
    assert inject_splits(tok, ids, 0) is None and inject_splits(tok, [151645], 3) is None


async def test_drift_fault_over_http():
    scenario = {"turns": [{"text": "Let me list the files.", "faults": {"drift": True}}]}
    async with serve(scenario) as (url, s, _):
        r = await s.post(url + "/generate", json={"input_ids": first_prompt(), "return_logprob": True})
        body = await r.json()
    tok = tokenizer()
    out = body["output_ids"]
    assert tok.decode(out[:-1]) == "Let me list the files."
    assert tok.encode(tok.decode(out[:-1]), add_special_tokens=False) != out[:-1]
    assert len(body["meta_info"]["output_token_logprobs"]) == len(out)


def test_one_routing_key_with_two_openings_plays_two_scripted_sessions():
    """The adapter sends its session id as the routing key for a sub-agent's prompts too: the scripted
    session is chosen by each prompt's own opening, not by the first opening seen under that key."""
    scenario = parse_scenario(
        {"sessions": [{"match": {"prompt_contains": "sub-agent"}, "turns": ["from sub"]}, {"turns": ["from main"]}]}
    )
    policy = ScriptedPolicy(scenario, tokenizer())

    def say(ids):
        return tokenizer().decode(policy.generate(request(ids, "sid-1")).output_ids, skip_special_tokens=True)

    assert say(first_prompt()) == "from main"
    sub = prompt_ids([{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": "look"}])
    assert say(sub) == "from sub"
    assert say(first_prompt()) == "from main"


async def test_fault_attempts_fail_only_the_first_requests_of_a_turn():
    """`fault_attempts: 1`: the first request for the turn gets the 529, the identical re-send is answered."""
    scenario = {
        "client": {"sessions": []},  # a corpus scenario's client side is ignored by the engine
        "turns": [{"text": "Answered on retry.", "faults": {"status": 529}, "fault_attempts": 1}],
    }
    async with serve(scenario) as (url, s, _):
        statuses, texts = [], []
        for _ in range(3):
            r = await s.post(url + "/generate", json={"input_ids": first_prompt()})
            statuses.append(r.status)
            texts.append((await r.json()).get("text"))
    assert statuses == [529, 200, 200]
    assert texts[1] == texts[2] == "Answered on retry."
    with pytest.raises(ValueError, match=r"^turns\[0\]\.fault_attempts: expected integer >= 1, got 0$"):
        parse_scenario({"turns": [{"text": "x", "fault_attempts": 0}]})


def test_fault_attempts_cut_only_the_first_requests_of_a_turn():
    """`finish: length` with `fault_attempts: 1`: the first request is cut, a client that drops the cut reply
    and asks again for the same turn (Claude Code after a cut in its reasoning) gets the whole turn."""
    scenario = parse_scenario(
        {
            "turns": [
                {
                    "reasoning": "Think at length about it.",
                    "text": "The answer.",
                    "finish": "length",
                    "length": 4,
                    "fault_attempts": 1,
                }
            ]
        }
    )
    policy = ScriptedPolicy(scenario, tokenizer())
    cut, whole, again = (policy.generate(request(first_prompt())) for _ in range(3))
    assert (cut.finish, len(cut.output_ids)) == ("length", 4)
    assert whole.finish == again.finish == "stop"
    assert whole.output_ids[:4] == cut.output_ids and whole.output_ids == again.output_ids
    assert tokenizer().decode(whole.output_ids, skip_special_tokens=True).endswith("The answer.")
