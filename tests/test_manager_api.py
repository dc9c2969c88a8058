"""The manager's API around linearization: identity, records, events, stats, tree export, bad input."""

from __future__ import annotations

import json

import pytest

from tito_rl.trajectory.canonical import canonical_message
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.records import Sample, TurnRecord
from tito_rl.trajectory.synthetic import SyntheticSession, assistant, system, tool, user


def test_canonical_identity_ignores_cosmetic_echo_changes() -> None:
    sent = {
        "role": "assistant",
        "content": "hi",
        "reasoning_content": "r",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls", "n": 1}}}
        ],
    }
    echoed = {
        "tool_calls": [
            {"type": "function", "id": "toolu_9", "function": {"arguments": '{"n":1,"command":"ls"}', "name": "Bash"}}
        ],
        "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        "role": "assistant",
    }
    assert canonical_message(sent) == canonical_message(echoed)
    assert canonical_message(sent, keep_reasoning=True) != canonical_message(echoed, keep_reasoning=True)
    assert canonical_message({"role": "assistant", "content": None}) == canonical_message({"role": "assistant"})
    changed = json.loads(json.dumps(echoed))
    changed["tool_calls"][0]["function"]["arguments"] = '{"n":2,"command":"ls"}'
    assert canonical_message(sent) != canonical_message(changed)
    malformed = {"role": "assistant", "tool_calls": [{"function": {"name": "x", "arguments": "{oops"}}]}
    assert canonical_message(malformed)["tool_calls"][0]["arguments"] == "{oops"  # kept, never lost


def test_echo_with_cosmetic_changes_routes_to_the_same_chain() -> None:
    m = TrajectoryManager()
    s = SyntheticSession(m)
    call = assistant("", ("calc", {"x": 1}))
    s.turn([system("S"), user("go")], call)
    echo = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"x": 1}'}}],
    }
    s.turn(
        [system("S"), {"role": "user", "content": [{"type": "text", "text": "go"}]}, echo, tool("1", "c1")],
        assistant("done"),
    )
    stats = m.stats("s")
    assert (stats.leaves, stats.samples, stats.branches, stats.merges) == (1, 1, 0, 0)


def test_identical_retry_is_recorded_once() -> None:
    m = TrajectoryManager()
    s = SyntheticSession(m)
    s.turn([system("S"), user("go")], assistant("ok"))
    s.turn([system("S"), user("go")], assistant("ok"))
    assert [e.kind for e in m.events("s")] == ["duplicate"]
    assert len(m.samples("s")) == 1


def test_side_turns_stay_out_of_the_tree() -> None:
    m = TrajectoryManager()
    s = SyntheticSession(m)
    s.turn([system("S"), user("go")], assistant("ok"))
    m.record_side_turn("s", [user("title?")], assistant("Title"), TurnRecord([1, 2], [3], "stop", [-1.0]))
    stats = m.stats("s")
    assert (stats.turns, stats.side_turns, stats.samples, stats.leaves) == (1, 1, 1, 1)


def test_stats_events_and_tree_export_explain_a_fork() -> None:
    m = TrajectoryManager()
    s = SyntheticSession(m)
    s.turn([system("S"), user("go")], assistant("", ("calc", {"x": 1})))
    msgs = [system("S"), user("go"), assistant("", ("calc", {"x": 1})), tool("1")]
    drifted = s.vocab.decode(s.template.render(msgs)).replace("user:go", "user:go <DRIFT>")
    s.turn(msgs, assistant("done"), prompt=drifted)
    (fork,) = [e for e in m.events("s") if e.kind == "fork"]
    assert (fork.reason, fork.turn, fork.token_index) == ("prompt", 1, 5)
    assert "fork(prompt) turn=1 at=5" in fork.describe()
    stats = m.stats("s").to_dict()
    assert stats["forks"] == {"prompt": 1} and stats["samples"] == 2 and stats["trained_tokens"] == 5
    tree = m.export_tree("s")
    leaves = [n for n in tree["nodes"] if n["leaf"]]
    assert len(leaves) == 1 and leaves[0]["samples"] == [0, 1] and leaves[0]["generated"]
    assert [n["role"] for n in tree["nodes"]] == ["system", "user", "assistant", "tool", "assistant"]


