"""The adapter's output parser: engine text -> reasoning, content and tool calls, with sglang's own parsers.

A short replay has the parsers loaded by a helper process meanwhile and parses there (`parser_process`);
otherwise, or once the helper is gone, it parses in this process (`sglang_parsers`): the same code, on the
same text.
"""

from __future__ import annotations

from typing import Any

from tito_rl.trajectory.adapters.parsing import parser_process
from tito_rl.trajectory.adapters.parsing.sglang_parsers import ParsedOutput, SglangParsers


class OutputParser:
    """Splits decoded model output the way the configured sglang parsers do: through the helper while there is
    one, else here."""

    def __init__(self, reasoning_parser: str | None = "qwen3", tool_parser: str | None = "qwen25") -> None:
        self.reasoning_parser = reasoning_parser
        self.tool_parser = tool_parser
        self._here = SglangParsers(reasoning_parser, tool_parser)
        if (reasoning_parser or tool_parser) and not parser_process.ask(("check", reasoning_parser, tool_parser))[0]:
            self._here.check_names()  # the helper made parsers of these names when it answers: they are known

    def parse(self, text: str, tools: list[dict[str, Any]]) -> ParsedOutput:
        if self.reasoning_parser or (self.tool_parser and tools):
            helped, parsed = parser_process.ask(("parse", self.reasoning_parser, self.tool_parser, text, tools))
            if helped:
                assert isinstance(parsed, ParsedOutput)
                return parsed
        return self._here.parse(text, tools)
