"""The model an OpenAI-style engine serves, learned from its `GET /v1/models`, never assumed.

vLLM answers a request that names another model than the one it serves with a 404, and names the model it serves
after the path or `--served-model-name` it was started with: tito's adapter asks the engine. `tito serve` and
`tito record` ask once at start (a recording keeps the answer in its header, so a replay sends the same name
without asking); where the engine is not up yet, the adapter asks before its first generation
(`EngineClient.served_model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

MODELS_PATH = "/v1/models"


class ServedModelError(Exception):
    """The engine's model listing could not be read; the message says why, in one line."""


@dataclass(frozen=True)
class ServedModel:
    name: str
    max_model_len: int | None = None  # the engine's context length, where the listing says it


def read_listing(listing: Any) -> ServedModel:
    """The first model of an OpenAI `GET /v1/models` answer (`{"data": [{"id", "max_model_len"?}, ...]}`)."""
    data = listing.get("data") if isinstance(listing, dict) else None
    card = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
    name = card.get("id")
    if not isinstance(name, str) or not name:
        raise ServedModelError(f"its {MODELS_PATH} lists no model: {str(listing)[:200]!r}")
    length = card.get("max_model_len")
    return ServedModel(name, length if type(length) is int and length > 0 else None)


async def fetch_served_model(engine_url: str, timeout_s: float = 10.0) -> ServedModel:
    """The engine's served model; `ServedModelError` when it cannot be read."""
    url = engine_url.rstrip("/") + MODELS_PATH
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http, http.get(url) as resp:
            if resp.status != 200:
                raise ServedModelError(f"GET {url} answered {resp.status}")
            listing = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ServedModelError(f"GET {url} failed: {type(exc).__name__}: {exc}") from None
    return read_listing(listing)
