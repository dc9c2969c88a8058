"""Incremental encoding equals the full encoding; reasoning preservation removes the reasoning-drop fork."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.adapter_double import qwen3_output
from tests.adapter_support import HTTP_SCENARIOS, load_capture, running_stack
from tito_rl.trajectory.adapters.canonical import fold_system_messages, message
from tito_rl.trajectory.adapters.rendering.render import ChatRenderer, IncrementalEncoder
from tito_rl.trajectory.adapters.wires import anthropic, openai_chat, responses

WIRES = {"/v1/messages": anthropic, "/v1/chat/completions": openai_chat, "/v1/responses": responses}


@pytest.mark.parametrize("preserve", [True, False])
def test_incremental_encoding_equals_full_render_over_captured_sessions(qwen_tokenizer: Any, preserve: bool) -> None:
    renderer = ChatRenderer(qwen_tokenizer, preserve_reasoning=preserve)
    reused_total = 0
    for scenario in HTTP_SCENARIOS:
        encoder = IncrementalEncoder(renderer)
        for r in load_capture(scenario):
            if r.method != "POST":
                continue
            turn = WIRES[r.path].parse_request(json.loads(r.body))
            text = renderer.render(fold_system_messages(turn.messages), turn.tools)
            result = encoder.encode(text)
            assert result.ids == qwen_tokenizer.encode(text, add_special_tokens=False), scenario
            reused_total += result.reused
    assert reused_total > 100_000  # the captured follow-up turns really took the incremental path


def test_incremental_encoding_falls_back_when_history_is_rewritten(qwen_tokenizer: Any) -> None:
    renderer = ChatRenderer(qwen_tokenizer)
    encoder = IncrementalEncoder(renderer)
    base = [message("system", "S"), message("user", "hello wor")]
    first = encoder.encode(renderer.render(base, None))
    grown = renderer.render([*base, message("assistant", "hi"), message("user", "ld<|im_end|> again")], None)
    second = encoder.encode(grown)
    assert second.reused > 0 and second.ids == qwen_tokenizer.encode(grown, add_special_tokens=False)
    rewritten = renderer.render([message("system", "S2"), message("user", "hello world")], None)
    third = encoder.encode(rewritten)
    assert third.reused == 0 and third.ids == qwen_tokenizer.encode(rewritten, add_special_tokens=False)
    assert first.reused == 0


def test_decode_gives_transformers_text_for_outputs_specials_and_split_characters(qwen_tokenizer: Any) -> None:
    renderer = ChatRenderer(qwen_tokenizer)
    assert renderer._decoder is not None  # Qwen3 asks for no clean-up: the direct Rust call is the one taken
    output = qwen_tokenizer.encode(
        qwen3_output("Run it:  `ls  -la` , then déjà vu 文件 ✓.", "Plan , step"), add_special_tokens=False
    ) + [qwen_tokenizer.eos_token_id]
    split = qwen_tokenizer.encode("a🜲𓀀b", add_special_tokens=False)  # byte tokens: halves decode to U+FFFD
    assert len(split) > 4
    cases = [output, output[:-1], split, split[:2], split[1:-2], [], [151644, 151645, 151643, 151665, 151666]]
    for ids in cases:
        assert renderer.decode(ids) == qwen_tokenizer.decode(ids, skip_special_tokens=False), ids

    class CleaningTokenizer:  # a tokenizer that asks for clean-up keeps transformers' decode
        def __getattr__(self, name: str) -> Any:
            return getattr(qwen_tokenizer, name)

        clean_up_tokenization_spaces = True

        def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
            return "cleaned"

    cleaning = ChatRenderer(CleaningTokenizer())
    assert cleaning._decoder is None and cleaning.decode(output) == "cleaned"


async def _two_user_turns(tokenizer: Any, preserve: bool) -> Any:
    tools = [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}]
    async with running_stack(tokenizer, preserve_reasoning=preserve) as stack:
        stack.double.script += [qwen3_output("Answer one.", "Thinking about one."), "Answer two."]
        history: list[dict[str, Any]] = [{"role": "user", "content": "question one"}]
        async with aiohttp.ClientSession() as http:
            for question in ("question two", None):
                payload = {"model": "m", "max_tokens": 64, "system": "S", "tools": tools, "messages": history}
                async with http.post(
                    stack.url + "/v1/messages", json=payload, headers={"Authorization": "Bearer think"}
                ) as resp:
                    reply = await resp.json()
                if question:
                    history = [
                        *history,
                        {"role": "assistant", "content": reply["content"]},
                        {"role": "user", "content": question},
                    ]
        return stack.manager.stats("think")


async def test_reasoning_preservation_removes_the_reasoning_drop_fork(qwen_tokenizer: Any) -> None:
    dropped = await _two_user_turns(qwen_tokenizer, preserve=False)
    kept = await _two_user_turns(qwen_tokenizer, preserve=True)
    # Dropped reasoning: the first output no longer prefixes the second prompt; the manager must fork (long
    # outputs) or realign (short ones, as here), and the realign un-trains the first turn's tokens.
    assert sum(dropped.forks.values()) + dropped.realigns >= 1 and dropped.realigned_tokens > 0
    assert kept.forks == {} and kept.realigns == 0 and kept.samples == 1
    assert kept.trained_tokens > dropped.trained_tokens
