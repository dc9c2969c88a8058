"""What-if replay: the recorded traffic under a candidate change, answered by "what does the golden diff say?".

A candidate is a chat template file, other parsers, another fork threshold, history rendered without
earlier reasoning, or rendered from text instead of spliced from the model's output ids (`--no-splice`).
Such a change usually changes the prompts, so a strict replay would stop at the first changed engine
request; `--engine-match order` instead serves each exchange its own recorded generation
(the k-th call gets the k-th answer) and reports every changed prompt as a warning with its first
divergence. The replay is then judged by the goldens alone. The same options exist on `tito replay`,
`tito diff` and the pytest plugin: they are registered here once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

ENGINE_MATCH = ("strict", "order")


def register(add: Callable[..., Any], engine_match: bool = True) -> None:
    """Add the options with `add` (argparse's `add_argument` or pytest's `addoption`)."""
    add("--chat-template", metavar="FILE", default=None,
        help="what-if: render prompts with this chat template (Jinja) instead of the tokenizer's")
    add("--reasoning-parser", metavar="NAME", default=None, help="what-if: this sglang reasoning parser")
    add("--tool-parser", metavar="NAME", default=None, help="what-if: this sglang tool-call parser")
    add("--fork-threshold", metavar="TOKENS", type=int, default=None,
        help="what-if: the manager's fork threshold (0: no realign, no rewrite merge)")
    add("--no-preserve-reasoning", action="store_true", default=False,
        help="what-if: render history as the template does, dropping earlier <think> blocks")
    add("--no-splice", action="store_true", default=False,
        help="what-if: render the model's own history from text instead of splicing in its output ids")
    if not engine_match:
        return
    add("--engine-match", choices=ENGINE_MATCH, default="strict",
        help="strict (default): a changed engine request is a difference; order: serve each exchange its "
             "recorded generation anyway, warn, and judge by the goldens")


def overrides(get: Callable[[str], Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(adapter overrides, manager overrides) from the options, read with `get(name)`.

    Raises ValueError with a one-line reason when a template file cannot be read."""
    adapter: dict[str, Any] = {}
    manager: dict[str, Any] = {}
    template = get("chat_template")
    if template:
        try:
            adapter["chat_template"] = Path(template).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--chat-template {template}: {exc.strerror or exc}") from None
    for name in ("reasoning_parser", "tool_parser"):
        if get(name):
            adapter[name] = get(name)
    if get("no_preserve_reasoning"):
        adapter["preserve_reasoning"] = False
    if get("no_splice"):
        adapter["splice"] = False
    if get("fork_threshold") is not None:
        if get("fork_threshold") < 0:
            raise ValueError("--fork-threshold must be >= 0")
        manager["fork_threshold_tokens"] = get("fork_threshold")
    return adapter, manager


def engine_match_order(get: Callable[[str], Any]) -> bool:
    return get("engine_match") == "order"
