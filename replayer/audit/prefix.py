"""`prefix-break`: an engine prompt that does not extend the prompt and output it follows in its chain.

A session's chains are kept as heads: the ids of a call's prompt followed by its output. Each new prompt follows
the head it shares the longest prefix with; when it holds that head whole, it extends it (the clean case) and
takes its place. Otherwise, when the two part after the head's first message (a prompt that differs inside the
system message is another chain: a sub-agent, a side request), the prompt breaks the chain at the first differing
token, and the break is classified by what the text on both sides from there says:

- `retokenized`: the same text as other ids (history rendered from text, not the ids the model emitted);
- `stop-token`: the same once `<|im_end|>` / `<|endoftext|>` are set aside (one added, or removed);
- `separator`: the same once whitespace is set aside (the whitespace between turns changed);
- `reasoning-dropped`: the same once the held side's `<think>` blocks are set aside as well;
- `rewritten`: anything else (history changed, as compaction does).

The outputs on the head from the break on are recorded in `SessionState.breaks`, so coverage can say why their
tokens are not trained (a realign). An aborted call's output is not on its head: the agent never read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from tito_rl.replayer.audit.protocol import STOP_IDS, Example, Findings, Side, clip, decode
from tito_rl.replayer.audit.traffic import EMPTY, Call, Exchange, Finish, RuleFamily, SessionState, common_prefix

IM_END = 151645
THINK, END_THINK = 151667, 151668
MAX_HEADS = 8  # chains a session keeps (a parent and its sub-agents); the oldest goes first
WINDOW = 24  # tokens of each side an example shows
STOPS = re.compile(r"<\|im_end\|>|<\|endoftext\|>")
SPACE = re.compile(r"\s+")
THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)


@dataclass(eq=False)  # compared by identity: it holds arrays
class Head:
    ids: np.ndarray
    prompt_len: int
    outputs: list[tuple[int, int, int]] = field(default_factory=list)  # (call index, start, end) on this chain


def classify(held: np.ndarray, prompt: np.ndarray, at: int) -> str:
    """The kind of a break at token `at` (module docstring): what the whole rest of the held ids says first, and
    where several changes mix (reasoning dropped and a stop token echoed), what the first differing token is."""
    old = decode(held[at:])
    new = decode(prompt[at : at + len(held) - at + 64])
    if new.startswith(old):
        return "retokenized"
    if STOPS.sub("", new).startswith(STOPS.sub("", old)):
        return "stop-token"
    if SPACE.sub("", new).startswith(SPACE.sub("", old)):
        return "separator"
    # from the start of the think block the break lies in, so the whole block is seen on the held side
    opened = np.flatnonzero(held[: at + 1] == THINK)
    in_think = bool(len(opened)) and not (held[opened[-1] : at] == END_THINK).any()
    start = int(opened[-1]) if in_think else at
    old = _bare(THINK_BLOCK.sub("", decode(held[start:])))
    if in_think and _bare(THINK_BLOCK.sub("", decode(prompt[start : start + len(held) - start + 64]))).startswith(old):
        return "reasoning-dropped"
    if in_think:  # more changed after the dropped reasoning: the first difference still is the reasoning's
        closed = np.flatnonzero(held[start:] == END_THINK)
        after = _bare(decode(held[start + int(closed[0]) + 1 : start + int(closed[0]) + 17])) if len(closed) else ""
        if after and _bare(decode(prompt[start : start + 24])).startswith(after[:12]):
            return "reasoning-dropped"
    if int(held[at]) in STOP_IDS or int(prompt[at]) in STOP_IDS:
        return "stop-token"
    a, b = decode(held[at : at + 16]), decode(prompt[at : at + 16])
    blank = not decode(held[at : at + 1]).strip() or not decode(prompt[at : at + 1]).strip()
    if blank and a.strip()[:8] == b.strip()[:8]:
        return "separator"
    same = min(len(a), len(b)) - 4
    if same > 0 and a[:same] == b[:same]:
        return "retokenized"
    return "rewritten"


def _bare(text: str) -> str:
    return SPACE.sub("", STOPS.sub("", text))


class PrefixBreak(RuleFamily):
    rules = ("prefix-break",)

    def __init__(self, findings: Findings) -> None:
        self.findings = findings

    def call(self, state: SessionState, call: Call, prompt: np.ndarray | None) -> None:
        """Held until the call's exchange says whether it is a side request (its own chain, never judged)."""
        if prompt is not None and call.generates:
            state.notes.setdefault("prompts", []).append((call, prompt))

    def exchange(self, state: SessionState, exchange: Exchange) -> None:
        for call, prompt in state.notes.pop("prompts", []):
            if exchange.record is None or not exchange.record.side:
                self._follow(state, call, prompt)

    def finish(self, state: SessionState, finish: Finish) -> None:  # calls no agent exchange claimed (vcrpy)
        for call, prompt in state.notes.pop("prompts", []):
            self._follow(state, call, prompt)

    def _follow(self, state: SessionState, call: Call, prompt: np.ndarray) -> None:
        heads: list[Head] = state.notes.setdefault("heads", [])
        best, shared = None, -1
        for head in heads:
            n = common_prefix(head.ids, prompt)
            if n >= shared:
                best, shared = head, n
        output = call.output if call.generated else EMPTY
        outputs: list[tuple[int, int, int]] = []
        if best is not None and shared == len(best.ids):
            heads.remove(best)
            outputs = best.outputs
        elif best is not None and shared < len(prompt) and shared >= _first_message_end(best.ids):
            self._break(state, call, best, prompt, shared)
            outputs = [o for o in best.outputs if o[2] <= shared]
        if len(output):
            outputs = [*outputs, (call.index, len(prompt), len(prompt) + len(output))]
        heads.append(Head(np.concatenate([prompt, output]) if len(output) else prompt, len(prompt), outputs))
        del heads[:-MAX_HEADS]

    def _break(self, state: SessionState, call: Call, head: Head, prompt: np.ndarray, at: int) -> None:
        kind = classify(head.ids, prompt, at)
        for index, _start, end in head.outputs:
            if end > at:
                state.breaks[index] = kind
        example = None
        if self.findings.wants_example("prefix-break"):
            inside = next(
                (f"output token {at - s} of engine call {i}" for i, s, e in head.outputs if s <= at < e),
                f"prompt token {at} of the held ids",
            )
            example = Example(
                state.name,
                call.exchange,
                call.seq,
                at,
                f"{kind}: engine prompt diverges at token {at} from the prompt and output it follows ({inside})",
                [
                    Side("held", clip(decode(head.ids[at : at + WINDOW]))),
                    Side("engine prompt", clip(decode(prompt[at : at + WINDOW]))),
                ],
            )
        self.findings.add("prefix-break", state.name, 1, kind, example)


def _first_message_end(ids: np.ndarray) -> int:
    """Where the first message (the system prompt, as a rule) ends: a prompt differing before it is another chain."""
    ends = np.flatnonzero(ids == IM_END)
    return int(ends[0]) + 1 if len(ends) else len(ids)
