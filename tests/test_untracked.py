"""Token id and logprob lists stay out of the garbage collector's walks, and stay ordinary lists."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from tito_rl.trajectory.adapters.canonical import message
from tito_rl.trajectory.adapters.engine.generate import parse_generation
from tito_rl.trajectory.adapters.rendering.render import ChatRenderer, IncrementalEncoder
from tito_rl.trajectory.records import Sample, TurnRecord
from tito_rl.trajectory.runtime.untracked import available, untrack

pytestmark = pytest.mark.skipif(not available(), reason="lists cannot be untracked on this interpreter")


class Holder:
    """A tracked object that can sit in a cycle with a list."""

    def __init__(self) -> None:
        self.ref: Any = None


def _in_generations(values: list[Any]) -> bool:
    return any(o is values for g in range(3) for o in gc.get_objects(g))


def test_an_untracked_list_is_skipped_by_every_generation_and_stays_a_list() -> None:
    ids = [151644, 872, 198] * 1000
    assert gc.is_tracked(ids) and _in_generations(ids)
    assert untrack(ids) is ids
    assert not gc.is_tracked(ids) and not _in_generations(ids)
    ids.append(151645)
    ids[0] = 7
    ids += [1, 2]
    assert ids[:2] == [7, 872] and ids[-3:] == [151645, 1, 2] and len(ids) == 3003
    assert not gc.is_tracked(ids)  # mutating does not track it again
    gc.collect()  # a full pass with an untracked list around is harmless
    copy = ids + [3]
    assert gc.is_tracked(copy)  # a new list is an ordinary one
    # only lists are touched (a tuple is outside `untrack`'s declared bound, list)
    assert untrack(("a", "tuple")) == ("a", "tuple")  # type: ignore[type-var]


def test_cycles_through_tracked_objects_are_still_collected_around_untracked_lists() -> None:
    ids = untrack([1, 2, 3])
    a, b = Holder(), Holder()
    a.ref, b.ref = b, (a, ids)
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None and ids == [1, 2, 3]


def test_turn_records_and_samples_keep_their_lists_untracked() -> None:
    record = TurnRecord([1, 2, 3], [4, 151645], "stop", [-0.5, -0.1])
    assert not any(gc.is_tracked(v) for v in (record.prompt_ids, record.output_ids, record.output_log_probs))
    default = TurnRecord([1], [2, 3])
    assert default.output_log_probs == [0.0, 0.0] and not gc.is_tracked(default.output_log_probs)
    sample = Sample([1, 2, 3, 4], 2, [1, 1], [-0.5, -0.1])
    assert not any(gc.is_tracked(v) for v in (sample.tokens, sample.loss_mask, sample.rollout_log_probs))
    assert sample.to_dict()["tokens"] == [1, 2, 3, 4]


def test_prompts_from_the_encoder_are_untracked_full_and_incremental(qwen_tokenizer: Any) -> None:
    renderer = ChatRenderer(qwen_tokenizer)
    encoder = IncrementalEncoder(renderer)
    history = [message("system", "You are a coding agent."), message("user", "List the files.")]
    first = encoder.encode(renderer.render(history, None))
    history += [message("assistant", "Done."), message("user", "Now read README.md.")]
    second = encoder.encode(renderer.render(history, None))
    assert second.reused > 0  # the incremental path, which builds a new list
    for result in (first, second):
        assert not gc.is_tracked(result.ids)
    assert second.ids == qwen_tokenizer.encode(renderer.render(history, None), add_special_tokens=False)


def test_generations_parsed_from_the_engine_are_untracked() -> None:
    body = {
        "text": "hi",
        "output_ids": [6023, 151645],
        "meta_info": {
            "output_token_logprobs": [[-0.25, 6023, None], [None, 151645, None]],
            "finish_reason": {"type": "stop"},
            "prompt_tokens": 5,
            "cached_tokens": 0,
        },
    }
    gen = parse_generation("rid-1", body)
    assert gen.output_ids == [6023, 151645] and gen.output_log_probs == [-0.25, 0.0]
    assert not gc.is_tracked(gen.output_ids) and not gc.is_tracked(gen.output_log_probs)
