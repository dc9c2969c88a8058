"""Differences from the real engine the fake engine keeps on purpose, each with its reason.

docs/engine-dialects.md ("The contract", "Left out") names each by its key; a test holds the page to this list.
A difference is left out only where its predicate says so for that request, so the same kind of difference
anywhere else still fails the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tito_rl.recorder.engine_contract.answers import Exchange
from tito_rl.recorder.engine_contract.exchange import DONE
from tito_rl.recorder.engine_contract.requests import FULL

THINK_END_ID = 151668  # </think> in the Qwen3 tokenizer


@dataclass(frozen=True)
class LeftOut:
    key: str
    reason: str
    applies: Callable[[Exchange, str], bool]


def _output_ids(exchange: Exchange) -> list[int]:
    answer = exchange.answer
    bodies = [c for c in answer.chunks if c != DONE] if answer.streamed else [answer.body]
    ids: list[int] = []
    for body in bodies:
        for choice in (body or {}).get("choices") or [] if isinstance(body, dict) else []:
            if isinstance(choice, dict) and isinstance(choice.get("token_ids"), list):
                ids += choice["token_ids"]
    return ids


def _unclosed_thinking(exchange: Exchange, line: str) -> bool:
    body = exchange.request.body or {}
    kwargs = body.get("chat_template_kwargs") or {}
    thinking = not (isinstance(kwargs, dict) and kwargs.get("enable_thinking") is False)
    return (
        exchange.request.mode == FULL
        and exchange.request.path == "/v1/chat/completions"
        and thinking
        and THINK_END_ID not in _output_ids(exchange)
        and any(part in line for part in (".reasoning:", ".content:", "reasoning_tokens"))
    )


LEFT_OUT = (
    LeftOut(
        "unclosed-thinking",
        "vLLM 0.32's qwen3 reasoning parser reads a thinking-mode answer with no `</think>` as all reasoning "
        "(content null). The fake engine reads it as content: a scripted turn without reasoning has no think "
        "block at all, where a real Qwen3 always opens one; emulating it would turn every such scripted reply "
        "into reasoning. With `</think>` in the answer, both split it alike.",
        _unclosed_thinking,
    ),
    LeftOut(
        "one-port-every-dialect",
        "SGLang's `/generate` answers on the fake engine however it is started (vLLM answers 404): one fake "
        "engine serves the targets of every dialect, and `tito check-engine` reports each dialect it finds.",
        lambda exchange, line: exchange.request.path == "/generate",
    ),
)


def left_out_for(exchange: Exchange, line: str) -> LeftOut | None:
    return next((rule for rule in LEFT_OUT if rule.applies(exchange, line)), None)
