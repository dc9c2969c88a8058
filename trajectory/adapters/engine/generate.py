"""The SGLang `/generate` client: sampling parameters, rids, aborts (router-aware) and error mapping.

Every call is reported to a callback as an `EngineExchange`, so a recorder sees the engine leg exactly as
sent and received. The bytes travel through an `EngineTransport` (`transport`): HTTP to a live engine by
default; a replay plugs in one that answers from a cassette.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tito_rl.trajectory.adapters.engine.transport import EngineAnswer, EngineTransport, EngineUnreachable, HttpTransport
from tito_rl.trajectory.adapters.tap import EngineExchange
from tito_rl.trajectory.dialects.view import SGLANG
from tito_rl.trajectory.runtime.untracked import untrack

# Start of every request's sampling params: ids must round-trip, so nothing is skipped or trimmed.
BASE_SAMPLING = {"skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True}
CLIENT_SAMPLING = ("temperature", "top_p", "top_k", "stop")


# Engine statuses that mean "busy, send it again": the client gets its own wire's overloaded status, which its
# retry logic knows (Anthropic's 529 overloaded_error, 503 on the OpenAI and Gemini wires), not a plain 502.
OVERLOADED_ENGINE_STATUSES = frozenset({529})


class EngineError(Exception):
    """The engine failed a call; `status` is the HTTP status the adapter answers the agent with, unless
    `overloaded`: then the agent's wire says how it spells "overloaded" (`OVERLOADED_STATUS` per wire)."""

    def __init__(self, status: int, message: str, overloaded: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.overloaded = overloaded


@dataclass
class Generation:
    rid: str
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: str  # stop, length, abort
    prompt_tokens: int
    cached_tokens: int = 0
    raw: dict[str, Any] = field(default_factory=dict)
    created: int = 0  # when the engine answered (Unix seconds): the `created` that OpenAI wires show


def sampling_params(client: dict[str, Any], prompt_len: int, context_length: int,
                    default_max_tokens: int) -> dict[str, Any] | None:
    """Reference rules: base params, max_new_tokens capped by the client and the context left, the client's
    temperature/top_p/top_k/stop on top. None when no context is left (the turn is an empty `length`)."""
    left = context_length - prompt_len
    if left <= 0:
        return None
    params: dict[str, Any] = dict(BASE_SAMPLING)
    params["max_new_tokens"] = min(int(client.get("max_tokens") or default_max_tokens), left)
    for key in CLIENT_SAMPLING:
        if client.get(key) is not None:
            params[key] = client[key]
    return params


def new_rid() -> str:
    # SGLang aborts by rid *prefix*: fixed-length rids never prefix one another.
    return uuid.uuid4().hex


ExchangeCallback = Callable[[EngineExchange], None]


class EngineClient:
    def __init__(self, base_url: str, session_factory: Callable[[], Awaitable[aiohttp.ClientSession]] | None = None,
                 timeout_s: float = 600.0, rid_factory: Callable[[], str] = new_rid,
                 transport: EngineTransport | None = None, clock: Callable[[], float] = time.time) -> None:
        self.base_url = base_url.rstrip("/")
        self.transport: EngineTransport = transport or HttpTransport(session_factory, timeout_s)
        self.rid_factory = rid_factory
        self.clock = clock

    async def close(self) -> None:
        await self.transport.close()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str],
                    on_exchange: ExchangeCallback, t0: float, base: str | None = None) -> EngineAnswer:
        exchange = EngineExchange(method, path, body, 0, headers=dict(headers), started_s=time.monotonic() - t0,
                                  dialect=SGLANG)
        started = time.monotonic()
        try:
            answer = await self.transport.send(method, (base or self.base_url) + path, body, headers)
            exchange.status, exchange.response = answer.status, answer.body
            return answer
        except EngineUnreachable as exc:
            exchange.error = exc.text
            raise EngineError(504 if exc.timed_out else 502,
                              f"engine unreachable at {self.base_url}{path}: {exc.text}") from exc
        finally:
            exchange.duration_s = time.monotonic() - started
            if base:
                exchange.path = base + path
            on_exchange(exchange)

    async def generate(self, sid: str, rid: str, input_ids: list[int], params: dict[str, Any],
                       on_exchange: ExchangeCallback, t0: float) -> Generation:
        body = {"rid": rid, "input_ids": input_ids, "sampling_params": params, "return_logprob": True}
        answer = await self._call("POST", "/generate", body, {"X-SMG-Routing-Key": sid}, on_exchange, t0)
        if answer.status != 200:
            raise EngineError(400 if 400 <= answer.status < 500 else 502, f"engine /generate failed "
                              f"({answer.status}): {_error_text(answer.body)}",
                              overloaded=answer.status in OVERLOADED_ENGINE_STATUSES)
        generation = parse_generation(rid, answer.body)
        generation.created = int(self.clock())
        return generation

    async def abort(self, rid: str, on_exchange: ExchangeCallback, t0: float) -> None:
        """Best effort: the engine's /abort_request, or, behind a router (404), every listed worker's."""
        try:
            answer = await self._call("POST", "/abort_request", {"rid": rid}, {}, on_exchange, t0)
            if answer.status != 404:
                return
            listing = await self._call("GET", "/workers", None, {}, on_exchange, t0)
            for url in worker_urls(listing.body) if listing.status == 200 else []:
                try:
                    await self._call("POST", "/abort_request", {"rid": rid}, {}, on_exchange, t0, base=url)
                except EngineError:
                    continue
        except EngineError:
            return


