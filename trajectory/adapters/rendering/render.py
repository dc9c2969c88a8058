"""Chat-template rendering, and encoding that reuses the previous turn's ids when the text only grew.

Re-tokenising the whole history every turn is quadratic per trajectory (reference issue #2285). An agent
turn's render usually extends the previous render as text, so only the new suffix needs encoding. The cut
is placed at the start of the last special token of the previous render: special tokens are split out of
the text before BPE, so no token can straddle that point, and ids before it are exactly the full encoding's.
When the new text does not extend any cached render (history rewritten, reasoning dropped), it is a full
encode.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from tito_rl.trajectory.adapters.rendering import qwen3_template
from tito_rl.trajectory.adapters.rendering.line_cache import shared_line_cache
from tito_rl.trajectory.runtime.untracked import untrack

# Qwen3-style templates drop reasoning of assistant turns before the last user query; this is the test.
_REASONING_WINDOW = "loop.index0 > ns.last_query_index"


class ChatRenderer:
    """Renders canonical messages with a Hugging Face tokenizer's chat template (generation prompt added).

    Jinja templates render in transformers' sandboxed environment, rebuilt in `trajectory.tokens.chat_template`
    (Jinja is imported only when a template needs it: the Qwen3 one renders natively). A Jinja template is checked
    here: one that does not parse, or that reaches for Python internals on a plain conversation, is refused
    (ValueError); one that does so only on some input fails that render with `SecurityError`."""

    def __init__(
        self,
        tokenizer: Any,
        preserve_reasoning: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        template: str | None = None,
    ) -> None:
        """`template`: a chat template to use instead of the tokenizer's (a candidate under test)."""
        self.tokenizer = tokenizer
        self.template: str = template or tokenizer.chat_template
        original = self.template
        if not self.template:
            raise ValueError("the tokenizer has no chat template")
        self.template_kwargs = dict(template_kwargs or {})
        self.preserves_reasoning = False
        if preserve_reasoning and _REASONING_WINDOW in self.template:
            # Keep every assistant turn's <think> block, so history renders as it was generated.
            self.template = self.template.replace(_REASONING_WINDOW, f"(tito_keep_reasoning or {_REASONING_WINDOW})")
            self.template_kwargs["tito_keep_reasoning"] = True
            self.preserves_reasoning = True
        # The exact Python transcription of the template, when it is the Qwen3 one (Jinja otherwise).
        self.native = qwen3_template.is_qwen3_template(original)
        self.special_tokens: dict[str, str] = dict(getattr(tokenizer, "special_tokens_map", None) or {})
        if template is not None or not self.native:
            self._check_template()
        self._backend = getattr(tokenizer, "_tokenizer", None)  # the Rust tokenizer: no Python per-call cost
        self._lines = shared_line_cache(tokenizer)  # lines already encoded in this process, where exact
        # transformers' decode is the Rust one plus input conversion and, where a tokenizer asks for it, a
        # clean-up of spaces; without the clean-up, the Rust call alone gives the same text at half the cost.
        self._decoder = None if getattr(tokenizer, "clean_up_tokenization_spaces", True) else self._backend
        self.special_ids = {tokenizer.convert_tokens_to_ids(t): t for t in tokenizer.all_special_tokens}

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        if self.native:
            text = qwen3_template.render(
                messages,
                tools or None,
                keep_reasoning=self.preserves_reasoning,
                enable_thinking=self.template_kwargs.get("enable_thinking"),
            )
            if text is not None:
                return text
        return self.render_jinja(messages, tools)

    def render_jinja(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        from tito_rl.trajectory.tokens import chat_template

        return chat_template.render(
            self.template,
            messages,
            tools or None,
            add_generation_prompt=True,
            special_tokens=self.special_tokens,
            **self.template_kwargs,
        )

    def _check_template(self) -> None:
        from tito_rl.trajectory.tokens import chat_template

        try:
            chat_template.compile_template(self.template)
        except chat_template.TemplateError as exc:
            raise ValueError(f"the chat template does not parse: {exc}") from None
        try:
            self.render_jinja([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], None)
        except chat_template.SecurityError as exc:
            raise ValueError(
                f"the chat template reaches for Python internals, which its sandbox refuses: {exc}"
            ) from None
        except Exception:  # noqa: BLE001 - a template may refuse this conversation; real requests will show
            pass

    def encode(self, text: str) -> list[int]:
        if self._lines is not None:
            return untrack(self._lines.encode(text))
        if self._backend is not None:
            return untrack(self._backend.encode(text, add_special_tokens=False).ids)
        return untrack(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        decoder = self._decoder if self._decoder is not None else self.tokenizer
        text: str = decoder.decode(ids, skip_special_tokens=False)
        return text


@dataclass
class _Render:
    text: str
    ids: list[int]


@dataclass
class EncodeResult:
    ids: list[int]
    reused: int  # leading ids taken from a previous render without encoding


class IncrementalEncoder:
    """Per session: encodes renders, reusing the longest cached render that the new text extends."""

    def __init__(self, renderer: ChatRenderer, capacity: int = 8) -> None:
        self.renderer = renderer
        self._cache: deque[_Render] = deque(maxlen=capacity)  # sub-agents and side chains keep their own

    def encode(self, text: str) -> EncodeResult:
        best = max((r for r in self._cache if text.startswith(r.text)), key=lambda r: len(r.text), default=None)
        result = self._extend(best, text) if best is not None else None
        if result is None:
            result = EncodeResult(self.renderer.encode(text), 0)
        self._cache.append(_Render(text, result.ids))
        return result

    def _extend(self, prev: _Render, text: str) -> EncodeResult | None:
        cut, token = _last_special(prev.text, self.renderer.special_ids.values())
        if token is None:
            return None
        token_id = self.renderer.tokenizer.convert_tokens_to_ids(token)
        index = _last_index(prev.ids, token_id)
        if index is None:
            return None
        suffix = self.renderer.encode(text[cut:])
        if not suffix or suffix[0] != token_id:
            return None
        return EncodeResult(untrack(prev.ids[:index] + suffix), index)


def _last_special(text: str, specials: Any) -> tuple[int, str | None]:
    best, token = -1, None
    for s in specials:
        pos = text.rfind(s, max(best, 0))
        if pos > best:
            best, token = pos, s
    return best, token


def _last_index(ids: list[int], value: int) -> int | None:
    for i in range(len(ids) - 1, -1, -1):
        if ids[i] == value:
            return i
    return None
