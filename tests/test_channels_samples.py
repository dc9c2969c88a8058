"""Per-token channels from turns into samples: expert routes stay aligned with the tokens through everything the
manager does (splice, realign, fork, retries, compaction, truncation, aborts), the last generated token's row comes
from the next turn's prefill, unknown rows are -1 and named; kept sets are CSR over the response with empty spans
for untrained tokens; one weight version per generated turn. Routes come from a deterministic MoE
(`channel_support.expert_rows`), so every row a sample holds is checked against the ids it routes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.channel_support import (
    LAYERS,
    TOP_K,
    expected_rows,
    kept_for,
    routes_for,
    versions,
)
from tito_rl.trajectory.golden import channel_lines, render_sample_runs
from tito_rl.trajectory.linearize import common_prefix_len
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.records import Sample, TurnRecord
from tito_rl.trajectory.synthetic import SyntheticSession, assistant, logprobs_for, system, tool, user

S, U = system("S"), user("compute")
CALL = assistant("", ("calc", {"x": 1}))
OK = assistant("ok")
AUTO = -1  # start where the previous turn's tokens end, less its last token's row (the adapter's splice rule)


class Routed:
    """Drives a manager as the adapter does, each turn's record carrying the channels an engine would send."""

    def __init__(self, **options: Any) -> None:
        self.manager = TrajectoryManager(**options)
        self.s = SyntheticSession(self.manager)
        self.records: list[TurnRecord] = []

    def names(self, messages: list[dict[str, Any]]) -> str:
        return self.s.vocab.decode(self.s.template.render(messages))

    def turn(
        self,
        messages: list[dict[str, Any]],
        reply: dict[str, Any],
        *,
        start: int = AUTO,
        prompt: str | None = None,
        output: str | None = None,
        finish: str = "stop",
        routes: bool = True,
        kept: bool = True,
        weights: tuple[str, ...] = ("v1",),
    ) -> TurnRecord:
        vocab, template = self.s.vocab, self.s.template
        prompt_ids = vocab.encode(prompt) if prompt is not None else template.render(messages)
        output_ids = vocab.encode(output) if output is not None else template.reply_ids(reply)
        if finish == "length" and output is None:
            output_ids = output_ids[:-1]
        if start == AUTO:
            start = 0
            if self.records:
                held = self.records[-1].prompt_ids + self.records[-1].output_ids
                if common_prefix_len(held, prompt_ids) == len(held):
                    start = len(held) - 1
        record = TurnRecord(
            prompt_ids,
            output_ids,
            finish,
            logprobs_for(output_ids, len(self.records)),
            routes=routes_for(prompt_ids, output_ids, start) if routes else None,
            kept=kept_for(output_ids) if kept else None,
            weight_versions=versions(len(output_ids), *weights),
        )
        self.records.append(record)
        self.manager.record_turn("s", messages, reply, record)
        return record

    def samples(self) -> list[Sample]:
        return self.manager.samples("s", 1.0)


def rows(sample: Sample) -> np.ndarray:
    routes = sample.rollout_routed_experts
    assert routes is not None and routes.shape == (len(sample.tokens) - 1, LAYERS, TOP_K)
    return routes.reshape(len(sample.tokens) - 1, -1)


def assert_aligned(sample: Sample) -> None:
    """Every row is the one its token's prefix routes to, except the rows the metadata names unknown (all -1)."""
    unknown = sample.metadata.get("routes_unknown_rows")
    assert np.array_equal(rows(sample), expected_rows(sample.tokens, unknown))


# ---- routes ------------------------------------------------------------------------------------------------


def test_spliced_turns_align_and_each_last_token_row_comes_from_the_next_prefill() -> None:
    r = Routed()
    first = r.turn([S, U], CALL)
    second = r.turn([S, U, CALL, tool("2")], CALL)
    r.turn([S, U, CALL, tool("2"), CALL, tool("3")], OK)
    [sample] = r.samples()
    assert_aligned(sample)
    assert "routes_unknown_rows" not in sample.metadata and "routes_layout" not in sample.metadata
    # Turn 0's answer lacks its last sampled token's row; turn 1 was asked from exactly there and supplied it.
    last = len(first.prompt_ids) + len(first.output_ids) - 1
    assert first.routes is not None and first.routes.end == last
    assert second.routes is not None and second.routes.start == last
    assert np.array_equal(rows(sample)[last], second.routes.rows[0])
    assert (rows(sample) >= 0).all()