def worker_urls(listing: Any) -> list[str]:
    """Worker base URLs from a router's `GET /workers` (list of urls or of objects with `url`)."""
    if isinstance(listing, dict):
        listing = listing.get("workers") or listing.get("urls") or []
    urls = []
    for w in listing if isinstance(listing, list) else []:
        url = w if isinstance(w, str) else (w.get("url") if isinstance(w, dict) else None)
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            urls.append(url.rstrip("/"))
    return urls


def _error_text(data: Any) -> str:
    if isinstance(data, dict):
        err = data.get("error", data.get("message", data))
        if isinstance(err, dict):
            err = err.get("message", err)
        return str(err)
    return str(data)[:500]


def parse_generation(rid: str, data: Any) -> Generation:
    if not isinstance(data, dict) or not isinstance(data.get("meta_info"), dict):
        raise EngineError(502, f"engine /generate returned a malformed body: {str(data)[:200]!r}")
    meta = data["meta_info"]
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list):
        raise EngineError(502, "engine /generate returned no meta_info.output_token_logprobs "
                               "(was return_logprob honoured?)")
    try:
        output_ids = untrack([int(t[1]) for t in triples])
        logprobs = untrack([float(t[0]) if t[0] is not None else 0.0 for t in triples])
    except (TypeError, IndexError, KeyError, ValueError) as exc:
        raise EngineError(502, f"engine /generate returned malformed logprobs: {exc!r}") from exc
    if isinstance(data.get("output_ids"), list) and data["output_ids"] != output_ids:
        raise EngineError(502, "engine /generate output_ids disagree with output_token_logprobs")
    reason = meta.get("finish_reason")
    finish = reason.get("type", "stop") if isinstance(reason, dict) else "stop"
    if finish not in ("stop", "length", "abort"):
        finish = "stop"
    try:  # a malformed body (or a hostile cassette's, in a replay) is the engine's error, not the adapter's
        prompt_tokens, cached_tokens = int(meta.get("prompt_tokens") or 0), int(meta.get("cached_tokens") or 0)
    except (TypeError, ValueError) as exc:
        raise EngineError(502, f"engine /generate returned malformed token counts: {exc}") from exc
    return Generation(rid, output_ids, logprobs, finish, prompt_tokens, cached_tokens, data)
