"""Where a gateway keeps its session, for the agent leg: `--session-from bearer|header:NAME|cookie:NAME|
session-cookie:NAME|path:PREFIX`.

tito's own adapter (and a gateway that takes the session from the agent's API key) reads it from the
credentials (`bearer`, the default: `session.resolve_session`, and a gateway's `/sessions/<sid>/` URL). Other
gateways keep it elsewhere: a header (`x-session-id`) or a cookie, or the URL: Agent Lightning
(`/proxy/rollout/{rollout_id}/attempt/...`), NeMo Gym (`/ng-rollout/{rollout_id}/...`, or its signed session
cookie: `session-cookie:NAME`, the `session_id` inside it, as its value is signed again at every turn:
`signed_cookie.py`). `SessionFrom.resolve` says which session a request names, or None for a request that names
none (a health check, a model list): such a request is no session's.

A session's *source* (what a cassette's `SessionStart` keeps) is the spec itself (`header:x-session-id`,
`cookie:sid`, `path:/proxy/rollout/{sid}`), so a replay knows where to put the session back. An id taken from a
path, a cookie or a header that is not a credential is not a secret: it stays verbatim in the cassette, and the
replay and the finish address the gateway's own session by it. An id taken from a credential header
(`header:api-key`) is a secret, named by its digest as a bearer token is.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tito_rl.trajectory.adapters.session import _SID, CREDENTIAL_HEADERS, SessionRef, resolve_session
from tito_rl.trajectory.adapters.signed_cookie import payload_session

BEARER, HEADER, COOKIE, PATH = "bearer", "header", "cookie", "path"
SESSION_COOKIE = "session-cookie"  # a Starlette signed session cookie: its payload's `session_id`
SID = "{sid}"
GATEWAY_SESSIONS = "/sessions/"  # rllm's gateway and miles' session server: `/sessions/<sid>/v1/...`
USAGE = "bearer, header:NAME, cookie:NAME, session-cookie:NAME or path:PREFIX (e.g. path:/proxy/rollout/{sid})"


class SessionFromError(ValueError):
    """A `--session-from` that cannot be read: one line."""


@dataclass(frozen=True)
class SessionFrom:
    """Where the agent leg's requests carry their session. `kind`: bearer, header, cookie or path; `name`: the
    header's name (lower case), the cookie's, or the path prefix with `{sid}` for the session's segment (other
    `{...}` segments match any one segment)."""

    kind: str = BEARER
    name: str = ""

    @property
    def spec(self) -> str:
        """The text `--session-from` takes, and the source a cassette keeps for each session."""
        return self.kind if self.kind == BEARER else f"{self.kind}:{self.name}"

    @property
    def secret(self) -> bool:
        """Whether the session id is a credential (redacted, named by its digest)."""
        return self.kind == BEARER or (self.kind == HEADER and self.name in CREDENTIAL_HEADERS)

    @property
    def session_path(self) -> str | None:
        """For `path:` with `{sid}` its only placeholder: the prefix agents' base URLs start with (`{id}` for
        the session, as `TargetInfo.session_path` writes it); None otherwise."""
        if self.kind != PATH or self.name.count("{") != 1:
            return None
        return self.name.replace(SID, "{id}")

    def resolve(
        self, path: str, headers: Mapping[str, str], query: Mapping[str, str] | None = None, body: bytes = b""
    ) -> SessionRef | None:
        """The session a request names; None for a request that names none."""
        if self.kind == HEADER:
            value = _header(headers, self.name)
            if value is not None and self.name in ("authorization", "proxy-authorization"):
                scheme, _, token = value.partition(" ")
                value = token.strip() if token and scheme.lower() in ("bearer", "token", "basic") else value
            return _ref(value, self.spec)
        if self.kind == COOKIE:
            return _ref(cookie_value(_header(headers, "cookie") or "", self.name), self.spec)
        if self.kind == SESSION_COOKIE:
            value = cookie_value(_header(headers, "cookie") or "", self.name)
            return _ref(payload_session(value) if value else None, self.spec)
        if self.kind == PATH:
            return _ref(path_sid(self.name, path), self.spec)
        return bearer_session(path, headers, query, body)


def parse_session_from(text: str) -> SessionFrom:
    """`bearer`, `header:NAME`, `cookie:NAME`, `session-cookie:NAME` or `path:PREFIX`; a bad one is a one-line
    `SessionFromError`."""
    text = (text or "").strip()
    if text == BEARER:
        return SessionFrom()
    kind, colon, name = text.partition(":")
    name = name.strip()
    if not colon or kind not in (HEADER, COOKIE, SESSION_COOKIE, PATH) or not name:
        raise SessionFromError(f"--session-from {text!r}: expected {USAGE}")
    if kind == HEADER:
        if not _token(name):
            raise SessionFromError(f"--session-from {text!r}: {name!r} is not a header name")
        return SessionFrom(HEADER, name.lower())
    if kind in (COOKIE, SESSION_COOKIE):
        if not _token(name):
            raise SessionFromError(f"--session-from {text!r}: {name!r} is not a cookie name")
        return SessionFrom(kind, name)
    segments = name.split("/")
    if not name.startswith("/") or name.endswith("/") or "" in segments[1:] or any(c in name for c in "?# "):
        raise SessionFromError(
            f"--session-from {text!r}: the prefix is a path, '/seg/...', with no empty or trailing segment"
        )
    if segments.count(SID) != 1:
        raise SessionFromError(f"--session-from {text!r}: the prefix names the session's segment once, as {SID}")
    for segment in segments[1:]:
        if ("{" in segment or "}" in segment) and not (
            segment.startswith("{") and segment.endswith("}") and segment[1:-1].isidentifier()
        ):
            raise SessionFromError(f"--session-from {text!r}: a placeholder is a whole segment, {{name}}")
    return SessionFrom(PATH, name)


def from_source(source: str) -> SessionFrom | None:
    """A cassette session's source back as where its id lives (None for tito's older sources: bearer,
    x-api-key, query-key, body, path, ...)."""
    if source.split(":", 1)[0] not in (HEADER, COOKIE, SESSION_COOKIE, PATH) or ":" not in source:
        return None
    try:
        return parse_session_from(source)
    except SessionFromError:
        return None


def bearer_session(
    path: str, headers: Mapping[str, str], query: Mapping[str, str] | None = None, body: bytes = b""
) -> SessionRef | None:
    """tito's default rule: a gateway's `/sessions/<sid>/` URL first (the gateway's own session, which all of a
    rollout's agents sharing one API key still tell apart), then the credentials, a body's session fields and
    tito's `/s/<sid>/` path (`session.resolve_session`). None: the request names no session."""
    if path.startswith(GATEWAY_SESSIONS):
        sid, slash, _ = path[len(GATEWAY_SESSIONS) :].partition("/")
        if sid and slash and _SID.match(sid):
            return SessionRef(sid, "path")
    prefixed = None
    if path.startswith("/s/"):
        prefixed = path[3:].partition("/")[0] or None
    ref = resolve_session(headers, None, prefixed, query)
    if ref.source in ("anonymous", "path") and body:  # only then is the body worth parsing (tito's order:
        with contextlib.suppress(ValueError):  # credentials, then the body's metadata, then the path)
            ref = resolve_session(headers, json.loads(body), prefixed, query)
    return None if ref.source == "anonymous" else ref


def path_sid(template: str, path: str) -> str | None:
    """The `{sid}` segment of `path` where it starts with `template`'s segments; None where it does not."""
    want, have = template.split("/")[1:], path.split("/")[1:]
    if len(have) < len(want):
        return None
    sid = None
    for pattern, segment in zip(want, have, strict=False):
        if pattern == SID:
            sid = segment
        elif pattern.startswith("{"):
            if not segment:
                return None
        elif pattern != segment:
            return None
    return sid


def cookie_value(header: str, name: str) -> str | None:
    """One cookie's value from a `Cookie` header (`a=1; sid=xyz`), quotes removed."""
    for part in header.split(";"):
        key, eq, value = part.strip().partition("=")
        if eq and key.strip() == name:
            return value.strip().strip('"')
    return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name and value.strip():
            return value.strip()
    return None


def _ref(value: Any, source: str) -> SessionRef | None:
    if isinstance(value, str) and _SID.match(value.strip()):
        return SessionRef(value.strip(), source)
    return None


def _token(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "-_." for c in name)
