"""Golden rendering with the real Qwen3 tokenizer: decoded text, visible whitespace, collapsed context."""

from __future__ import annotations

from typing import Any

import pytest

from tito_rl.trajectory.golden import TokenizerNames, render_sample, render_samples
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.records import Sample, TurnRecord

IM_END, NEWLINE = 151645, 198
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def render(tok, messages) -> list[int]:
    return tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False)


@pytest.fixture(scope="module")
def session(qwen_tokenizer):
    tok = qwen_tokenizer
    m = TrajectoryManager()
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "List files."},
    ]
    call: dict[str, Any] = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}],
    }
    out1 = tok.encode('<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>') + [IM_END]
    p1 = render(tok, msgs)
    m.record_turn("s", msgs, call, TurnRecord(p1, out1, "stop", [-0.25] * len(out1)))
    msgs2 = msgs + [call, {"role": "tool", "content": "a.py"}]
    p2 = render(tok, msgs2)
    out2 = tok.encode("One file: a.py") + [IM_END]
    m.record_turn(
        "s", msgs2, {"role": "assistant", "content": "One file: a.py"}, TurnRecord(p2, out2, "stop", [-0.5] * len(out2))
    )
    return m, p1, out1, p2, out2


def test_real_session_is_clean_and_newline_after_stop_is_context(session, qwen_tokenizer) -> None:
    m, p1, out1, p2, out2 = session
    assert p2[: len(p1) + len(out1) + 1] == p1 + out1 + [NEWLINE]  # the template's `<|im_end|>\n`
    (sample,) = m.samples("s", 1.0)
    assert sample.tokens == p2 + out2
    assert m.stats("s").forks == {}
    newline_at = len(p1) + len(out1) - sample.prompt_length
    assert sample.loss_mask[newline_at - 1 : newline_at + 1] == [1, 0]


def test_real_tokenizer_golden(session, qwen_tokenizer) -> None:
    m, *_ = session
    text = render_samples(m.samples("s", 1.0), TokenizerNames(qwen_tokenizer), collapse_context=6)
    assert text == (
        "#0 reward=1 response=41 trained=26 turns=0,1\n"
        '<|im_start|> «145 #1fc2a296» ↵ | [<tool_call>] [↵] [{"] [name] [":] [·"] [B] [ash] [",] [·"]'
        ' [arguments] [":] [·{"] [command] [":] [·"] [ls] ["}}↵] [</tool_call>] [<|im_end|>] ↵ «13 #6d13442d» ↵'
        " [One] [·file] [:] [·a] [.py] [<|im_end|>]"
    )


def test_collapsed_rendering_keeps_trained_span_boundaries_and_lengths() -> None:
    tokens = list(range(100))
    loss = [1] * 10 + [0] * 50 + [1] * 20
    s = Sample(tokens=tokens, response_length=80, loss_mask=loss, rollout_log_probs=[-1.0] * 80)
    text = render_sample(s, str, collapse_context=4, collapse_trained=8)
    assert (
        text
        == "0 «18 #"
        + text.split("#")[1].split("»")[0]
        + "» 19 | [20 21 22 … 27 28 29](10) 30 «48 #"
        + text.split("#")[2].split("»")[0]
        + "» 79 [80 81 82 … 97 98 99](20)"
    )
