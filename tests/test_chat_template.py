"""tito's Jinja environment renders as transformers' does, and its sandbox stops a template that reaches for
Python internals, both inside the renderer and through `tito replay --chat-template`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from tito_rl.trajectory.adapters.rendering.render import ChatRenderer
from tito_rl.trajectory.tokens import chat_template
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
CASSETTE = ROOT / "cassettes" / "drift_realign.tito"

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "Sé brief ✓"},
    {"role": "user", "content": '<list> & "quote"'},
    {
        "role": "assistant",
        "content": "ok",
        "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": {"path": "/ü", "n": [1, 2.5]}}}],
    },
    {"role": "tool", "content": "a\nb"},
]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "list <files>",
            "parameters": {"type": "object", "properties": {"p": {"type": "x"}}},
        },
    }
]
# Each exercises one part of the environment transformers sets up.
TEMPLATES = {
    "tojson": "{% for m in messages %}{{ m | tojson }}|{{ m | tojson(indent=2, sort_keys=true) }}{% endfor %}"
    "{{ tools | tojson(separators=(',', ':'), ensure_ascii=true) }}",
    "blocks": "{%- for m in messages %}\n  {% if m.role == 'tool' %}{% continue %}{% endif %}\n"
    "  <{{ m.role }}>{{ m.content }}\n{%- if loop.index > 2 %}{% break %}{% endif %}\n{% endfor %}\n"
    "{% if add_generation_prompt %}GO{% endif %}",
    "generation": "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]"
    "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}",
    "special_tokens": "{{ eos_token }}{{ pad_token }}{{ bos_token is defined }}{{ documents }}{{ tools | length }}",
    "namespace": "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    "{{ ns.n }}{{ strftime_now is defined }}{{ raise_exception is defined }}",
    "undefined": "{{ messages[0].missing }}|{{ messages[0].missing is defined }}|{{ custom_kwarg }}",
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_templates_render_as_transformers_renders_them(name: str) -> None:
    from transformers.utils.chat_template_utils import render_jinja_template

    tokenizer = load_tokenizer()
    kwargs = {**tokenizer.special_tokens_map, "custom_kwarg": "K"}
    # transformers annotates it `-> str`; it returns the renders and their generation indices
    expected, _ = cast(
        "tuple[list[str], list[Any]]",
        render_jinja_template(
            [MESSAGES], tools=list(TOOLS), chat_template=TEMPLATES[name], add_generation_prompt=True, **kwargs
        ),
    )
    got = chat_template.render(
        TEMPLATES[name],
        MESSAGES,
        TOOLS,
        add_generation_prompt=True,
        special_tokens=tokenizer.special_tokens_map,
        custom_kwarg="K",
    )
    assert got == expected[0]


def test_raise_exception_raises_a_template_error() -> None:
    with pytest.raises(chat_template.TemplateError, match="no system role here"):
        chat_template.render("{{ raise_exception('no system role here') }}", MESSAGES)


@pytest.mark.parametrize(
    "template",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ cycler.__init__.__globals__.os.system('touch pwned') }}",
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{% set x = messages.append({'role': 'user'}) %}",  # the environment is immutable: no mutating calls
    ],
)
def test_the_sandbox_refuses_python_internals(template: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(chat_template.SecurityError):
        chat_template.render(template, [dict(m) for m in MESSAGES])
    with pytest.raises(ValueError, match="reaches for Python internals"):
        ChatRenderer(load_tokenizer(), template=template)
    assert not (tmp_path / "pwned").exists()


def test_a_template_that_does_not_parse_is_refused() -> None:
    with pytest.raises(ValueError, match="does not parse"):
        ChatRenderer(load_tokenizer(), template="{% for m in messages %}")


def test_replay_with_a_hostile_template_file_exits_2_with_one_line(tmp_path: Path) -> None:
    for suffix in (".tito", ".golden"):
        shutil.copy(CASSETTE.with_suffix(suffix), tmp_path / CASSETTE.with_suffix(suffix).name)
    evil = tmp_path / "evil.jinja"
    evil.write_text("{{ cycler.__init__.__globals__.os.system('touch pwned') }}{{ messages[0].content }}")
    run = subprocess.run(
        [sys.executable, "-m", "tito_rl", "replay", str(tmp_path / CASSETTE.name), "--chat-template", str(evil)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and run.stderr.startswith("tito replay: ")
    assert "reaches for Python internals" in run.stderr and "unsafe" in run.stderr
    assert not (tmp_path / "pwned").exists()