def test_a_row_no_answer_covered_is_minus_one_and_named() -> None:
    r = Routed()
    first = r.turn([S, U], CALL)
    last = len(first.prompt_ids) + len(first.output_ids) - 1
    r.turn([S, U, CALL, tool("2")], OK, start=last + 1)  # asked from one row too late
    [sample] = r.samples()
    assert sample.metadata["routes_unknown_rows"] == [[last, last + 1]]
    assert (rows(sample)[last] == -1).all()
    assert_aligned(sample)
    assert f"unknown rows {last}" in channel_lines(sample)[0]


def test_a_realigned_turn_replaces_the_rows_of_the_rewritten_tokens() -> None:
    r = Routed()
    r.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    drifted = r.names(msgs).replace("arg:x=1", "arg:x=1 <DRIFT>")
    r.turn(msgs, OK, prompt=drifted, start=0)  # a rendered prompt: asked from row 0
    [sample] = r.samples()
    assert r.manager.stats("s").realigns == 1
    assert_aligned(sample)
    assert "routes_unknown_rows" not in sample.metadata


def test_a_realign_keeps_the_rows_before_the_divergence_from_the_earlier_turn() -> None:
    r = Routed()
    first = r.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    drifted = r.names(msgs).replace("arg:x=1", "arg:x=1 <DRIFT>")
    lcp = common_prefix_len(first.prompt_ids + first.output_ids, r.s.vocab.encode(drifted))
    r.turn(msgs, OK, prompt=drifted, start=lcp)  # an engine asked only from the divergence
    [sample] = r.samples()
    assert r.manager.stats("s").realigns == 1
    assert_aligned(sample)  # rows before lcp from turn 0, after it from turn 1: none of turn 0's drifted rows
    assert "routes_unknown_rows" not in sample.metadata


@pytest.mark.parametrize("drift", ["arg:x=1", "user:compute"], ids=["realign", "fork"])
def test_rows_computed_over_rewritten_tokens_are_never_kept(drift: str) -> None:
    """The turn after a realign or fork sent no routes: the earlier turn's rows past the divergence were computed
    over tokens the sample no longer holds, so they are unknown, not stale."""
    r = Routed()
    first = r.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    drifted = r.names(msgs).replace(drift, drift + " <DRIFT>")
    lcp = common_prefix_len(first.prompt_ids + first.output_ids, r.s.vocab.encode(drifted))
    r.turn(msgs, OK, prompt=drifted, routes=False)
    sample = r.samples()[-1]
    assert sample.metadata["routes_unknown_rows"] == [[lcp, len(sample.tokens) - 1]]
    assert sample.metadata["routes_missing_turns"] == [{"turn": 1, "why": "the engine sent none"}]
    assert_aligned(sample)


def test_a_fork_carries_the_shared_prefix_rows_into_the_new_sample() -> None:
    r = Routed()
    first = r.turn([S, U], CALL)
    msgs = [S, U, CALL, tool("2")]
    drifted = r.names(msgs).replace("user:compute", "user:compute <DRIFT>")
    lcp = common_prefix_len(first.prompt_ids + first.output_ids, r.s.vocab.encode(drifted))
    r.turn(msgs, OK, prompt=drifted, start=lcp)
    samples = r.samples()
    assert len(samples) == 2 and r.manager.stats("s").forks
    for sample in samples:
        assert_aligned(sample)
        assert "routes_unknown_rows" not in sample.metadata


def test_siblings_retries_and_compaction_each_align_on_their_own_chain() -> None:
    r = Routed()
    r.turn([S, U], CALL)
    r.turn([S, U, CALL, tool("2")], OK)
    r.turn([S, U, CALL, tool("9")], assistant("nine"))  # a retried tool step: a sibling leaf
    r.turn([S, user("summary of the above")], assistant("continuing"), start=0)  # compaction: a new chain
    samples = r.samples()
    assert len(samples) == 3
    for sample in samples:
        assert_aligned(sample)
        assert "routes_unknown_rows" not in sample.metadata


