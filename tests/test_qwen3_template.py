"""The Python Qwen3 template renders exactly what the real Jinja template renders, and steps aside otherwise."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.adapter_support import HTTP_SCENARIOS, load_capture
from tito_rl.trajectory.adapters.canonical import fold_system_messages
from tito_rl.trajectory.adapters.rendering import qwen3_template
from tito_rl.trajectory.adapters.rendering.render import ChatRenderer
from tito_rl.trajectory.adapters.wires import anthropic, openai_chat, responses

WIRES = {"/v1/messages": anthropic, "/v1/chat/completions": openai_chat, "/v1/responses": responses}

# Text built from the fragments the template looks at, so generated cases reach every branch.
FRAGMENTS = [
    "<think>",
    "</think>",
    "\n",
    "\n\n",
    "<tool_response>",
    "</tool_response>",
    "a",
    "Ünïcode ✓",
    '"q"',
    "{x}",
    " ",
    "<|im_end|>",
]
text = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=False, width=16), text)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "b", "ü"]), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def tool_calls(draw: Any) -> list[dict[str, Any]]:
    calls = []
    for _ in range(draw(st.integers(1, 3))):
        function = {
            "name": draw(st.sampled_from(["Bash", "Read", "ü"])),
            "arguments": draw(st.one_of(text, st.dictionaries(st.sampled_from(["cmd", "n"]), json_value, max_size=2))),
        }
        calls.append({"type": "function", "function": function} if draw(st.booleans()) else function)
    return calls


@st.composite
def messages(draw: Any) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 9))):
        role = draw(st.sampled_from(["system", "user", "user", "assistant", "assistant", "tool", "tool", "developer"]))
        msg: dict[str, Any] = {"role": role, "content": draw(text)}
        if role == "user" and draw(st.booleans()):
            msg["content"] = "<tool_response>" + msg["content"] + "</tool_response>"
        if role == "assistant":
            reasoning = draw(st.one_of(st.just("absent"), st.none(), text))
            if reasoning != "absent":
                msg["reasoning_content"] = reasoning
            if draw(st.booleans()):
                msg["tool_calls"] = draw(tool_calls())
        out.append(msg)
    return out


tools: st.SearchStrategy[list[dict[str, Any]] | None] = st.one_of(
    st.none(),
    st.just([]),
    st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries({"name": text, "description": text, "parameters": json_value}),
            }
        ),
        min_size=1,
        max_size=3,
    ),
)


@pytest.fixture(
    scope="module",
    params=[(True, None), (False, None), (True, False), (False, True)],
    ids=["keep-reasoning", "drop-reasoning", "keep-no-thinking", "drop-thinking"],
)
def renderer(request: Any, qwen_tokenizer: Any) -> ChatRenderer:
    keep, thinking = request.param
    renderer = ChatRenderer(
        qwen_tokenizer,
        preserve_reasoning=keep,
        template_kwargs=None if thinking is None else {"enable_thinking": thinking},
    )
    assert renderer.native and renderer.preserves_reasoning == keep
    return renderer


def native(renderer: ChatRenderer, msgs: list[dict[str, Any]], tool_list: Any) -> str | None:
    return qwen3_template.render(
        msgs,
        tool_list or None,
        keep_reasoning=renderer.preserves_reasoning,
        enable_thinking=renderer.template_kwargs.get("enable_thinking"),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(msgs=messages(), tool_list=tools)
def test_python_template_equals_jinja_on_generated_conversations(
    renderer: ChatRenderer, msgs: Any, tool_list: Any
) -> None:
    text = native(renderer, msgs, tool_list)
    assert text is not None  # every generated case is one it covers: a silent fallback would prove nothing
    assert text == renderer.render_jinja(msgs, tool_list)


def test_python_template_equals_jinja_on_every_captured_request(renderer: ChatRenderer) -> None:
    rendered = 0
    for scenario in HTTP_SCENARIOS:
        for r in load_capture(scenario):
            if r.method != "POST":
                continue
            turn = WIRES[r.path].parse_request(json.loads(r.body))
            msgs = fold_system_messages(turn.messages)
            text = native(renderer, msgs, turn.tools)
            assert text is not None and text == renderer.render_jinja(msgs, turn.tools), scenario
            rendered += 1
    assert rendered > 20


def test_tool_blocks_are_cached_by_exact_json_type(renderer: ChatRenderer) -> None:
    """`True == 1 == 1.0` in Python but not in JSON: a cache keyed on `==` would reuse the wrong block."""
    msgs = [{"role": "user", "content": "hi"}]
    outputs = []
    for default in (True, 1, 1.0, True):
        tool = {"type": "function", "function": {"name": "f", "parameters": {"default": default}}}
        outputs.append(renderer.render(msgs, [tool]))
        assert outputs[-1] == renderer.render_jinja(msgs, [tool])
    assert '"default": true' in outputs[0] and '"default": 1}' in outputs[1] and '"default": 1.0' in outputs[2]
    assert outputs[3] == outputs[0]


def test_inputs_outside_the_transcription_go_to_jinja(renderer: ChatRenderer) -> None:
    odd: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": [{"type": "text", "text": "list content"}]}],
        [{"role": "user", "content": None}],
        [{"role": "assistant", "content": "x", "tool_calls": [{"function": {"name": None, "arguments": "{}"}}]}],
        [],
    ]
    for msgs in odd:
        assert native(renderer, msgs, None) is None
        try:
            expected: Any = renderer.render_jinja(msgs, None)
        except Exception as exc:  # noqa: BLE001 - the fallback must fail exactly as Jinja does
            expected = type(exc)
        try:
            got: Any = renderer.render(msgs, None)
        except Exception as exc:  # noqa: BLE001
            got = type(exc)
        assert got == expected


def test_any_other_template_is_rendered_by_jinja(qwen_tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    edited = qwen_tokenizer.chat_template.replace("# Tools", "# Functions")
    monkeypatch.setattr(qwen_tokenizer, "chat_template", edited)
    renderer = ChatRenderer(qwen_tokenizer)
    assert not renderer.native
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert "# Functions" in renderer.render([{"role": "user", "content": "hi"}], [tool])