def test_sample_json_form_has_the_training_field_names() -> None:
    m = TrajectoryManager()
    SyntheticSession(m).turn([system("S"), user("go")], assistant("ok"))
    data = json.loads(json.dumps(m.finish("s", 0.5)[0].to_dict()))
    assert list(data) == ["tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "metadata"]
    assert data["reward"] == 0.5 and data["metadata"]["session"] == "s"
    assert Sample.from_dict(data).to_dict() == data


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"finish_reason": "eos"}, "finish_reason"), ({"output_log_probs": [-1.0]}, "output_log_probs")],
)
def test_turn_record_rejects_bad_input(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        TurnRecord(prompt_ids=[1], output_ids=[2, 3], **kwargs)


def test_manager_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="reward_policy"):
        TrajectoryManager(reward_policy="mean")
    with pytest.raises(ValueError, match="fork_threshold_tokens"):
        TrajectoryManager(fork_threshold_tokens=-1)
    with pytest.raises(ValueError, match="inconsistent sample"):
        Sample(tokens=[1, 2], response_length=1, loss_mask=[1, 1], rollout_log_probs=[0.0])


def _realigned(**options) -> tuple[TrajectoryManager, list[int], list[int]]:
    """Turn 1 reads turn 0's reply back with one token drifted: a realign. Returns the manager and both prompts."""
    m = TrajectoryManager(**options)
    s = SyntheticSession(m)
    call = assistant("", ("calc", {"x": 1}))
    first = s.turn([system("S"), user("go")], call, logprobs=[-0.5] * 3)
    msgs = [system("S"), user("go"), call, tool("2")]
    drifted = s.vocab.decode(s.template.render(msgs)).replace("arg:x=1", "arg:x=1 <DRIFT>")
    second = s.turn(msgs, assistant("ok"), prompt=drifted, logprobs=[-0.25] * 2)
    return m, first.prompt_ids, second.prompt_ids


def test_coverage_counts_emitted_tokens_a_realign_or_a_merge_leaves_untrained() -> None:
    m, _, _ = _realigned()
    stats = m.stats("s")
    assert (stats.emitted_tokens, stats.trained_tokens, stats.coverage) == (5, 2, 0.4)  # turn 0's 3 lost
    m = TrajectoryManager()
    s = SyntheticSession(m)
    s.turn([system("S"), user("go")], assistant("hi there"))
    s.turn([system("S"), user("go"), assistant("hi  there"), user("more")], assistant("ok"))  # a rewrite: merge
    stats = m.stats("s")
    assert [e.kind for e in m.events("s")] == ["merge"] and stats.emitted_tokens == 5 and stats.trained_tokens == 2
    fork, _, _ = _realigned(fork_threshold_tokens=0)  # a fork keeps every reply trained: nothing is lost
    assert fork.stats("s").coverage == 1.0 and fork.stats("s").forks == {"threshold": 1}


def test_an_unspliced_prompt_is_a_decision_and_names_the_realign_it_causes() -> None:
    m = TrajectoryManager()
    s = SyntheticSession(m)
    call = assistant("", ("calc", {"x": 1}))
    s.turn([system("S"), user("go")], call)
    msgs = [system("S"), user("go"), call, tool("2")]
    drifted = s.vocab.encode(s.vocab.decode(s.template.render(msgs)).replace("arg:x=1", "arg:x=1 <DRIFT>"))
    m.record_turn(
        "s", msgs, assistant("ok"), TurnRecord(drifted, s.template.reply_ids(assistant("ok")), unspliced="why not")
    )
    assert [e.describe() for e in m.events("s")][:2] == [
        "unspliced(why not) turn=1",
        "realign(divergence inside the response of turn 0, prompt rendered: not spliced) turn=1 at=9 leaf=5 tokens=3",
    ]


