"""Secrets never reach disk: the one place that decides what is a secret and how sessions are named.

Three layers, applied by the cassette writer to everything it stores:
1. secret headers (authorization, API keys, cookies) keep their name, lose their value;
2. the literal values seen in those headers (the bearer token, the API key) are removed wherever else they
   appear: request bodies that echo them, SSE events, the engine's routing-key header;
3. configurable regex patterns (`sk-ant-...`, `sk-...`, `AIza...`) catch keys the headers never showed.
A session whose live id is a bearer token or API key is named by a stable digest of it, so the cassette
can be shared and replay still tells sessions apart; a `/s/<sid>/` path name is kept as it is. A session id a
gateway keeps where no credential is (`--session-from path:...`, `cookie:...`, a header that is not a credential:
`trajectory.adapters.session_from`) is public: kept verbatim everywhere, never learnt as a secret, so a replay
and a finish address the gateway's own session by it; the headers it came in (a cookie) are still redacted.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, overload
from urllib.parse import parse_qsl, urlencode

from tito_rl.cassette.format.routes import CHANNEL_KEYS, is_base64_text
from tito_rl.trajectory.adapters.session import is_secret_source
from tito_rl.trajectory.adapters.session import session_digest as session_digest  # the name sessions get here

SECRET_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "cookie",
        "set-cookie",
    }
)
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
PUBLIC_SOURCE_KINDS = frozenset(
    {"header", "cookie", "session-cookie", "path"}
)  # `--session-from` kinds, as `header:NAME`


def _all_ints(values: list[Any]) -> bool:
    try:
        array("q", values)  # C-speed type check; floats and strings raise TypeError
    except (TypeError, OverflowError):
        return False
    return True


@dataclass
class _Literals:
    """Secret values and their replacements, with detectors rebuilt only when the set changes."""

    patterns: tuple[str, ...] = ()  # searched for by the detectors too (the global set only)
    replacements: dict[str, str] = field(default_factory=dict)
    ordered: list[tuple[str, str]] = field(default_factory=list)  # longest first: a secret's own prefix waits
    detect: _Detector = field(init=False)
    detect_bytes: _Detector = field(init=False)

    def __post_init__(self) -> None:
        self._rebuild()

    def add(self, secret: str, replacement: str, overwrite: bool = False) -> None:
        if secret in self.replacements and (not overwrite or self.replacements[secret] == replacement):
            return
        self.replacements[secret] = replacement
        self._rebuild()

    def _rebuild(self) -> None:
        self.ordered = sorted(self.replacements.items(), key=lambda item: len(item[0]), reverse=True)
        escaped = [re.escape(secret) for secret, _ in self.ordered]
        self.detect = _Detector(escaped + list(self.patterns))
        self.detect_bytes = _Detector([x.encode() for x in escaped] + [p.encode() for p in self.patterns])


@dataclass
class Redactor:
    """What is secret, and how to remove it.

    Secrets learnt from traffic live in scopes: a session's own credential (the bearer token or API key
    that names it, and header values holding it) is only ever echoed in that session's traffic, so it is
    searched for there alone; other secrets (a key shared by every agent) are searched for everywhere.
    This keeps the cost of scrubbing a string flat however many sessions a recording holds: the recorder
    scrubs every string of every exchange, and the common case, nothing to remove, is one regex search.
    """

    patterns: Iterable[str] = DEFAULT_PATTERNS
    secret_headers: frozenset[str] = SECRET_HEADERS
    _compiled: list[re.Pattern[str]] = field(default_factory=list, init=False)
    _compiled_bytes: list[re.Pattern[bytes]] = field(default_factory=list, init=False)
    _global: _Literals = field(init=False)
    _scopes: dict[str, _Literals] = field(default_factory=dict, init=False)  # session name -> its own secrets
    _credentials: dict[str, str] = field(default_factory=dict, init=False)  # session name -> its live id
    _public: set[str] = field(default_factory=set, init=False)  # session ids that are no secret (path, cookie)

    def __post_init__(self) -> None:
        self.patterns = tuple(self.patterns)
        self.secret_headers = frozenset(h.lower() for h in self.secret_headers)
        try:
            self._compiled = [re.compile(p) for p in self.patterns]
            self._compiled_bytes = [re.compile(p.encode()) for p in self.patterns]
            self._global = _Literals(self.patterns)
        except re.error as exc:
            raise ValueError(f"bad redaction pattern: {exc}") from exc

    # secrets learnt from traffic

    def add_secret(self, value: str, replacement: str = REDACTED, scope: str | None = None) -> None:
        """A literal to remove wherever it appears (in `scope`'s traffic only, when a session is given)."""
        value = value.strip()
        if len(value) < MIN_LITERAL_LEN or value in self._public:
            return
        credential = self._credentials.get(scope) if scope is not None else None
        if scope is not None and credential is not None and credential in value:
            self._scope(scope).add(value, replacement)
        else:
            self._global.add(value, replacement)

    def session_name(self, session: str, source: str) -> str:
        """The name a session gets on disk; registers a secret-derived id for scrubbing in its scope."""
        kind, colon, _ = source.partition(":")
        if colon and kind in PUBLIC_SOURCE_KINDS and not is_secret_source(source):
            self._public.add(session.strip())  # where the gateway keeps it: the gateway's own name for it
            return session
        if is_secret_source(source):
            name = session_digest(session)
            secret = session.strip()
            if name != session and len(secret) >= MIN_LITERAL_LEN:
                self._credentials[name] = secret
                # its echoes (routing keys, bodies) read as the name
                self._scope(name).add(secret, name, overwrite=True)
            return name
        return self.scrub_text(session)

    def learn_headers(self, headers: dict[str, str], scope: str | None = None) -> None:
        """Remember the values of secret headers so their echoes elsewhere are removed too."""
        for name, value in headers.items():
            if name.lower() not in self.secret_headers:
                continue
            self.add_secret(value, scope=scope)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                self.add_secret(token, scope=scope)
            for part in value.split(";"):
                _, eq, cookie_value = part.partition("=")
                if eq:
                    self.add_secret(cookie_value, scope=scope)

    def _scope(self, name: str) -> _Literals:
        scope = self._scopes.get(name)
        if scope is None:
            scope = self._scopes[name] = _Literals()
        return scope

    # scrubbing: `scope` is the session name whose traffic the value belongs to, if any

    @overload
    def headers(self, headers: dict[str, str], scope: str | None = None) -> dict[str, str]: ...

    @overload
    def headers(self, headers: dict[str, str | list[str]], scope: str | None = None) -> dict[str, str | list[str]]: ...

    def headers(self, headers: dict[str, Any], scope: str | None = None) -> dict[str, Any]:
        """A repeated header (vcrpy keeps it as a list of values) is scrubbed value by value."""
        return {
            k: (
                REDACTED
                if k.lower() in self.secret_headers
                else [self.scrub_text(x, scope) for x in v]
                if isinstance(v, list)
                else self.scrub_text(v, scope)
            )
            for k, v in headers.items()
        }

    def scrub_text(self, text: str, scope: str | None = None) -> str:
        own = self._scopes.get(scope) if scope is not None else None
        if not self._global.detect.found(text) and (own is None or not own.detect.found(text)):
            return text
        for secret, replacement in self._ordered(own):
            if secret in text:
                text = text.replace(secret, replacement)
        for pattern in self._compiled:
            text = pattern.sub(REDACTED, text)
        return text

    def scrub_bytes(self, data: bytes, scope: str | None = None) -> bytes:
        own = self._scopes.get(scope) if scope is not None else None
        if not self._global.detect_bytes.found(data) and (own is None or not own.detect_bytes.found(data)):
            return data
        for secret, replacement in self._ordered(own):
            raw = secret.encode()
            if raw in data:
                data = data.replace(raw, replacement.encode())
        for pattern in self._compiled_bytes:
            data = pattern.sub(REDACTED.encode(), data)
        return data

    def _ordered(self, own: _Literals | None) -> list[tuple[str, str]]:
        if own is None:
            return self._global.ordered
        return sorted(own.ordered + self._global.ordered, key=lambda item: len(item[0]), reverse=True)

    def scrub_query(self, query: str, scope: str | None = None) -> str:
        if not query:
            return query
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k.lower() in SECRET_QUERY_PARAMS for k, _ in pairs):
            pairs = [(k, REDACTED if k.lower() in SECRET_QUERY_PARAMS else v) for k, v in pairs]
            query = urlencode(pairs)
        return self.scrub_text(query, scope)

    def scrub_json(self, value: Any, scope: str | None = None) -> Any:
        """Every string in a JSON-like value (keys included); token arrays pass through untouched, and so do the
        per-token channels engines send as base64 (expert routes, kept sets: integer arrays too). Scrubbed, a
        route string lost its bytes wherever the `AIza...` pattern matched inside the base64 (vLLM's uint8 routes
        and SGLang's kept sets can spell it), and its megabytes took most of the writer's time per call."""
        if isinstance(value, str):
            return self.scrub_text(value, scope)
        if isinstance(value, dict):
            return {
                self.scrub_text(k, scope) if isinstance(k, str) else k: v
                if k in CHANNEL_KEYS and is_base64_text(v)
                else self.scrub_json(v, scope)
                for k, v in value.items()
            }
        if isinstance(value, list):
            if not value or _holds_no_text(value):
                return value  # token arrays, logprob triples: nothing to scrub, and too long to walk in Python
            return [self.scrub_json(v, scope) for v in value]
        if isinstance(value, bytes):
            return self.scrub_bytes(value, scope)
        return value


