"""Secrets never reach disk: the one place that decides what is a secret and how sessions are named.

Three layers, applied by the cassette writer to everything it stores:
1. secret headers (authorization, API keys, cookies) keep their name, lose their value;
2. the literal values seen in those headers (the bearer token, the API key) are removed wherever else they
   appear: request bodies that echo them, SSE events, the engine's routing-key header;
3. configurable regex patterns (`sk-ant-...`, `sk-...`, `AIza...`) catch keys the headers never showed.
A session whose live id is a bearer token or API key is named by a stable digest of it, so the cassette
can be shared and replay still tells sessions apart; a `/s/<sid>/` path name is kept as it is.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlencode

SECRET_HEADERS = frozenset({
    "authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key", "cookie", "set-cookie",
})
SECRET_QUERY_PARAMS = frozenset({"key", "api_key", "apikey", "access_token", "token"})
# Anchored and long enough not to eat ordinary text ("task-management-..." is not a key): bodies are
# replayed, so a false positive changes what the agent leg re-sends.
# Each starts with its literal (the word-boundary check is a lookbehind after it) so the regex engine can
# skip ahead by literal search: scrubbing a 600 KB agent body then takes about a millisecond.
DEFAULT_PATTERNS = (
    r"sk-(?<![A-Za-z0-9_]sk-)ant-[A-Za-z0-9_\-]{16,}",
    r"sk-(?<![A-Za-z0-9_]sk-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_\-]{32,}",
    r"AIza(?<![A-Za-z0-9_]AIza)[0-9A-Za-z_\-]{35}",
)
# Header values shorter than this are not scrubbed from bodies (a 3-character token would match
# everywhere); they are still never stored in their header, and session ids are always digested.
MIN_LITERAL_LEN = 6
REDACTED = "<redacted>"
SESSION_SOURCES_FROM_SECRETS = frozenset({"bearer", "x-api-key"})


_DIGEST_NAME = re.compile(r"sid-[0-9a-f]{16}")


def _all_ints(values: list[Any]) -> bool:
    try:
        array("q", values)  # C-speed type check; floats and strings raise TypeError
    except (TypeError, OverflowError):
        return False
    return True


def session_digest(secret: str) -> str:
    """Stable across runs and machines, so replays and re-recordings agree on the name.

    A name that already is a digest is kept: a replay authenticates with the name, and re-recording that
    replay (or re-saving a vcrpy cassette) must not digest it a second time.
    """
    if _DIGEST_NAME.fullmatch(secret):
        return secret
    return "sid-" + hashlib.sha256(b"tito-session\0" + secret.encode()).hexdigest()[:16]


@dataclass
class Redactor:
    patterns: Iterable[str] = DEFAULT_PATTERNS
    secret_headers: frozenset[str] = SECRET_HEADERS
    _literals: dict[str, str] = field(default_factory=dict)  # secret value -> replacement
    _compiled: list[re.Pattern[str]] = field(default_factory=list, init=False)
    _compiled_bytes: list[re.Pattern[bytes]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.patterns = tuple(self.patterns)
        self.secret_headers = frozenset(h.lower() for h in self.secret_headers)
        try:
            self._compiled = [re.compile(p) for p in self.patterns]
            self._compiled_bytes = [re.compile(p.encode()) for p in self.patterns]
        except re.error as exc:
            raise ValueError(f"bad redaction pattern: {exc}") from exc

    # secrets learnt from traffic

    def add_secret(self, value: str, replacement: str = REDACTED) -> None:
        value = value.strip()
        if len(value) >= MIN_LITERAL_LEN and value not in self._literals:
            self._literals[value] = replacement

    def session_name(self, session: str, source: str) -> str:
        """The name a session gets on disk; registers a secret-derived id for scrubbing."""
        if source in SESSION_SOURCES_FROM_SECRETS:
            name = session_digest(session)
            if name != session and len(session.strip()) >= MIN_LITERAL_LEN:
                self._literals[session.strip()] = name  # its echoes (routing keys, bodies) read as the name
            return name
        return self.scrub_text(session)

    def learn_headers(self, headers: dict[str, str]) -> None:
        """Remember the values of secret headers so their echoes elsewhere are removed too."""
        for name, value in headers.items():
            if name.lower() not in self.secret_headers:
                continue
            self.add_secret(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                self.add_secret(token)
            for part in value.split(";"):
                _, eq, cookie_value = part.partition("=")
                if eq:
                    self.add_secret(cookie_value)

    # scrubbing

    def headers(self, headers: dict[str, str]) -> dict[str, str]:
        return {
            k: (REDACTED if k.lower() in self.secret_headers else self.scrub_text(v)) for k, v in headers.items()
        }

    def scrub_text(self, text: str) -> str:
        for secret in sorted(self._literals, key=len, reverse=True):
            if secret in text:
                text = text.replace(secret, self._literals[secret])
        for pattern in self._compiled:
            text = pattern.sub(REDACTED, text)
        return text

    def scrub_bytes(self, data: bytes) -> bytes:
        for secret in sorted(self._literals, key=len, reverse=True):
            raw = secret.encode()
            if raw in data:
                data = data.replace(raw, self._literals[secret].encode())
        for pattern in self._compiled_bytes:
            data = pattern.sub(REDACTED.encode(), data)
        return data

    def scrub_query(self, query: str) -> str:
        if not query:
            return query
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in SECRET_QUERY_PARAMS for k, _ in pairs):
            pairs = [(k, REDACTED if k.lower() in SECRET_QUERY_PARAMS else v) for k, v in pairs]
            query = urlencode(pairs)
        return self.scrub_text(query)

    def scrub_json(self, value: Any) -> Any:
        """Every string in a JSON-like value (keys included); token arrays pass through untouched."""
        if isinstance(value, str):
            return self.scrub_text(value)
        if isinstance(value, dict):
            return {self.scrub_text(k) if isinstance(k, str) else k: self.scrub_json(v) for k, v in value.items()}
        if isinstance(value, list):
            if value and type(value[0]) is int and _all_ints(value):
                return value  # token arrays: nothing to scrub, and too long to walk in Python
            return [self.scrub_json(v) for v in value]
        if isinstance(value, bytes):
            return self.scrub_bytes(value)
        return value
