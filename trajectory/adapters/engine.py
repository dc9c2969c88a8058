"""The SGLang `/generate` client: sampling parameters, rids, aborts (router-aware) and error mapping.

Every call is reported to a callback as an `EngineExchange`, so a recorder sees the engine leg exactly as
sent and received.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from trajectory.adapters import fast_json
from trajectory.adapters.tap import EngineExchange
from trajectory.untracked import untrack

# Start of every request's sampling params: ids must round-trip, so nothing is skipped or trimmed.
BASE_SAMPLING = {"skip_special_tokens": False, "spaces_between_special_tokens": False, "no_stop_trim": True}
CLIENT_SAMPLING = ("temperature", "top_p", "top_k", "stop")
_JSON = {"Content-Type": "application/json"}


class EngineError(Exception):
    """The engine failed a call; `status` is the HTTP status the adapter answers the agent with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Generation:
    rid: str
    output_ids: list[int]
    output_log_probs: list[float]
    finish_reason: str  # stop, length, abort
    prompt_tokens: int
    cached_tokens: int = 0
    raw: dict[str, Any] = field(default_factory=dict)


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
                 timeout_s: float = 600.0, rid_factory: Callable[[], str] = new_rid) -> None:
        self.base_url = base_url.rstrip("/")
        self._factory = session_factory
        self._session: aiohttp.ClientSession | None = None
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.rid_factory = rid_factory

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = await self._factory() if self._factory else aiohttp.ClientSession()
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None, headers: dict[str, str],
                    on_exchange: ExchangeCallback, t0: float, base: str | None = None) -> tuple[int, Any]:
        exchange = EngineExchange(method, path, body, 0, headers=dict(headers), started_s=time.monotonic() - t0)
        started = time.monotonic()
        try:
            session = await self.session()
            # Bytes both ways: aiohttp's JSON payload and text() add ~10% to a call's client-side CPU.
            data = None if body is None else fast_json.dumps(body)
            async with session.request(method, (base or self.base_url) + path, data=data,
                                       headers={**headers, **_JSON} if data else headers,
                                       timeout=self.timeout) as resp:
                exchange.status = resp.status
                raw = await resp.read()
            try:
                exchange.response = fast_json.loads(raw) if raw else None
            except ValueError:
                exchange.response = raw.decode("utf-8", errors="replace")
            return exchange.status, exchange.response
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            exchange.error = f"{type(exc).__name__}: {exc}"
            raise EngineError(502 if not isinstance(exc, asyncio.TimeoutError) else 504,
                              f"engine unreachable at {self.base_url}{path}: {exchange.error}") from exc
        finally:
            exchange.duration_s = time.monotonic() - started
            if base:
                exchange.path = base + path
            on_exchange(exchange)

    async def generate(self, sid: str, rid: str, input_ids: list[int], params: dict[str, Any],
                       on_exchange: ExchangeCallback, t0: float) -> Generation:
        body = {"rid": rid, "input_ids": input_ids, "sampling_params": params, "return_logprob": True}
        status, data = await self._call("POST", "/generate", body, {"X-SMG-Routing-Key": sid}, on_exchange, t0)
        if status != 200:
            raise EngineError(400 if 400 <= status < 500 else 502, f"engine /generate failed ({status}): "
                              f"{_error_text(data)}")
        return parse_generation(rid, data)

    async def abort(self, rid: str, on_exchange: ExchangeCallback, t0: float) -> None:
        """Best effort: the engine's /abort_request, or, behind a router (404), every listed worker's."""
        try:
            status, _ = await self._call("POST", "/abort_request", {"rid": rid}, {}, on_exchange, t0)
            if status != 404:
                return
            status, listing = await self._call("GET", "/workers", None, {}, on_exchange, t0)
            for url in worker_urls(listing) if status == 200 else []:
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
    except (TypeError, IndexError, ValueError) as exc:
        raise EngineError(502, f"engine /generate returned malformed logprobs: {exc}") from exc
    if isinstance(data.get("output_ids"), list) and data["output_ids"] != output_ids:
        raise EngineError(502, "engine /generate output_ids disagree with output_token_logprobs")
    finish = (meta.get("finish_reason") or {}).get("type", "stop")
    if finish not in ("stop", "length", "abort"):
        finish = "stop"
    return Generation(rid, output_ids, logprobs, finish, int(meta.get("prompt_tokens") or 0),
                      int(meta.get("cached_tokens") or 0), data)