class _Detector:
    """Whether any alternative occurs: one search of their alternation, or one search each when a pattern
    cannot sit inside an alternation (global inline flags such as `(?i)` must lead the whole regex)."""

    def __init__(self, alternatives: list[Any]) -> None:
        self._searches: list[Any] = []
        if not alternatives:
            return
        bar, group, close = (b"|", b"(?:", b")") if isinstance(alternatives[0], bytes) else ("|", "(?:", ")")
        try:
            self._searches = [re.compile(bar.join(group + a + close for a in alternatives)).search]
        except re.error:
            self._searches = [re.compile(a).search for a in alternatives]

    def found(self, text: Any) -> bool:
        return any(search(text) is not None for search in self._searches)


def _numeric(values: Any) -> bool:
    try:
        array("d", values)  # C-speed type check: ints and floats pass, strings, None and lists raise
    except (TypeError, OverflowError):
        return False
    return True


def _holds_no_text(values: list[Any]) -> bool:
    """True when a list certainly holds no string: numbers, or rows of numbers and None (logprob triples)."""
    first = values[0]
    if type(first) is int:
        return _all_ints(values)
    if type(first) is float:
        return _numeric(values)
    if type(first) is not list or set(map(type, values)) != {list} or len(set(map(len, values))) != 1:
        return False
    for column in zip(*values, strict=True):
        nones = column.count(None)
        if nones == len(column):
            continue
        if not _numeric([x for x in column if x is not None] if nones else column):
            return False
    return True