def test_a_truncated_turn_is_continued_and_aligned() -> None:
    r = Routed()
    r.turn([S, U], OK, finish="length")
    r.turn([S, U, OK, user("go on")], assistant("more"))
    [sample] = r.samples()
    assert sample.metadata["truncated"] is False
    assert_aligned(sample)
    assert "routes_unknown_rows" not in sample.metadata


def test_an_abort_before_any_forward_pass_has_no_rows_and_says_so() -> None:
    r = Routed()
    first = r.turn([S, U], CALL)
    r.turn([S, U, CALL, tool("2")], OK, output="", finish="abort", routes=False, kept=False, weights=())
    [sample] = r.samples()
    held = len(first.prompt_ids) + len(first.output_ids)
    assert sample.metadata["routes_missing_turns"] == [{"turn": 1, "why": "aborted before any forward pass"}]
    assert sample.metadata["routes_unknown_rows"] == [[held - 1, len(sample.tokens) - 1]]
    assert_aligned(sample)


def test_turns_without_routes_give_samples_without_them() -> None:
    m = TrajectoryManager()
    s = SyntheticSession(m)
    s.turn([S, U], CALL)
    s.turn([S, U, CALL, tool("2")], OK)
    [sample] = m.samples("s", 1.0)
    assert sample.rollout_routed_experts is None and sample.rollout_top_p_token_ids is None
    assert sample.weight_versions == []
    data = sample.to_dict()
    assert set(data) == {"tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "metadata"}
    assert not channel_lines(sample)


def test_flat_routes_keep_every_id_in_one_layer_and_say_so() -> None:
    r = Routed()
    record = r.turn([S, U], OK)
    assert record.routes is not None
    flat = TurnRecord(record.prompt_ids, record.output_ids, routes=type(record.routes)(0, record.routes.rows))
    m = TrajectoryManager()
    m.record_turn("f", [S, U], OK, flat)
    [sample] = m.samples("f")
    assert sample.rollout_routed_experts is not None
    assert sample.rollout_routed_experts.shape == (len(sample.tokens) - 1, 1, LAYERS * TOP_K)
    assert "did not say layers x top_k" in sample.metadata["routes_layout"]


# ---- kept sets ---------------------------------------------------------------------------------------------


def test_kept_sets_are_csr_over_the_response_with_empty_spans_for_untrained_tokens() -> None:
    r = Routed()
    r.turn([S, U], CALL)
    r.turn([S, U, CALL, tool("2")], OK)
    r.turn([S, U, CALL, tool("9")], assistant("nine"))  # its leaf carries turn 0 as context (dedup)
    samples = r.samples()
    assert len(samples) == 2
    for sample in samples:
        ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
        assert ids is not None and offsets is not None
        assert len(offsets) == sample.response_length + 1 and offsets[0] == 0 and offsets[-1] == len(ids)
        first = sample.prompt_length
        spans = {i: (a, b) for i, (a, b) in enumerate(zip(offsets[:-1], offsets[1:], strict=True))}
        for i, trained in enumerate(sample.loss_mask):
            a, b = spans[i]
            token = sample.tokens[first + i]
            if trained:
                kept = ids[a:b].tolist()
                assert kept[0] == token and len(kept) >= 1  # the sampled token is among its kept ids
            else:
                assert a == b  # tool output, template tokens, a turn an earlier sample trains
    # The second leaf trains only turn 2: turn 0's tokens are context there, with empty spans.
    second = samples[1]
    assert second.metadata["trained_turns"] == [2]
    trained_positions = [i for i, m in enumerate(second.loss_mask) if m]
    assert second.rollout_top_p_token_offsets is not None
    with_sets = np.flatnonzero(np.diff(second.rollout_top_p_token_offsets)).tolist()
    assert with_sets == trained_positions


def test_a_trained_turn_without_kept_sets_gets_empty_spans_and_is_named() -> None:
    r = Routed()
    r.turn([S, U], CALL, kept=False)
    r.turn([S, U, CALL, tool("2")], OK)
    [sample] = r.samples()
    assert sample.metadata["top_p_missing_turns"] == [0]
    assert sample.rollout_top_p_token_offsets is not None
    assert len(sample.rollout_top_p_token_offsets) == sample.response_length + 1


# ---- weight versions ---------------------------------------------------------------------------------------


def test_one_weight_version_per_generated_turn_and_changes_inside_a_turn_are_kept() -> None:
    r = Routed()
    r.turn([S, U], CALL, weights=("v1",))
    r.turn([S, U, CALL, tool("2")], CALL, weights=("v1", "v2"))
    r.turn([S, U, CALL, tool("2"), CALL, tool("3")], OK, weights=("v2",))
    [sample] = r.samples()
    assert sample.weight_versions == ["v1", "v2", "v2"]
    [change] = sample.metadata["weight_version_changes"]
    assert change["turn"] == 1 and [s[0] for s in change["spans"]] == ["v1", "v2"]
    assert channel_lines(sample)[-1] == "  versions v1, v2 x2"


# ---- samples: checks, dicts, goldens ----------------------------------------------------------------------


def test_to_dict_and_from_dict_carry_the_channels_as_plain_lists() -> None:
    r = Routed()
    r.turn([S, U], CALL)
    r.turn([S, U, CALL, tool("2")], OK)
    [sample] = r.samples()
    data = sample.to_dict()
    assert isinstance(data["rollout_routed_experts"], list) and isinstance(data["rollout_routed_experts"][0][0], list)
    assert all(type(v) is int for v in data["rollout_top_p_token_ids"])
    assert data["weight_versions"] == ["v1", "v1"]
    back = Sample.from_dict(data)
    assert back == sample
    assert back.to_dict() == data


def test_a_sample_refuses_channels_that_do_not_fit_its_tokens() -> None:
    base: dict[str, Any] = {
        "tokens": [1, 2, 3, 4],
        "response_length": 2,
        "loss_mask": [1, 1],
        "rollout_log_probs": [0.0, 0.0],
    }
    Sample(**base, rollout_routed_experts=np.zeros((3, 2, 2), np.int16))
    with pytest.raises(ValueError, match=r"rollout_routed_experts .* expected \[3, layers, top_k\]"):
        Sample(**base, rollout_routed_experts=np.zeros((4, 2, 2), np.int16))
    with pytest.raises(ValueError, match="response_length \\+ 1 = 3"):
        Sample(**base, rollout_top_p_token_ids=np.array([5, 6]), rollout_top_p_token_offsets=np.array([0, 2]))
    with pytest.raises(ValueError, match="come together"):
        Sample(**base, rollout_top_p_token_ids=np.array([5]))
    with pytest.raises(ValueError, match="outside the"):
        TurnRecord([1, 2], [3], routes=routes_for([1, 2], [3, 4], 0))
    with pytest.raises(ValueError, match="kept sets for 2 tokens"):
        TurnRecord([1, 2], [3], kept=kept_for([3, 4]))


def test_goldens_pin_routes_by_shape_and_digest_and_show_nothing_without_channels() -> None:
    r = Routed()
    r.turn([S, U], OK)
    [sample] = r.samples()
    lines = render_sample_runs(0, sample, r.manager.linearize("s").spans[0], r.s.vocab.name)
    n = len(sample.tokens) - 1
    assert lines[1].startswith(f"  routes   {n}x{LAYERS}x{TOP_K} #")
    assert lines[2].startswith("  top-p    2 tokens with kept sets, 3 ids #")
    assert lines[3] == "  versions v1"
    # The digest moves with any route: one expert changed in one row.
    assert sample.rollout_routed_experts is not None
    changed = sample.rollout_routed_experts.copy()
    changed[1, 0, 0] += 1
    other = Sample.from_dict({**sample.to_dict(), "rollout_routed_experts": changed.tolist()})
    assert channel_lines(other)[0] != channel_lines(sample)[0]
