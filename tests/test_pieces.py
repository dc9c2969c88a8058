"""Plain ASCII text encoded piece by piece (`tito_rl.trajectory.tokens.pieces`) gives exactly the Rust tokenizer's
ids: on text built from what Qwen2's split regex decides on (contractions in any case, letters after punctuation or
a space, digits, runs of spaces before a word or a line's end, punctuation runs ending in newlines, tabs), from
every printable ASCII character at random, added tokens among them, and on a long tool result; any other text is left
to the tokenizer."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from tito_rl.recorder.scripted.client import generated_output
from tito_rl.trajectory.adapters.rendering.line_cache import LineCache, shared_line_cache
from tito_rl.trajectory.tokens.pieces import PieceEncoder, for_backend

FRAGMENTS = [
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_response>", "<|fim_pad|>",
    "'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'Ll", "'d", "'x", "'",
    "a", "Zeta", "foo_bar", "camelCase", "x1", "7", "42", "3.14", "-", "--", ".", "...", ",", ":", ";", "!?",
    "(", ")", "[", "]", "{", "}", "<", ">", "</", "<|", "|>", "=", "==", "->", "#", "@", "$", "%", "^", "&", "*",
    "+", "/", "\\", "\\n", '"', "`", "```", "~", "_", "|",
    " ", "  ", "    ", "\t", " \t", "\n", "\n\n", " \n", "\n ", "\t\n", "  \n\n  ",
]  # fmt: skip
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join)


@pytest.fixture(scope="module")
def encoder(qwen_tokenizer: Any) -> PieceEncoder:
    found = for_backend(qwen_tokenizer._tokenizer)
    assert found is not None  # tito's tokenizer is Qwen2's pipeline
    return found


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_pieces_give_the_tokenizers_ids(encoder: PieceEncoder, text: str) -> None:
    ids = encoder.encode(text)
    assert ids is not None and ids == encoder.backend.encode(text, add_special_tokens=False).ids
    again = encoder.encode(text)  # from the piece cache this time
    assert again is not None and again == ids


def test_every_printable_character_at_random(encoder: PieceEncoder) -> None:
    rng = random.Random(40)
    alphabet = "\t\n" + "".join(map(chr, range(0x20, 0x7F)))
    for _ in range(400):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        ids = encoder.encode(text)
        assert ids is not None and ids == encoder.backend.encode(text, add_special_tokens=False).ids, text


def test_other_text_is_left_to_the_tokenizer(encoder: PieceEncoder) -> None:
    for text in ("caf\u00e9", "a\rb", "x\x0by", "\x1c", "tab\x7f"):
        assert encoder.encode(text) is None, text


def test_added_tokens_are_cut_out_first(encoder: PieceEncoder) -> None:
    for text in (
        "say <|im_end|> now",
        "<think>\nhm</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>\n<|im_start|>user\n",
        "a <tool_call>s b <tool_calls>",
        "<|im_start|><|im_start|> <<|endoftext|>>",
        "<|fim_prefix|><|fim_pad",
    ):
        ids = encoder.encode(text)
        assert ids is not None and ids == encoder.backend.encode(text, add_special_tokens=False).ids, text


def test_another_pipeline_gets_no_piece_encoder() -> None:
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert for_backend(bpe) is None
    bpe.normalizer = normalizers.Lowercase()
    assert for_backend(bpe) is None


def test_a_tool_result_through_the_line_cache_equals_the_whole_text(qwen_tokenizer: Any) -> None:
    backend = qwen_tokenizer._tokenizer
    cache = shared_line_cache(qwen_tokenizer)
    assert cache is not None and cache.pieces is not None  # the process's cache encodes plain lines by pieces
    result = generated_output("sid-1/Bash/0", 300) + "\n\u00fcber alles\n" + generated_output("sid-1/Bash/1", 80)
    fresh = LineCache(backend, pieces=for_backend(backend))
    assert fresh.encode(result) == backend.encode(result, add_special_tokens=False).ids
    assert list(fresh._lines) == [next(line for line in fresh._lines if not line.isascii())]  # plain ones not kept
    assert fresh.encode(result) == backend.encode(result, add_special_tokens=False).ids
