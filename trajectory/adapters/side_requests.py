"""Which agent requests are side requests: answered, kept out of the training tree.

A side request is not a step of the agent's work: a title or summary the client asks for to label its
session, a structured-output request (the client wants JSON for itself, e.g. Claude Code's session title,
Gemini CLI's next-speaker check), a probe (`HEAD /api/hello`; handled by the app). A request without tools
is not one by itself: a plain chat session has none and must be trained. Title and summary requests are
recognised by their system prompt (or first user message), with patterns that can be replaced or extended
(`tito serve --side-pattern REGEX`, `AdapterSettings.side_patterns`).
"""

from __future__ import annotations

import re
from functools import lru_cache

from tito_rl.trajectory.adapters.turns import TurnRequest

# Seen in the pinned clients' side requests (see tests/captures): opencode's title generator; Claude
# Code's older title and summary prompts; generic "title for this conversation" phrasings.
DEFAULT_SIDE_PATTERNS: tuple[str, ...] = (
    r"\byou are a title generator\b",
    r"\bgenerate a (?:brief |short |concise )?title\b",
    r"\bwrite a (?:\d+-\d+ word |short |brief )?title for (?:the|this) (?:following )?conversation\b",
    r"\bsummari[sz]e this (?:coding )?conversation in under \d+ (?:characters|words)\b",
    r"\bnaming a coding session\b",
)
LOOKED_AT_CHARS = 2000  # the head of the system prompt and first user message: where such an instruction is


@lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> re.Pattern[str] | None:
    return re.compile("|".join(f"(?:{p})" for p in patterns), re.IGNORECASE) if patterns else None


def is_side_request(turn: TurnRequest, patterns: tuple[str, ...] = DEFAULT_SIDE_PATTERNS) -> bool:
    if turn.structured_output:
        return True
    found = _compiled(tuple(patterns))
    if found is None:
        return False
    heads = [m for m in turn.messages if m.get("role") == "system"][:1]
    heads += [m for m in turn.messages if m.get("role") == "user"][:1]
    return any(isinstance(m.get("content"), str) and found.search(m["content"][:LOOKED_AT_CHARS]) for m in heads)


def check_patterns(patterns: tuple[str, ...]) -> None:
    """A bad pattern fails at start-up, naming it, not on the first request."""
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"side-request pattern {pattern!r} is not a regular expression: {exc}") from None
