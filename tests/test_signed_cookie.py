"""A Starlette signed session cookie as a session (`--session-from session-cookie:NAME`, NeMo Gym's
`VLLMModel___policy_model`): the id inside names the session whatever the value's timestamp, a replay signs the id
again so the gateway's own signer accepts it (checked with itsdangerous in NeMo Gym's Python where it is installed),
and the scripted client keeps each session's cookie apart."""

from __future__ import annotations

import base64
import subprocess
import time
from pathlib import Path

import pytest

from tito_rl.cassette.format.records import AgentRecord
from tito_rl.cassette.redaction import REDACTED
from tito_rl.replayer.replay.agent_leg import request_headers
from tito_rl.trajectory.adapters.session_from import SessionFromError, from_source, parse_session_from
from tito_rl.trajectory.adapters.signed_cookie import payload_session, sign_session

NAME = "VLLMModel___policy_model"
SPEC = f"session-cookie:{NAME}"


def test_the_id_inside_names_the_session_while_the_signed_value_changes_from_turn_to_turn() -> None:
    where = parse_session_from(SPEC)
    assert where.spec == SPEC and not where.secret and from_source(SPEC) == where
    first, later = sign_session("rollout-a", NAME, 1_800_000_000), sign_session("rollout-a", NAME, 1_800_000_007)
    assert first != later  # NeMo Gym signs it again at every response: a new timestamp
    for value in (first, later):
        ref = where.resolve("/v1/chat/completions", {"Cookie": f"other=1; {NAME}={value}"})
        assert ref is not None and (ref.sid, ref.name, ref.source) == ("rollout-a", "rollout-a", SPEC)
    other = where.resolve("/v1/chat/completions", {"cookie": f"{NAME}={sign_session('rollout-b', NAME, 1)}"})
    assert other is not None and other.sid == "rollout-b"
    assert where.resolve("/v1/chat/completions", {}) is None  # a first request with no cookie names no session
    assert where.resolve("/v1/chat/completions", {"Cookie": f"{NAME}=not-a-signed-session"}) is None
    assert payload_session("e30=.x.y") is None  # `{}`: no session_id in it


def test_a_bad_session_cookie_spec_is_one_line() -> None:
    with pytest.raises(SessionFromError, match="is not a cookie name"):
        parse_session_from("session-cookie:a b")
    with pytest.raises(SessionFromError, match="session-cookie:NAME"):
        parse_session_from("session-cookies:x")


def test_a_replay_sends_the_session_id_signed_again_with_the_gateways_key() -> None:
    record = AgentRecord("rollout-a", 0, "POST", "/v1/chat/completions", "", {"Cookie": REDACTED}, b"{}", 200, {})
    before = int(time.time())
    headers = request_headers(record, SPEC, "rollout-a", 0)
    name, _, value = headers["Cookie"].partition("=")
    assert name == NAME and payload_session(value) == "rollout-a"
    stamp = value.split(".")[1]
    assert int.from_bytes(base64.urlsafe_b64decode(stamp + "=" * (-len(stamp) % 4)), "big") >= before


def test_nemo_gyms_own_signer_accepts_the_cookie_tito_signs() -> None:
    """itsdangerous' TimestampSigner, as Starlette's SessionMiddleware uses it, in NeMo Gym's Python."""
    from tito_rl.recorder.targets.base import TargetUnavailable
    from tito_rl.recorder.targets.own_python.envs import gateway_python

    try:
        python = gateway_python("nemogym")
    except TargetUnavailable as exc:
        pytest.skip(str(exc))
    value = sign_session("ng-cookie-a", NAME, int(time.time()))
    check = (
        "import base64, json, sys, itsdangerous\n"
        "data = itsdangerous.TimestampSigner(sys.argv[1]).unsign(sys.argv[2], max_age=14 * 24 * 3600)\n"
        "print(json.loads(base64.b64decode(data))['session_id'])\n"
    )
    run = subprocess.run([python, "-c", check, NAME, value], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-500:]
    assert run.stdout.strip() == "ng-cookie-a"


def test_the_scripted_client_mints_its_own_cookie_then_keeps_what_the_gateway_sets(tmp_path: Path) -> None:
    """Two sessions against one server that signs the cookie again at each answer: each sends its own, never the
    other's (no shared cookie jar)."""
    import asyncio

    from aiohttp import web

    from tito_rl.recorder.scripted.client import run_script
    from tito_rl.recorder.scripted.script import load_client_script

    seen: list[tuple[str, str | None]] = []
    answers = {"n": 0}

    async def chat(request: web.Request) -> web.Response:
        value = request.cookies.get(NAME, "")
        sid = payload_session(value) or ""
        seen.append((sid, value))
        answers["n"] += 1
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}],
        }
        response = web.json_response(reply)
        response.set_cookie(NAME, sign_session(sid, NAME, 1_800_000_000 + answers["n"]))  # a new value each time
        return response

    async def finish(request: web.Request) -> web.Response:
        return web.json_response({"samples": []})

    scenario = tmp_path / "s.yaml"
    sessions = "".join(
        f"""
    - id: s-{x}
      wire: chat
      stream: false
      session_cookie: {NAME}
      system: session {x}
      steps: [{{prompt: one}}, {{prompt: two}}, {{prompt: three}}]
"""
        for x in "ab"
    )
    scenario.write_text(f"name: s\nsessions: []\nclient:\n  sessions:{sessions}")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        app.router.add_post("/tito/sessions/{sid}/finish", finish)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            results = await run_script(load_client_script(scenario), f"http://127.0.0.1:{port}", timeout_s=60)
            assert all(r.error is None for r in results), [r.error for r in results]
        finally:
            await runner.cleanup()

    asyncio.run(main())
    for sid in ("s-a", "s-b"):
        values = [value for s, value in seen if s == sid]
        assert len(values) == 3 and len(set(values)) == 3  # minted, then each value the server set
    assert {s for s, _ in seen} == {"s-a", "s-b"}
