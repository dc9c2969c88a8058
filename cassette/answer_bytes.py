"""An engine answer's bytes as the engine sent them, from what an engine record keeps (its `wire`).

An engine record keeps its answer parsed (`response`: a JSON body, a stream's chunks), which every reader uses. A
target that passes the engine's answer on to its agent untouched (a pass-through gateway) sends the engine's own
bytes, so a replay that serves the same JSON encoded another way (spaces after `:`, `1e-07` for `1e-7`) fails on
that target's reply. The recorder therefore keeps, beside the parsed answer, how to write it again byte for byte:
the encoding that reproduces it (engines write JSON one of a few ways: FastAPI's compact `json.dumps` in vLLM's
bodies, orjson in SGLang's and pydantic in vLLM's stream chunks, Python's default in aiohttp's `json_response`), a
stream's framing, and the bytes themselves only where none of those reproduces them. Every choice is checked
against the bytes received when recorded, so what a replay serves from a wire is exactly what the engine sent.
A record without a wire (recorded before it existed, or by tito's own adapter) is served re-encoded, as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from tito_rl.cassette.format.checks import SSE_SEPARATORS as SEPARATORS

SSE_TYPE = "text/event-stream"
DONE = b"data: [DONE]"  # an OpenAI-style stream's last event


def _compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _compact_ascii(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("ascii")


def _spaced(value: Any) -> bytes:
    return json.dumps(value).encode("ascii")


def _spaced_utf8(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode("utf-8")


def _text(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError("a text answer is a str")
    return value.encode("utf-8")


# The encodings tried, in this order (the likeliest and cheapest first); a wire names the one that matched.
STYLES: dict[str, Callable[[Any], bytes]] = {
    "orjson": orjson.dumps,  # SGLang (ORJSONResponse); pydantic's model_dump_json (vLLM's stream chunks)
    "compact": _compact,  # FastAPI/Starlette's JSONResponse (vLLM's bodies)
    "spaced": _spaced,  # Python's default: aiohttp's json_response
    "compact-ascii": _compact_ascii,
    "spaced-utf8": _spaced_utf8,
    "text": _text,  # a body that is not JSON, as UTF-8
}


def is_stream(content_type: str | None) -> bool:
    return bool(content_type) and str(content_type).split(";")[0].strip().lower() == SSE_TYPE


def _chunks(response: Any) -> list[Any]:
    """A stream's chunks as a record keeps them: every chunk of an OpenAI-style stream, SGLang's last one."""
    return response if isinstance(response, list) else [response]


def _pieces(encode: Callable[[Any], bytes], response: Any, sse: str | None, done: bool) -> Iterator[bytes]:
    if sse is None:
        yield encode(response)
        return
    end = sse.encode()
    for chunk in _chunks(response):
        yield b"data: " + encode(chunk) + end
    if done:
        yield DONE + end


def _reproduces(raw: bytes, pieces: Iterator[bytes]) -> bool:
    """Whether the pieces joined are `raw`, stopping at the first piece that differs (a stream's first event
    tells most encodings apart)."""
    view, at = memoryview(raw), 0
    try:
        for piece in pieces:
            end = at + len(piece)
            if view[at:end] != piece:
                return False
            at = end
    except (TypeError, ValueError):  # orjson past 64-bit ints, a lone surrogate in UTF-8, text of a JSON value
        return False
    return at == len(raw)


def answer_wire(raw: bytes | None, response: Any, content_type: str | None) -> dict[str, Any] | None:
    """How to write `response` (as a record keeps it) again as the engine's `raw` bytes: `style` (an encoding
    of `STYLES`), for a stream `sse` (the separator ending each `data: ` event) and `done` (a final
    `data: [DONE]`), else the bytes themselves (`raw`); `content_type` as the engine sent it. None: no bytes."""
    if raw is None:
        return None
    wire: dict[str, Any] = {"content_type": content_type} if content_type else {}
    sse: str | None = None
    done = False
    if is_stream(content_type):
        sse = SEPARATORS[1] if b"\r\n" in raw[:4096] else SEPARATORS[0]
        done = raw.endswith(DONE + sse.encode())
    if raw:
        for name, encode in STYLES.items():
            if _reproduces(raw, _pieces(encode, response, sse, done)):
                wire["style"] = name
                if sse is not None:
                    wire["sse"], wire["done"] = sse, done
                return wire
    wire["raw"] = bytes(raw)
    return wire


def answer_bytes(wire: Mapping[str, Any] | None, response: Any) -> bytes | None:
    """The engine's bytes a record's `wire` keeps; None where it keeps none (the caller re-encodes), or names an
    encoding this tito does not know."""
    if not wire:
        return None
    raw = wire.get("raw")
    if isinstance(raw, bytes):
        return raw
    encode = STYLES.get(str(wire.get("style")))
    if encode is None:
        return None
    sse = wire.get("sse")
    try:
        return b"".join(_pieces(encode, response, sse if sse in SEPARATORS else None, wire.get("done") is True))
    except (TypeError, ValueError):
        return None
