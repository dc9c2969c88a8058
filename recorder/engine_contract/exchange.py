"""Send one contract request to an engine and read its answer: a JSON body, or the data events of an SSE stream.

Plain blocking HTTP on loopback (or the user's engine URL): the contract sends a few dozen requests one at a
time, so nothing here needs an event loop. A stream is read whole; `[DONE]` is kept as its own marker, so a
missing one is a difference like any other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import requests

DONE = "[DONE]"


@dataclass
class Answer:
    """What an engine answered one request with."""

    status: int
    body: Any = None  # the JSON body; None for a stream or a body that is not JSON
    chunks: list[Any] = field(default_factory=list)  # a stream's data events, parsed; DONE as the string
    text: str = ""  # the raw body where it was not JSON (a 404's HTML, a plain-text error)
    streamed: bool = False
    dialect: str | None = None  # the dialect tito's engine tap recorded the call in (None: not through the tap)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.dialect is not None:
            out["dialect"] = self.dialect
        if self.streamed:
            out["chunks"] = self.chunks
        elif self.body is not None:
            out["body"] = self.body
        else:
            out["text"] = self.text
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        dialect = data.get("dialect")
        if "chunks" in data:
            return cls(status=int(data["status"]), chunks=list(data["chunks"]), streamed=True, dialect=dialect)
        return cls(status=int(data["status"]), body=data.get("body"), text=str(data.get("text", "")), dialect=dialect)


class Unreachable(Exception):
    """The engine did not answer at all (refused, reset, timed out)."""


def send(
    base_url: str,
    method: str,
    path: str,
    body: Any = None,
    timeout_s: float = 120.0,
    headers: dict[str, str] | None = None,
) -> Answer:
    url = base_url.rstrip("/") + path
    try:
        reply = requests.request(method, url, json=body, stream=True, timeout=timeout_s, headers=headers)
    except requests.RequestException as error:
        raise Unreachable(f"{method} {url}: {type(error).__name__}") from None
    with reply:
        kind = reply.headers.get("content-type", "")
        if kind.startswith("text/event-stream"):
            return Answer(status=reply.status_code, chunks=read_events(reply), streamed=True)
        raw = reply.content.decode("utf-8", errors="replace")
    try:
        return Answer(status=reply.status_code, body=json.loads(raw))
    except ValueError:
        return Answer(status=reply.status_code, text=raw)


def read_events(reply: requests.Response) -> list[Any]:
    return parse_events(reply.iter_lines(decode_unicode=True))


def parse_events(lines: Iterable[str]) -> list[Any]:
    """A stream's data events in order, each parsed; `[DONE]` kept as its marker, a non-JSON one marked so."""
    events: list[Any] = []
    for line in lines:
        if not line or not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == DONE:
            events.append(DONE)
            continue
        try:
            events.append(json.loads(data))
        except ValueError:
            events.append({"<not json>": data})
    return events
