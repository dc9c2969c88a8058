"""Engine text -> reasoning, content and tool calls, with sglang's own parsers, in this process.

sglang is loaded lazily and once, through `sglang_loader` (without sglang's serving runtime). Using the production
parsers (not a re-implementation) keeps the adapter's view of model output identical to what an SGLang OpenAI
server would report. `output_parser.OutputParser` asks the helper process first (`parser_process`), which runs
this same code on the same text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers
from tito_rl.trajectory.adapters.value_cache import ValueCache


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text as the parser re-serialised it

    def arguments_dict(self) -> dict[str, Any]:
        value = json.loads(self.arguments) if self.arguments else {}
        return value if isinstance(value, dict) else {"value": value}


@dataclass
class ParsedOutput:
    reasoning: str
    content: str
    tool_calls: list[ParsedCall] = field(default_factory=list)
    ill_formed: bool = False  # tool-call markup the parser could not read (kept as text, never dropped)


class SglangParsers:
    """Splits decoded model output the way the configured sglang parsers do, here."""

    def __init__(self, reasoning_parser: str | None = "qwen3", tool_parser: str | None = "qwen25") -> None:
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        self._tool_models: ValueCache[list[Any]] = ValueCache()  # validating Claude Code's tools: ~0.1 ms

    def check_names(self) -> None:
        """A ValueError naming a parser sglang does not know."""
        sglang = parsers()
        known_tools, known_reasoning = sglang.FunctionCallParser.ToolCallParserEnum, sglang.ReasoningParser.DetectorMap
        if self.tool_parser and self.tool_parser not in known_tools:
            raise ValueError(f"unknown tool parser {self.tool_parser!r}; known: {sorted(known_tools)}")
        if self.reasoning_parser and self.reasoning_parser not in known_reasoning:
            raise ValueError(f"unknown reasoning parser {self.reasoning_parser!r}; known: {sorted(known_reasoning)}")

    def parse(self, text: str, tools: list[dict[str, Any]]) -> ParsedOutput:
        sglang = parsers()
        reasoning, normal = "", text
        if self.reasoning_parser:
            found, rest = sglang.ReasoningParser(self.reasoning_parser, stream_reasoning=False).parse_non_stream(text)
            # The template renders reasoning.strip("\n"): stripping here loses nothing the render keeps.
            reasoning, normal = (found or "").strip("\n"), rest or ""
        if not (self.tool_parser and tools):
            return ParsedOutput(reasoning, normal.lstrip("\n"))
        parser = sglang.FunctionCallParser(self._tool_models.get(tools, _tool_models), self.tool_parser)
        if not parser.has_tool_call(normal):
            return ParsedOutput(reasoning, normal.lstrip("\n"))
        content, items = parser.parse_non_stream(normal)
        calls = [ParsedCall(item.name, item.parameters or "{}") for item in items]
        if not calls or _bad_arguments(calls):
            # sglang drops malformed calls silently (reference issue #2306): keep the raw text instead, and
            # flag the turn so it is visible in samples' metadata.
            return ParsedOutput(reasoning, normal.lstrip("\n"), [], ill_formed=True)
        return ParsedOutput(reasoning, (content or "").lstrip("\n"), calls)


def _tool_models(tools: list[dict[str, Any]]) -> list[Any]:
    sglang = parsers()
    return [
        sglang.Tool(
            type="function",
            function=sglang.Function(
                name=t["function"]["name"],
                description=t["function"].get("description"),
                parameters=t["function"].get("parameters") or {"type": "object", "properties": {}},
            ),
        )
        for t in tools
    ]


def _bad_arguments(calls: list[ParsedCall]) -> bool:
    try:
        for call in calls:
            call.arguments_dict()
    except ValueError:
        return True
    return False
