"""Splicing: a prompt built from the ids the model generated, wherever its own history comes back unchanged.

Rendering history from text re-tokenises the model's output canonically: a non-canonical split the engine
sampled (`shared/notes/qwen3-tokenizer-drift.md`) comes back as other ids, so the next prompt is not what the
model generated (off-policy context) and the manager can only realign, masking the drifted reply. Instead,
when a request's messages are an earlier turn's prompt messages followed by that turn's reply exactly as sent
(the dict `EchoMemory` restored: message identity as the manager routes it, reasoning included), the prompt is
that turn's prompt ids + its output ids + the encoding of only what the template renders after the reply:
the end of the turn (`\\n` after `<|im_end|>`; `<|im_end|>\\n` after a reply cut by `length`, which has no
`<|im_end|>`), tool results, user text, the generation prompt. The text after the end-of-turn marker is encoded
on its own: special tokens are split before BPE, so its ids are exactly the full encode's.

Splicing is refused, with the reason, wherever it cannot be proven to give the context the template means:
- the client's echo of the reply is the same message to the manager but another dict (it rewrote it);
- the render of the earlier prompt is not a text prefix of the new render (context rendered differently,
  e.g. the empty think block of `enable_thinking=False` gone from history);
- the template renders the reply otherwise than the model's text *and* otherwise than it renders it as
  ongoing history (reasoning dropped on purpose: `--no-preserve-reasoning` once a new user message comes);
- no end-of-turn marker follows the reply, the reply spells one itself, or ended on another special token.
Text the template merely normalises (whitespace around `<think>`, tool-call JSON spacing) is not a refusal:
that reply is the model's own output, kept as its ids.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from trajectory.adapters.render import ChatRenderer
from trajectory.canonical import canonical_message
from trajectory.untracked import untrack

# The message appended after a reply to render it as ongoing history: a tool result is not a new user query,
# so Qwen-style templates keep the reply's reasoning, and the reply is not the last message either.
_PROBE = {"role": "tool", "content": ""}


@dataclass
class PriorTurn:
    """A trained turn the session may splice onto: what was rendered, sent and generated."""

    index: int  # the manager's turn index
    messages: list[dict[str, Any]]  # the prompt messages as rendered (echoes restored, system folded)
    reply: dict[str, Any]  # the reply message sent, as the manager recorded it
    prompt_text: str  # the render those messages gave (generation prompt included)
    prompt_ids: list[int]  # the ids sent to the engine (themselves spliced or rendered)
    output_ids: list[int]
    decoded: str | None = None  # the output's text without a trailing end-of-turn token (filled on first use)
    as_history: str | None = None  # the reply as the template renders it as ongoing history (None: unknown)
    history_rendered: bool = False  # `as_history` was tried


@dataclass(frozen=True)
class Splice:
    """One prompt's splice decision: the spliced ids, or None with the reason an earlier turn was refused."""

    ids: list[int] | None = None
    onto: int | None = None  # the turn spliced onto, or refused
    refused: str = ""  # "" when spliced, or when no earlier turn is continued at all


NONE = Splice()


class SpliceMemory:
    """Per session: the last trained turns (sub-agents and the main thread alternate, so more than one). Their
    renders replace the ones the incremental encoder would otherwise have cached: about the same memory."""

    def __init__(self, capacity: int = 8) -> None:
        self._turns: deque[PriorTurn] = deque(maxlen=capacity)

    def remember(self, turn: PriorTurn) -> None:
        self._turns.appendleft(turn)

    def continued(self, messages: list[dict[str, Any]]) -> tuple[PriorTurn, bool] | None:
        """The latest turn whose prompt messages, then an assistant message where its reply was, open
        `messages` (the deepest such turn); with whether that message is the reply exactly as sent."""
        best: tuple[PriorTurn, bool] | None = None
        for turn in self._turns:
            n = len(turn.messages)
            if n >= len(messages) or (best is not None and n <= len(best[0].messages)):
                continue
            echo = messages[n]
            exact = echo is turn.reply or echo == turn.reply
            if not exact and (echo.get("role") != "assistant"
                              or canonical_message(echo) != canonical_message(turn.reply)):
                continue
            if messages[:n] == turn.messages:
                best = (turn, exact)
        return best


class Splicer:
    """The session-independent part: the renderer, and the tokenizer's end-of-turn facts."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        tokenizer = renderer.tokenizer
        self.eos_id: int | None = tokenizer.eos_token_id
        self.eos_text: str | None = tokenizer.eos_token
        self.special_ids = set(renderer.special_ids)

    def splice(self, memory: SpliceMemory, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
               text: str) -> Splice:
        """`text`: the render of `messages` (what the prompt is when splicing is refused)."""
        found = memory.continued(messages)
        if found is None or self.eos_id is None or not self.eos_text:
            return NONE
        turn, exact = found
        refused = self._refusal(turn, exact, tools, text)
        if refused:
            return Splice(None, turn.index, refused)
        end = text.index(self.eos_text, len(turn.prompt_text)) + len(self.eos_text)
        body = _without_eos(turn.output_ids, self.eos_id)
        tail = self.renderer.encode(text[end:])
        return Splice(untrack(turn.prompt_ids + body + [self.eos_id] + tail), turn.index)

    def _refusal(self, turn: PriorTurn, exact: bool, tools: list[dict[str, Any]] | None, text: str) -> str:
        """Why splicing onto `turn` is not safe; "" when it is."""
        k = turn.index
        if not exact:
            return f"the client's echo of turn {k}'s reply differs from the reply sent"
        start = len(turn.prompt_text)
        if not text.startswith(turn.prompt_text):
            return f"turn {k}'s prompt no longer renders as a prefix of this one (earlier history rendered otherwise)"
        assert self.eos_text is not None and self.eos_id is not None
        body = _without_eos(turn.output_ids, self.eos_id)
        if body and body[-1] in self.special_ids:
            return f"turn {k}'s output ends on a special token other than the end of turn"
        if turn.decoded is None:
            turn.decoded = self.renderer.decode(body)
        if self.eos_text in turn.decoded:
            return f"turn {k}'s output spells the end-of-turn marker"
        end = text.find(self.eos_text, start)
        if end < 0:
            return f"no end-of-turn marker after turn {k}'s reply in the render"
        region = text[start:end]
        if region == turn.decoded:
            return ""  # the render is the model's text: only the ids may differ (drift)
        if not turn.history_rendered:
            turn.as_history, turn.history_rendered = self._as_history(turn, tools), True
        if turn.as_history is None:
            return f"the template renders turn {k}'s reply otherwise than the model's text, and cannot be checked"
        if region != turn.as_history:
            return f"the template renders turn {k}'s reply otherwise than as ongoing history (e.g. reasoning dropped)"
        return ""  # the template normalises the text (whitespace, JSON spacing); the model's ids are kept

    def _as_history(self, turn: PriorTurn, tools: list[dict[str, Any]] | None) -> str | None:
        """The reply's region as the template renders it with only a tool result after it (None: unknown)."""
        assert self.eos_text is not None
        try:
            text = self.renderer.render([*turn.messages, turn.reply, _PROBE], tools)
        except Exception:  # noqa: BLE001 - a template that rejects the probe: the reply cannot be checked
            return None
        start = len(turn.prompt_text)
        end = text.find(self.eos_text, start) if text.startswith(turn.prompt_text) else -1
        return text[start:end] if end >= 0 else None


def _without_eos(output_ids: list[int], eos_id: int) -> list[int]:
    return output_ids[:-1] if output_ids and output_ids[-1] == eos_id else output_ids
