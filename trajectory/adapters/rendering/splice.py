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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tito_rl.trajectory.adapters.rendering.render import ChatRenderer
from tito_rl.trajectory.canonical import canonical_message
from tito_rl.trajectory.runtime.untracked import untrack

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
    routed: bool = False  # its answer held expert routes: a prompt spliced onto it need not ask for them again


def routes_from(turn: PriorTurn) -> int:
    """The first row a prompt spliced onto `turn` asks the engine's routes from: `turn`'s answer (and, by the same
    rule, the ones before it) holds the rows of its prompt and output but its last token's, which this prefill
    computes. 0 where `turn` had none."""
    return max(len(turn.prompt_ids) + len(turn.output_ids) - 1, 0) if turn.routed else 0


@dataclass(frozen=True)
class Splice:
    """One prompt's splice decision: the spliced ids, or None; with the reason a turn was refused, if one was."""

    ids: list[int] | None = None
    onto: int | None = None  # the turn spliced onto (or, with no ids, the one refused)
    refused: str = ""  # why the deepest turn this prompt continues was not spliced onto ("": it was, or none)
    continues: int | None = None  # the deepest held turn this prompt continues
    routes_from: int = 0  # the first position whose expert route this prompt's answer needs (`routes_from`)


NONE = Splice()


@dataclass
class _Held:
    turn: PriorTurn
    superseded: bool = False  # a later remembered turn continues it: not the tip of its chain


@dataclass(frozen=True)
class _LetGo:
    """A turn no longer held, by what a prompt continuing it shows: its reply after as many messages, and its
    render as the render's start (by length and hash: the text itself is let go)."""

    index: int
    messages: int
    reply: dict[str, Any]
    prompt_chars: int
    prompt_hash: int


class SpliceMemory:
    """Per session: the trained turns a later prompt may continue. The tip of every chain (a turn no later turn
    continues: the main thread's last turn while a sub-agent runs, say) is let go only after every superseded
    turn, so a long sub-agent does not push the main thread out. Superseded turns stay while there is room: a
    prompt whose deepest turn cannot be spliced falls back to an earlier one. A turn let go is remembered by its
    reply alone, so a prompt that continues it is named as not spliced rather than silently rendered. The held
    renders replace the ones the incremental encoder would otherwise have cached: about the same memory."""

    def __init__(self, capacity: int = 8, let_go: int = 256) -> None:
        self.capacity = capacity
        self._held: list[_Held] = []  # newest first
        self._let_go: deque[_LetGo] = deque(maxlen=let_go)

    def remember(self, turn: PriorTurn, continues: int | None = None) -> None:
        """`continues`: the index of the deepest held turn `turn`'s prompt continued (it is now superseded)."""
        for held in self._held:
            if held.turn.index == continues:
                held.superseded = True
        self._held.insert(0, _Held(turn))
        while len(self._held) > self.capacity:
            victim = next((h for h in reversed(self._held) if h.superseded), self._held[-1])
            self._held.remove(victim)
            gone = victim.turn
            self._let_go.appendleft(
                _LetGo(gone.index, len(gone.messages), gone.reply, len(gone.prompt_text), hash(gone.prompt_text))
            )

    def continued(self, messages: list[dict[str, Any]]) -> Iterator[tuple[PriorTurn, bool]]:
        """The held turns whose prompt messages, then an assistant message where their reply was, open
        `messages`, deepest first (newest first among equals); each with whether that message is the reply exactly
        as sent. Lazily: a splice usually takes the first, and each check compares a whole history."""
        for turn in sorted((h.turn for h in self._held), key=lambda t: len(t.messages), reverse=True):
            n = len(turn.messages)
            if n >= len(messages):
                continue
            echo = messages[n]
            exact = echo is turn.reply or echo == turn.reply
            if not exact and (
                echo.get("role") != "assistant" or canonical_message(echo) != canonical_message(turn.reply)
            ):
                continue
            if messages[:n] == turn.messages:
                yield turn, exact

    def let_go(self, messages: list[dict[str, Any]], text: str) -> int | None:
        """The deepest turn no longer held that `messages` (rendered as `text`) continue (None: none)."""
        best: _LetGo | None = None
        for gone in self._let_go:
            if gone.messages >= len(messages) or (best is not None and gone.messages <= best.messages):
                continue
            echo = messages[gone.messages]
            if (
                (echo is gone.reply or echo == gone.reply)
                and len(text) > gone.prompt_chars
                and hash(text[: gone.prompt_chars]) == gone.prompt_hash
            ):
                best = gone
        return None if best is None else best.index


class Splicer:
    """The session-independent part: the renderer, and the tokenizer's end-of-turn facts."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        tokenizer = renderer.tokenizer
        self.eos_id: int | None = tokenizer.eos_token_id
        self.eos_text: str | None = tokenizer.eos_token
        self.special_ids = set(renderer.special_ids)

    def splice(
        self, memory: SpliceMemory, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, text: str
    ) -> Splice:
        """`text`: the render of `messages` (what the prompt is when splicing is refused)."""
        if self.eos_id is None or not self.eos_text:
            return NONE
        deepest: int | None = None
        refused = ""
        for turn, exact in memory.continued(messages):  # deepest first: the next is an earlier turn of the history
            deepest = turn.index if deepest is None else deepest
            why = self._refusal(turn, exact, tools, text)
            if why:
                refused = refused or why
                continue
            end = text.index(self.eos_text, len(turn.prompt_text)) + len(self.eos_text)
            body = _without_eos(turn.output_ids, self.eos_id)
            tail = self.renderer.encode(text[end:])
            if refused:  # the rest, from the refused turn on, is the render
                refused = f"{refused}; spliced onto turn {turn.index}, rendered after it"
            ids = turn.prompt_ids.copy()  # one copy of the history, extended in place (not three)
            ids += body
            ids.append(self.eos_id)
            ids += tail
            return Splice(untrack(ids), turn.index, refused, deepest, routes_from(turn))
        if deepest is not None:
            return Splice(None, deepest, refused, deepest)
        gone = memory.let_go(messages, text)
        if gone is None:
            return NONE
        return Splice(
            None,
            gone,
            f"turn {gone}'s ids are no longer held (the session holds its last "
            f"{memory.capacity} turns, chain tips first)",
            gone,
        )

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
