"""Encoding line by line through the per-process cache gives exactly the whole text's ids, on text built from
what sits around the cut (newlines, spaces, punctuation, letters, digits, combining marks, separators that are
whitespace to one regex engine and not to another, special tokens), and shares lines between sessions."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tito_rl.trajectory.adapters.rendering.line_cache import LineCache, shared_line_cache
from tito_rl.trajectory.adapters.rendering.render import ChatRenderer
from tito_rl.trajectory.tokens.pieces import for_backend

FRAGMENTS = [
    "\n",
    "\n\n",
    "\r\n",
    " \n",
    "\n ",
    "\t",
    " ",
    "  ",
    "a",
    "Zeta",
    "ü",
    "e\u0301",
    "\u0301",
    "7",
    "42",
    ".",
    "...",
    '"',
    "'s",
    "'ll",
    "{",
    "}",
    "<",
    ">",
    "-",
    "#",
    "\u3000",
    "\x1c",
    "\x85",
    "\u2028",
    "漢字",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</tool_call>",
    "```",
    "\\n",
    "é",
]
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
def test_line_by_line_equals_the_whole_text(qwen_tokenizer: Any, text: str) -> None:
    backend = qwen_tokenizer._tokenizer
    pieces = for_backend(backend)
    for cache in (
        LineCache(backend),
        LineCache(backend, batch_lines=1),  # line by line, and new lines in a batch
        LineCache(backend, batch_lines=1, pieces=pieces),  # plain lines by their pieces
    ):
        assert cache.encode(text) == backend.encode(text, add_special_tokens=False).ids
        assert cache.encode(text) == backend.encode(text, add_special_tokens=False).ids  # from the cache this time


def test_a_long_new_text_is_encoded_in_one_batch_and_equals_the_whole_text(qwen_tokenizer: Any) -> None:
    """A tool result of hundreds of lines: its new lines go to the tokenizer in one batch call (spread over the
    cores); repeated and short lines, and lines already cached, come out in place."""
    backend = qwen_tokenizer._tokenizer
    calls: list[int] = []

    class Counting:
        def encode(self, text: str, add_special_tokens: bool) -> Any:
            calls.append(1)
            return backend.encode(text, add_special_tokens=add_special_tokens)

        def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> Any:
            calls.append(len(texts))
            return backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    cache = LineCache(Counting())
    cache.encode("def main():  # seen before\n")
    calls.clear()
    body = "".join(f"line {i % 150}: {'ü' * (i % 7)} value = {i * 37}\n" for i in range(300))
    text = "def main():  # seen before\n" + body + "}\n" + "x\n" * 3 + "tail without a newline"
    assert cache.encode(text) == backend.encode(text, add_special_tokens=False).ids
    assert calls == [300 + 3]  # one batch of every new line, short ones included; the cached line not in it
    calls.clear()
    assert cache.encode(text) == backend.encode(text, add_special_tokens=False).ids
    assert calls == [1, 1, 1, 1]  # all cached now but the short lines ("}" and "x" three times), encoded one by one


def test_sessions_share_lines_and_the_cache_stays_bounded(qwen_tokenizer: Any) -> None:
    backend = qwen_tokenizer._tokenizer
    system = "You are an agent." + "".join(
        f'\n{{"type": "function", "name": "tool{i}", "about": "{"x" * 80}"}}' for i in range(50)
    )
    cache = LineCache(backend)
    first = cache.encode(system + "\nSession one asks.")
    assert cache.misses == 52
    second = cache.encode(system + "\nSession two asks something else.")
    assert cache.misses == 53 and cache.hits == 51  # only its own last line was encoded
    assert first[:-4] == second[: len(first) - 4]
    assert second == backend.encode(system + "\nSession two asks something else.", add_special_tokens=False).ids
    small = LineCache(backend, max_tokens=300)
    assert small.encode(system) == backend.encode(system, add_special_tokens=False).ids
    assert 0 < small._tokens <= 300 and len(small._lines) < 51  # the oldest lines given up past the bound


def test_renderers_of_one_tokenizer_share_its_cache(qwen_tokenizer: Any) -> None:
    a, b = ChatRenderer(qwen_tokenizer, True), ChatRenderer(qwen_tokenizer, False)
    assert a._lines is b._lines is shared_line_cache(qwen_tokenizer) is not None
