"""Chat templates rendered as transformers renders them, without importing transformers.

`apply_chat_template` in transformers (5.19, `utils/chat_template_utils.py`) compiles a template in Jinja's
`ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the `loopcontrols` extension and a
`{% generation %}` block tag, its own `tojson` filter (no HTML escaping; `ensure_ascii`, `indent`,
`separators`, `sort_keys`), and the globals `raise_exception` and `strftime_now`; it renders with `messages`,
`tools`, `documents` and `add_generation_prompt`, and the tokenizer's named special tokens (`bos_token`,
`eos_token`, ...) under the caller's keyword arguments. This module builds the same environment, so a
template renders to the same text; importing transformers costs about a second per process.

The sandbox is the point for a template from a file (`--chat-template`): attributes such as `__class__` are
undefined there, and using one raises `SecurityError` instead of running anything.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["SecurityError", "TemplateError", "compile_template", "render"]

TemplateError = jinja2.TemplateError


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`: marks assistant text for transformers' assistant masks, which
    tito never asks for; the body renders as it is (what transformers renders without the mask)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates call it with
    return datetime.now().strftime(format)


@lru_cache(maxsize=16)
def compile_template(template: str) -> jinja2.Template:
    """The compiled template; raises `TemplateSyntaxError` (a `TemplateError`) for a template that does not parse."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render(
    template: str,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = False,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """`template` applied to one conversation; `special_tokens`: the tokenizer's named special tokens, which
    `kwargs` override (as in transformers)."""
    return compile_template(template).render(
        messages=messages,
        tools=tools,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **{**(special_tokens or {}), **kwargs},
    )
