"""A semantic token vocabulary and a toy chat template, for goldens a reviewer can read at a glance.

Tokens are names such as `<sys>`, `user:compute`, `r:call`, `</ast>`: one word of a message becomes one
token tagged by its role. The template mimics the Qwen3 behaviours that cause drift (the newline after
the stop token, reasoning dropped from assistant turns before the last user message), so every
manager rule can be exercised without a real tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.canonical import canonical_arguments, canonical_content
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.records import TurnRecord

STRUCTURAL = (
    "<sys>",
    "</sys>",
    "<usr>",
    "</usr>",
    "<tool>",
    "</tool>",
    "<gen>",
    "</ast>",
    "<nl>",
    "<think>",
    "</think>",
    "<DRIFT>",
)


@dataclass
class SemanticVocab:
    """Names <-> ids; ids are assigned in order of first use, so a test's ids are deterministic."""

    names: list[str] = field(default_factory=lambda: list(STRUCTURAL))
    ids: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.ids = {name: i for i, name in enumerate(self.names)}

    def id(self, name: str) -> int:
        found = self.ids.get(name)
        if found is None:
            found = self.ids[name] = len(self.names)
            self.names.append(name)
        return found

    def encode(self, text: str) -> list[int]:
        """Space-separated token names to ids: `"<usr> user:hi </usr>"`."""
        return [self.id(name) for name in text.split()]

    def name(self, token_id: int) -> str:
        return self.names[token_id] if 0 <= token_id < len(self.names) else f"<unk:{token_id}>"

    def decode(self, ids: list[int]) -> str:
        return " ".join(self.name(i) for i in ids)


@dataclass
class ToyTemplate:
    vocab: SemanticVocab
    eot_newline: bool = True  # like Qwen3: the template writes `<|im_end|>\n`, the model stops at `<|im_end|>`
    drop_old_reasoning: bool = True  # like Qwen3: no <think> for assistant turns before the last user message

    def words(self, prefix: str, text: Any) -> list[str]:
        text = canonical_content(text)  # one text block or a plain string render alike, as in real templates
        return [f"{prefix}:{w}" for w in (text or "").split()]

    def assistant_body(self, message: dict[str, Any], keep_reasoning: bool = True) -> list[str]:
        out: list[str] = []
        if keep_reasoning and message.get("reasoning_content"):
            out += ["<think>", *self.words("think", message["reasoning_content"]), "</think>"]
        out += self.words("r", message.get("content"))
        for call in message.get("tool_calls") or []:
            fn = call.get("function", call)
            out.append(f"call:{fn['name']}")
            args = canonical_arguments(fn.get("arguments")) or {}
            out += [f"arg:{k}={v}" for k, v in args.items()]
        return out + ["</ast>"]

    def reply_ids(self, message: dict[str, Any]) -> list[int]:
        """What the model emits for a reply: its body and the stop token `</ast>`."""
        return self.vocab.encode(" ".join(self.assistant_body(message)))

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
        out: list[str] = []
        for i, m in enumerate(messages):
            role = m["role"]
            if role == "system":
                out += ["<sys>", *self.words("system", m.get("content")), "</sys>"]
            elif role == "user":
                out += ["<usr>", *self.words("user", m.get("content")), "</usr>"]
            elif role == "tool":
                out += ["<tool>", *self.words("tool", m.get("content")), "</tool>"]
            elif role == "assistant":
                keep = not self.drop_old_reasoning or i > last_user
                out += ["<gen>", *self.assistant_body(m, keep)]
                if self.eot_newline:
                    out.append("<nl>")
            else:
                raise ValueError(f"unknown role {role!r}")
        if add_generation_prompt:
            out.append("<gen>")
        return self.vocab.encode(" ".join(out))


def logprobs_for(ids: list[int], turn: int) -> list[float]:
    """Deterministic, distinguishable logprobs: turn t, position k -> -(t + 1) - k/100."""
    return [round(-(turn + 1) - k / 100, 2) for k in range(len(ids))]


@dataclass
class SyntheticSession:
    """Drives a manager like an adapter would: render the prompt, 'generate' the reply, record the turn."""

    manager: TrajectoryManager
    session_id: str = "s"
    template: ToyTemplate = field(default_factory=lambda: ToyTemplate(SemanticVocab()))
    turns: int = 0

    @property
    def vocab(self) -> SemanticVocab:
        return self.template.vocab

    def turn(
        self,
        messages: list[dict[str, Any]],
        reply: dict[str, Any],
        *,
        prompt: str | None = None,
        output: str | None = None,
        finish_reason: str = "stop",
        logprobs: list[float] | None = None,
        ill_formed: bool = False,
    ) -> TurnRecord:
        """Record one turn. `prompt`/`output` override the rendered ids (named tokens), to inject drift."""
        prompt_ids = self.vocab.encode(prompt) if prompt is not None else self.template.render(messages)
        output_ids = self.vocab.encode(output) if output is not None else self.template.reply_ids(reply)
        if finish_reason == "length" and output is None:
            output_ids = output_ids[:-1]
        record = TurnRecord(
            prompt_ids=prompt_ids,
            output_ids=output_ids,
            finish_reason=finish_reason,
            output_log_probs=logprobs if logprobs is not None else logprobs_for(output_ids, self.turns),
            ill_formed=ill_formed,
        )
        self.turns += 1
        self.manager.record_turn(self.session_id, messages, reply, record)
        return record


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def tool(text: str, call_id: str = "") -> dict[str, Any]:
    return {"role": "tool", "content": text, "tool_call_id": call_id}


def assistant(text: str = "", *calls: tuple[str, dict[str, Any]], reasoning: str = "") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return message
