"""What-if replay: the recorded traffic under a candidate change, answered by "what does the golden diff say?".

A candidate is a chat template file, other parsers, another fork threshold, history rendered without
earlier reasoning, or rendered from text instead of spliced from the model's output ids (`--no-splice`).
Such a change usually changes the prompts, so a strict replay would stop at the first changed engine
request; `--engine-match order` instead serves each exchange its own recorded generation
(the k-th call gets the k-th answer) and reports every changed prompt as a warning with its first
divergence. The replay is then judged by the goldens alone. The same options exist on `tito replay`,
`tito diff` and the pytest plugin (there as `--tito-chat-template`, ... and ini keys): they are declared here
once, as data, so each front end registers them its own way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENGINE_MATCH = ("strict", "order")


@dataclass(frozen=True)
class Option:
    """One command-line option, declared once for argparse (`tito ...`) and pytest's `addoption` alike."""

    name: str  # its value's name (argparse dest); the flag is `--<prefix><name with dashes>`
    help: str
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    switch: bool = False  # store_true
    default: Any = None

    def flag(self, prefix: str = "") -> str:
        return f"--{prefix}{self.name.replace('_', '-')}"

    def add(self, add: Callable[..., Any], prefix: str = "", dest: str | None = None) -> None:
        """Register with `add` (argparse's `add_argument` or pytest's `addoption`)."""
        kwargs: dict[str, Any] = {"dest": dest or self.name, "help": self.help, "default": self.default}
        if self.switch:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(
                {
                    k: v
                    for k, v in (("metavar", self.metavar), ("type", self.type), ("choices", self.choices))
                    if v is not None
                }
            )
        add(self.flag(prefix), **kwargs)


OPTIONS: tuple[Option, ...] = (
    Option(
        "chat_template",
        "what-if: render prompts with this chat template (Jinja) instead of the tokenizer's",
        metavar="FILE",
    ),
    Option("reasoning_parser", "what-if: this sglang reasoning parser", metavar="NAME"),
    Option("tool_parser", "what-if: this sglang tool-call parser", metavar="NAME"),
    Option(
        "fork_threshold",
        "what-if: the manager's fork threshold (0: no realign, no rewrite merge)",
        metavar="TOKENS",
        type=int,
    ),
    Option(
        "no_preserve_reasoning",
        "what-if: render history as the template does, dropping earlier <think> blocks",
        switch=True,
        default=False,
    ),
    Option(
        "no_splice",
        "what-if: render the model's own history from text instead of splicing in its output ids",
        switch=True,
        default=False,
    ),
)
ENGINE_MATCH_OPTION = Option(
    "engine_match",
    "strict (default): a changed engine request is a difference; order: serve each exchange its "
    "recorded generation anyway, warn, and judge by the goldens",
    choices=ENGINE_MATCH,
    default="strict",
)


def options(engine_match: bool = True) -> tuple[Option, ...]:
    return OPTIONS + ((ENGINE_MATCH_OPTION,) if engine_match else ())


def register(add: Callable[..., Any], engine_match: bool = True, prefix: str = "") -> None:
    """Add the options with `add` (argparse's `add_argument` or pytest's `addoption`); `prefix` goes before
    each flag's name and its dest (`tito-`: `--tito-chat-template`, dest `tito_chat_template`)."""
    for option in options(engine_match):
        option.add(add, prefix, prefix.replace("-", "_") + option.name)


def overrides(get: Callable[[str], Any], prefix: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
    """(adapter overrides, manager overrides) from the options, read with `get(name)` (unprefixed names).

    Raises ValueError with a one-line reason when a template file cannot be read; `prefix` names the flags
    in it as the user typed them."""
    adapter: dict[str, Any] = {}
    manager: dict[str, Any] = {}
    template = get("chat_template")
    if template:
        try:
            adapter["chat_template"] = Path(template).read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"--{prefix}chat-template {template}: {exc.strerror or exc}") from None
    for name in ("reasoning_parser", "tool_parser"):
        if get(name):
            adapter[name] = get(name)
    if get("no_preserve_reasoning"):
        adapter["preserve_reasoning"] = False
    if get("no_splice"):
        adapter["splice"] = False
    if get("fork_threshold") is not None:
        if get("fork_threshold") < 0:
            raise ValueError(f"--{prefix}fork-threshold must be >= 0")
        manager["fork_threshold_tokens"] = get("fork_threshold")
    return adapter, manager


def engine_match_order(get: Callable[[str], Any]) -> bool:
    return bool(get("engine_match") == "order")