def test_response_region_starts_after_the_first_prompt_as_slime_lays_it_out() -> None:
    m, p1, p2 = _realigned()
    (sample,) = m.samples("s", 1.0)
    assert [e.kind for e in m.events("s")] == ["realign"]
    # The realigned reply and the new prompt tail are masked context inside the response region.
    assert sample.response_length == len(p2) - len(p1) + 2
    assert sample.loss_mask == [0] * (len(p2) - len(p1)) + [1, 1]
    assert sample.rollout_log_probs == [0.0] * (len(p2) - len(p1)) + [-0.25, -0.25]
    assert sample.tokens[: len(p1)] == p1 and sample.prompt_length == len(p1)


def test_a_sample_whose_first_turn_an_earlier_sample_trains_keeps_that_turn_masked_in_its_response() -> None:
    m = TrajectoryManager()
    s = SyntheticSession(m)
    call = assistant("", ("calc", {"x": 1}))
    first = s.turn([system("S"), user("go")], call, logprobs=[-0.5] * 3)
    s.turn([system("S"), user("go"), call, tool("a")], assistant("A"), logprobs=[-0.1] * 2)
    s.turn([system("S"), user("go"), call, tool("b")], assistant("B"), logprobs=[-0.2] * 2)
    a, b = m.samples("s", 1.0)
    assert a.rollout_log_probs[:3] == [-0.5] * 3  # trained by the first leaf
    assert b.prompt_length == len(first.prompt_ids)  # the second leaf starts after the same prompt
    assert b.loss_mask[:3] == [0, 0, 0] and b.rollout_log_probs[:3] == [0.0] * 3
    assert b.loss_mask[-2:] == [1, 1] and b.rollout_log_probs[-2:] == [-0.2, -0.2]


def test_first_trained_layout_starts_the_response_at_the_first_trained_token() -> None:
    m, _, _ = _realigned(response_start="first-trained")
    (sample,) = m.samples("s", 1.0)
    assert sample.response_length == 2 and sample.loss_mask == [1, 1] and sample.rollout_log_probs == [-0.25] * 2
    assert m.settings()["response_start"] == "first-trained"
    with pytest.raises(ValueError, match="response_start"):
        TrajectoryManager(response_start="middle")


def test_a_turn_without_prompt_messages_is_refused_not_trained_under_the_root() -> None:
    m = TrajectoryManager()
    record = TurnRecord([1, 2], [5, 6], "stop", [-1.0, -1.0])
    with pytest.raises(ValueError, match="needs its prompt messages"):
        m.record_turn("s", [], assistant("orphan"), record)
    with pytest.raises(ValueError, match="needs its prompt messages"):
        m.record_side_turn("s", [], assistant("orphan"), record)
    assert m.sessions() == [] and m.samples("s") == []


@pytest.mark.parametrize("end", ["finish", "drop"])
def test_an_ended_session_is_freed_at_once_without_the_cycle_collector(end: str) -> None:
    """A recording beside a training run ends sessions all day: each one's tree, whose turns hold every prompt's
    token ids, must go when the session ends, by reference counting. The servers run the cycle collector's full
    pass at most once a minute (`server_process.LoopCollector`), and a tree's parent and child links are a
    cycle: until that pass, a minute of finished sessions stayed in memory (hundreds of MiB in the soak bench)."""
    import gc
    import weakref

    m = TrajectoryManager()
    s = SyntheticSession(m)
    call = assistant("", ("calc", {"x": 1}))
    first = s.turn([system("S"), user("go")], call)
    s.turn([system("S"), user("go"), call, tool("1", "c1")], assistant("done"))
    s.turn([system("S"), user("other")], assistant("a fork"))  # a second chain from the root
    turn, node = weakref.ref(first), weakref.ref(m._sessions["s"].tree.root)
    del first
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        if end == "finish":
            assert m.finish("s", 1.0)  # samples are made before the tree goes
        else:
            m.drop("s")
        assert turn() is None and node() is None
    finally:
        if was_enabled:
            gc.enable()
    assert m.sessions() == []
