"""Sessions wherever a gateway keeps them (`--session-from`, `trajectory/adapters/session_from.py`): the parser, the
rule per kind, what the cassette writer keeps (a session id that is no secret verbatim, credentials redacted) and
what a replay sends back; requests that name no session are no session's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tito_rl.cassette.format.records import Header
from tito_rl.cassette.reader import read_cassette
from tito_rl.cassette.redaction import REDACTED
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.replayer.replay.agent_leg import request_headers, request_target
from tito_rl.trajectory.adapters.session_from import (
    SessionFrom,
    SessionFromError,
    from_source,
    parse_session_from,
)
from tito_rl.trajectory.adapters.tap import AgentExchange


@pytest.mark.parametrize(
    ("text", "kind", "name", "secret"),
    [
        ("bearer", "bearer", "", True),
        ("header:X-Session-Id", "header", "x-session-id", False),
        ("header:api-key", "header", "api-key", True),
        ("cookie:sid", "cookie", "sid", False),
        ("path:/proxy/rollout/{sid}", "path", "/proxy/rollout/{sid}", False),
        ("path:/proxy/rollout/{sid}/attempt/{aid}", "path", "/proxy/rollout/{sid}/attempt/{aid}", False),
    ],
)
def test_each_kind_parses_to_its_spec(text: str, kind: str, name: str, secret: bool) -> None:
    where = parse_session_from(text)
    assert (where.kind, where.name, where.secret) == (kind, name, secret)
    assert parse_session_from(where.spec) == where  # the spec a cassette keeps reads back the same
    assert (from_source(where.spec) == where) is (kind != "bearer")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("query", "expected bearer, header:NAME"),
        ("header:", "expected bearer, header:NAME"),
        ("header:x session", "is not a header name"),
        ("cookie:a;b", "is not a cookie name"),
        ("path:proxy/{sid}", "the prefix is a path"),
        ("path:/proxy/{sid}/", "the prefix is a path"),
        ("path:/proxy/rollout", "names the session's segment once"),
        ("path:/a/{sid}/b/{sid}", "names the session's segment once"),
        ("path:/a/x{sid}", "names the session's segment once"),
        ("path:/a/{sid}/b{x}", "a placeholder is a whole segment"),
    ],
)
def test_a_bad_spec_is_one_line_naming_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(SessionFromError) as caught:
        parse_session_from(text)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_each_kind_reads_its_own_place_and_a_request_naming_none_is_no_session() -> None:
    headers = {
        "Authorization": "Bearer sk-rollout-secret-0001",
        "X-Session-Id": "ro-7",
        "Cookie": "theme=dark; sid=ro-8; other=x",
    }
    path = "/proxy/rollout/ro-9/attempt/at-1/mode/train/openai/v1/chat/completions"
    assert parse_session_from("bearer").resolve(path, headers).sid == "sk-rollout-secret-0001"
    ref = parse_session_from("header:x-session-id").resolve(path, headers)
    assert (ref.sid, ref.source, ref.name) == ("ro-7", "header:x-session-id", "ro-7")
    ref = parse_session_from("cookie:sid").resolve(path, headers)
    assert (ref.sid, ref.source, ref.name) == ("ro-8", "cookie:sid", "ro-8")
    ref = parse_session_from("path:/proxy/rollout/{sid}/attempt/{aid}").resolve(path, headers)
    assert (ref.sid, ref.source) == ("ro-9", "path:/proxy/rollout/{sid}/attempt/{aid}")
    # a credential header names a secret: its name is a digest, as a bearer token's
    ref = parse_session_from("header:authorization").resolve(path, headers)
    assert ref.sid == "sk-rollout-secret-0001" and ref.name.startswith("sid-")
    # nothing there: no session (a health check, a model list)
    for spec in ("bearer", "header:x-session-id", "cookie:sid", "path:/proxy/rollout/{sid}"):
        assert parse_session_from(spec).resolve("/healthz", {"Accept": "*/*"}) is None, spec
    assert parse_session_from("path:/proxy/rollout/{sid}").resolve("/proxy/other/ro-9/v1", headers) is None
    assert parse_session_from("path:/proxy/rollout/{sid}").resolve("/proxy/rollout", headers) is None
    # the default keeps tito's order: a gateway's /sessions/<sid>/ URL, credentials, the body, /s/<sid>/
    assert SessionFrom().resolve("/sessions/gw-1/v1/chat/completions", headers).source == "path"
    assert SessionFrom().resolve("/v1/messages", {}, None, b'{"metadata": {"session_id": "b-1"}}').sid == "b-1"
    assert SessionFrom().resolve("/s/p-1/v1/messages", {}).sid == "p-1"


def _write(file: Path, source_id: str, source: str, headers: dict[str, str], path: str, body: bytes) -> bytes:
    with CassetteWriter(file, Header("sha256:test", created="2026-01-01T00:00:00Z")) as writer:
        writer.agent_request(source_id, source, headers)
        writer.agent_exchange(
            source_id, source, AgentExchange("POST", path, "", headers, body, 200, {}, reply_body=b'{"ok": true}')
        )
        writer.session_finished(source_id, source, 1.0, [])
    return file.read_bytes()


@pytest.mark.parametrize(
    ("source", "path", "extra"),
    [
        ("header:x-session-id", "/v1/chat/completions", {"X-Session-Id": "ro-public-0007"}),
        ("cookie:sid", "/v1/chat/completions", {"Cookie": "theme=dark-cookie-secret; sid=ro-public-0007"}),
        ("path:/proxy/rollout/{sid}", "/proxy/rollout/ro-public-0007/v1/chat/completions", {}),
    ],
)
def test_a_public_session_id_stays_verbatim_and_no_secret_reaches_the_cassette(
    source: str, path: str, extra: dict[str, str], tmp_path: Path
) -> None:
    secrets = ("sk-rollout-secret-000000000000000000000000000001", "dark-cookie-secret")
    headers = {"Authorization": f"Bearer {secrets[0]}", **extra}
    body = b'{"messages": [{"role": "user", "content": "session ro-public-0007, key ' + secrets[0].encode() + b'"}]}'
    file = tmp_path / "c.tito"
    data = _write(file, "ro-public-0007", source, headers, path, body)
    assert not any(s.encode() in data for s in secrets)
    (log,) = read_cassette(file).sessions.values()
    assert log.name == "ro-public-0007" and log.source == source  # the gateway's own id, where it lives
    (record,) = log.agent
    assert record.path == path and b"session ro-public-0007" in record.body  # never scrubbed as a secret
    assert record.headers["Authorization"] == REDACTED
    # what a replay sends: the session back where the gateway reads it; the credential is not the session's
    sent = request_headers(record, log.source, log.name, 0)
    assert "Authorization" not in sent and request_target(record, log.source, log.name) == path
    if source.startswith("cookie:"):
        assert record.headers["Cookie"] == REDACTED and sent["Cookie"] == "sid=ro-public-0007"
    if source.startswith("header:"):
        assert sent["X-Session-Id"] == "ro-public-0007"


def test_a_session_from_a_credential_header_is_digested_and_put_back_on_replay(tmp_path: Path) -> None:
    key = "rollout-key-secret-0000000001"
    file = tmp_path / "c.tito"
    data = _write(file, key, "header:api-key", {"api-key": key}, "/v1/chat/completions", b"{}")
    assert key.encode() not in data
    (log,) = read_cassette(file).sessions.values()
    assert log.name.startswith("sid-") and log.source == "header:api-key"
    assert request_headers(log.agent[0], log.source, log.name, 0)["api-key"] == log.name
