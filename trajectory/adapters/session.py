"""Which agent session a request belongs to.

Order: `Authorization: Bearer <sid>`, else `x-api-key`, else `x-goog-api-key`, else a `key` query
parameter (the Gemini API's two ways), else a body field (`metadata.session_id`, `user`), else a path
prefix `/s/<sid>/...`. Clients set the first four from their API-key settings, so a rollout driver gives
each agent run its own key; the path prefix serves clients whose key is fixed.

A session also has a *name*, stable and safe to share: a digest of the id when the id is a credential
(bearer token, API key), else the id itself. Cassettes store the name; a replay authenticates with it, and
naming a name gives the name back, so everything derived from it (reply ids) is the same live and replayed.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ANONYMOUS = "anonymous"
_SID = re.compile(r"^[A-Za-z0-9._:@+=-]{1,200}$")
SECRET_SOURCES = frozenset({"bearer", "x-api-key", "x-goog-api-key", "query-key"})
_DIGEST_NAME = re.compile(r"sid-[0-9a-f]{16}")
# Headers that carry a credential: a session id read from one (`--session-from header:api-key`) is a secret.
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "x-api-key", "api-key", "x-goog-api-key"})


def is_secret_source(source: str) -> bool:
    """Whether a session of this source is named by a credential (digested on disk, never stored as it is):
    tito's own credential sources, and `header:NAME` for a credential header (`session_from`)."""
    kind, _, name = source.partition(":")
    return source in SECRET_SOURCES or (kind == "header" and name in CREDENTIAL_HEADERS)


def session_digest(secret: str) -> str:
    """Stable across runs and machines, so replays and re-recordings agree on the name.

    A name that already is a digest is kept: a replay authenticates with the name, and re-recording that
    replay (or re-saving a vcrpy cassette) must not digest it a second time.
    """
    if _DIGEST_NAME.fullmatch(secret):
        return secret
    return "sid-" + hashlib.sha256(b"tito-session\0" + secret.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SessionRef:
    sid: str
    source: str  # bearer, x-api-key, x-goog-api-key, query-key, body, path, anonymous

    @property
    def name(self) -> str:
        return session_digest(self.sid) if is_secret_source(self.source) else self.sid


def _valid(value: Any) -> str | None:
    if isinstance(value, str) and _SID.match(value.strip()):
        return value.strip()
    return None


def resolve_session(
    headers: Mapping[str, str], body: Any, path_sid: str | None, query: Mapping[str, str] | None = None
) -> SessionRef:
    auth = headers.get("Authorization", "")
    if auth[:7].lower() == "bearer " and (sid := _valid(auth[7:])):
        return SessionRef(sid, "bearer")
    if sid := _valid(headers.get("x-api-key", "")):
        return SessionRef(sid, "x-api-key")
    if sid := _valid(headers.get("x-goog-api-key", "")):
        return SessionRef(sid, "x-goog-api-key")
    if query is not None and (sid := _valid(query.get("key", ""))):
        return SessionRef(sid, "query-key")
    if isinstance(body, dict):
        metadata = body.get("metadata")
        if isinstance(metadata, dict) and (sid := _valid(metadata.get("session_id"))):
            return SessionRef(sid, "body")
        if sid := _valid(body.get("user")):
            return SessionRef(sid, "body")
    if path_sid and (sid := _valid(path_sid)):
        return SessionRef(sid, "path")
    return SessionRef(ANONYMOUS, "anonymous")
