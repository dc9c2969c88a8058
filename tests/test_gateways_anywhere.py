"""Gateways tito was not built for, as processes of their own (`--target http://`), over real HTTP on loopback:
sessions in a header, a cookie or the URL (`--session-from`), a gateway with no session API (no samples: the
recording replays green on its replies and engine calls), requests that name no session (passed through, never a
session), and a gateway whose finish fails (a failure, not "no samples"). The gateway is `tests/gateway_double.py`
started with `--sessions-in` (its own reading of where its sessions are) and `--no-session-api`.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.gateway_double import VOLATILE
from tests.process_helpers import ROOT, free_port, stop, tito, wait_http
from tests.test_gateway_double import gateway, volatile_flags
from tests.test_targets_record_replay import record, replay
from tito_rl.cassette.format.records import EngineRecord, Header
from tito_rl.cassette.reader import read_cassette
from tito_rl.cassette.redaction import REDACTED
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.recorder.taps.around import TapsAround
from tito_rl.recorder.targets.base import TargetFailure
from tito_rl.recorder.targets.http import HttpTarget
from tito_rl.trajectory.adapters.tap import AgentExchange
from tito_rl.trajectory.tokens.tokenizer import fingerprint

SECRET = "sk-rollout-secret-0123456789abcdef0123456789abcdef"
COOKIE_SECRET = "dark-cookie-secret-42"
ENGINE = """\
name: gateways_anywhere
after_last: error
sessions:
  - match: {prompt_contains: "the apples"}
    turns:
      - {reasoning: I count them., text: Counting., tool_calls: [{name: shell, arguments: {command: ls apples}}]}
      - {text: There are three apples.}
  - match: {prompt_contains: "the pears"}
    turns:
      - {reasoning: I look., text: Looking., tool_calls: [{name: shell, arguments: {command: ls pears}}]}
      - {reasoning: Two files., text: There are two pears.}
"""
# where the double keeps its sessions, and how the scripted client sends them there
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "header": ("header:x-session-id", {"headers": {"X-Session-Id": "{id}"}}),
    "cookie": ("cookie:sid", {"headers": {"Cookie": f"theme={COOKIE_SECRET}; sid={{id}}"}}),
    "path": ("path:/proxy/rollout/{sid}/attempt/{aid}", {"path_prefix": "/proxy/rollout/{id}/attempt/at-1"}),
}


def scenario(tmp_path: Path, kind: str, finish: bool = True) -> Path:
    _, how = KINDS[kind]
    sessions = [
        {
            "id": f"ro-apples-{kind}",
            "wire": "chat",
            "stream": True,
            "system": "You count fruit.",
            "tools": ["Bash"],
            "results": {"Bash": "a1\\na2\\na3"},
            "api_key": SECRET,
            **how,
            "steps": [{"prompt": "How many are the apples?"}] + ([{"finish": 1.0}] if finish else []),
        },
        {
            "id": f"ro-pears-{kind}",
            "wire": "anthropic",
            "stream": False,
            "system": "You count fruit.",
            "tools": ["Bash"],
            "results": {"Bash": "p1\\np2"},
            "api_key": SECRET,
            **how,
            "steps": [{"prompt": "How many are the pears?"}, {"drop": True}],
        },
    ]
    path = tmp_path / f"{kind}.yaml"
    path.write_text(ENGINE + "client:\n  concurrency: 1\n  sessions: " + json.dumps(sessions) + "\n")
    return path


def record_around(tmp_path: Path, kind: str, *double: str, finish: bool = True) -> Path:
    spec, _ = KINDS[kind]
    script = scenario(tmp_path, kind, finish)
    out, listen, port = tmp_path / f"{kind}.tito", free_port(), free_port()
    with (
        tito(
            "fake-engine",
            "--script",
            str(script),
            "--listen",
            f"127.0.0.1:{port}",
            ready=f"http://127.0.0.1:{port}/health",
        ),
        gateway(f"http://127.0.0.1:{listen}", "--sessions-in", spec, *double) as url,
    ):
        record(
            out,
            f"http://127.0.0.1:{port}",
            script,
            "--target",
            url,
            "--engine-listen",
            f"127.0.0.1:{listen}",
            "--session-from",
            spec,
            *volatile_flags(),
            *(("--routing-header", "none") if "--no-routing-key" in double else ()),
        )
    return out


def replay_through(out: Path, kind: str, *double: str) -> list[tuple[int, str]]:
    """Replays (goldens first, then twice) through a fresh double started as the recorded one was."""
    spec, _ = KINDS[kind]
    listen = free_port()
    runs = []
    with gateway(f"http://127.0.0.1:{listen}", "--sessions-in", spec, *double) as url:
        args = (str(out), "--target", url, "--engine-listen", f"127.0.0.1:{listen}")
        for extra in (("--update-goldens",), (), ()):
            run = replay(*args, *extra)
            runs.append((run.returncode, run.stdout + run.stderr))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["header", "cookie"])
def test_sessions_in_a_header_or_a_cookie_are_recorded_verbatim_and_replayed_twice_identical(
    tmp_path: Path, kind: str
) -> None:
    out = record_around(tmp_path, kind)
    data = out.read_bytes()
    assert SECRET.encode() not in data and COOKIE_SECRET.encode() not in data  # credentials never reach disk
    cassette = read_cassette(out)
    assert cassette.header.target["session_from"] == KINDS[kind][0]
    logs = cassette.sessions
    assert set(logs) == {f"ro-apples-{kind}", f"ro-pears-{kind}"}  # the gateway's own ids, not digests
    assert {log.source for log in logs.values()} == {KINDS[kind][0]}
    apples, pears = logs[f"ro-apples-{kind}"], logs[f"ro-pears-{kind}"]
    assert apples.samples and pears.samples == []  # finished through the gateway's API; dropped
    for log in logs.values():
        assert all(a.headers["Authorization"] == REDACTED for a in log.agent)
        if kind == "header":
            assert all(a.headers["X-Session-Id"] == log.name for a in log.agent)
        else:
            assert all(a.headers["Cookie"] == REDACTED for a in log.agent)
        # engine calls attributed by the double's routing key: the gateway's own id, verbatim
        assert log.engine and all(e.headers.get("X-SMG-Routing-Key") == log.name for e in log.engine)
    runs = replay_through(out, kind)
    assert [rc for rc, _ in runs] == [0, 0, 0], runs[-1][1]
    assert runs[1][1] == runs[2][1] and "2 session(s): 2 ok" in runs[1][1]


@pytest.mark.slow
def test_sessions_in_the_url_through_a_gateway_without_a_session_api_replay_green(tmp_path: Path) -> None:
    """Agent Lightning's shape: the session in the URL, no routing key, no session API. The sessions were never
    finished live (the gateway offers no samples), and replay verifies their replies and engine calls."""
    double = ("--no-session-api", "--no-routing-key")
    out = record_around(tmp_path, "path", *double)
    cassette = read_cassette(out)
    assert SECRET.encode() not in out.read_bytes()
    logs = cassette.sessions
    assert set(logs) == {"ro-apples-path", "ro-pears-path"}
    for log in logs.values():
        assert log.samples == [] and log.source == "path:/proxy/rollout/{sid}/attempt/{aid}"
        assert all(a.path.startswith(f"/proxy/rollout/{log.name}/attempt/at-1/v1/") for a in log.agent)
        prompts = [json.dumps(e.request) for e in log.engine if isinstance(e, EngineRecord)]
        assert len(prompts) == 2  # each session's own two generations, attributed without a routing key
    runs = replay_through(out, "path", *double)
    assert [rc for rc, _ in runs] == [0, 0, 0], runs[-1][1]
    assert runs[1][1] == runs[2][1] and "2 session(s): 2 ok" in runs[1][1]
    assert "no samples on either side" in runs[1][1]
    golden = out.with_suffix(".golden").read_text()
    assert "== session ro-apples-path ==\nno samples on either side at 1 finish(es): 2 exchange(s) verified" in golden


@pytest.mark.slow
def test_samples_on_one_side_only_say_which_side_has_what(tmp_path: Path) -> None:
    out = record_around(tmp_path, "header")  # the gateway had a session API: ro-apples-header has samples
    runs = replay_through(out, "header", "--no-session-api")  # now it has none
    rc, text = runs[1]
    assert rc == 1 and "sample(s), the target offered none" in text, text


def test_requests_that_name_no_session_pass_through_and_are_no_session(tmp_path: Path) -> None:
    out, listen, port, engine = tmp_path / "sessionless.tito", free_port(), free_port(), free_port()
    spec = KINDS["header"][0]
    body = json.dumps(
        {
            "model": "m",
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": "You count fruit."},
                {"role": "user", "content": "How many are the apples?"},
            ],
        }
    )
    with (
        tito(
            "fake-engine",
            "--script",
            str(scenario(tmp_path, "header")),
            "--listen",
            f"127.0.0.1:{engine}",
            ready=f"http://127.0.0.1:{engine}/health",
        ),
        gateway(f"http://127.0.0.1:{listen}", "--sessions-in", spec) as url,
        tito(
            "record",
            "--engine",
            f"http://127.0.0.1:{engine}",
            "--target",
            url,
            "--engine-listen",
            f"127.0.0.1:{listen}",
            "--listen",
            f"127.0.0.1:{port}",
            "--out",
            str(out),
            "--session-from",
            spec,
            ready=f"http://127.0.0.1:{port}/health",
        ) as rec,
    ):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=30) as resp:
            assert json.loads(resp.read())["data"][0]["id"] == "double"  # passed through to the gateway
        headers = {"X-Session-Id": "ro-one", "Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", data=body.encode(), method="POST", headers=headers
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            assert resp.status == 200
        rec.send_signal(signal.SIGINT)
        err = rec.communicate(timeout=30)[1].decode()
    assert set(read_cassette(out).sessions) == {"ro-one"}  # no "anonymous" session of the health checks
    assert "request(s) named no session: passed through, not recorded: GET /health" in err, err
    assert "GET /v1/models (1)" in err, err
    # the live line's last counts: the session, its turn and tokens (the gateway's finish at stop gave samples)
    last = [line for line in err.splitlines() if line.startswith("tito record: sessions")][-1]
    assert re.fullmatch(
        r"tito record: sessions 1 \(finished 1\) \| turns 1 \(\+0 side\) \| tokens [1-9]\d* in, "
        r"[1-9]\d* out \| errors 0 \| [2-9]\d* without a session",
        last,
    ), last


class _Finishing:
    """A gateway's session API answering `status` (or not listening at all)."""

    def __init__(self, status: int) -> None:
        self.status = status

    async def handle(self, request: web.Request) -> web.Response:
        return web.json_response({"detail": "boom"} if self.status != 200 else {"ok": True}, status=self.status)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(404, None), (405, None), (200, None), (500, "answered 500"), (401, "answered 401"), (None, "did not answer")],
)
async def test_the_http_target_tells_a_failing_finish_from_one_that_offers_no_samples(
    status: int | None, outcome: str | None
) -> None:
    runner = None
    port = free_port()
    if status is not None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", _Finishing(status).handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    target = HttpTarget(f"http://127.0.0.1:{port}", VOLATILE)
    await target.start("http://127.0.0.1:1")
    try:
        if outcome is None:
            assert await target.finish("ro-1", 1.0) is None  # no session API: no samples, not a failure
            assert await target.drop("ro-1") is (status == 200)
        else:
            with pytest.raises(TargetFailure, match=outcome):
                await target.finish("ro-1", 1.0)
            with pytest.raises(TargetFailure, match=outcome):
                await target.drop("ro-1")
    finally:
        await target.stop()
        if runner is not None:
            await runner.cleanup()


# --- rllm's model gateway started as a process: no session API, no routing key, sessions in the URL ----------

RLLM_VOLATILE = ("id", "created", "choices[*].message.tool_calls[*].id", "choices[*].delta.tool_calls[*].id")


@contextmanager
def rllm_gateway(worker: str, tmp_path: Path) -> Iterator[str]:
    """`rllm-model-gateway` as a team starts it, its worker the engine tap (replay's engine), its health checks a
    day apart (through tito they would be engine calls; a replay answers them anyway)."""
    exe = shutil.which("rllm-model-gateway", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("rllm-model-gateway (a dev dependency) is not installed")
    config = tmp_path / "rllm.yaml"
    config.write_text("health_check_interval: 86400\n")
    port = free_port()
    proc = subprocess.Popen(
        [
            exe,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker",
            worker,
            "--store",
            "memory",
            "--config",
            str(config),
            "--log-level",
            "WARNING",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@pytest.mark.slow
def test_a_recording_around_rllms_gateway_as_a_process_replays_green_twice_identical(tmp_path: Path) -> None:
    sessions = [
        {
            "id": f"ro-{fruit}-rllm",
            "wire": "chat",
            "stream": stream,
            "system": "You count fruit.",
            "tools": ["Bash"],
            "results": {"Bash": files},
            "api_key": SECRET,
            "path_prefix": "/sessions/{id}",
            "steps": [{"prompt": f"How many are the {fruit}?"}, {"finish": 1.0}],
        }
        for fruit, stream, files in (("apples", True, "a1\\na2\\na3"), ("pears", False, "p1\\np2"))
    ]
    script = tmp_path / "rllm.yaml.scenario"
    script.write_text(ENGINE + "client:\n  concurrency: 1\n  sessions: " + json.dumps(sessions) + "\n")
    out, listen, port = tmp_path / "rllm.tito", free_port(), free_port()
    flags = [
        "--routing-header",
        "none",
        "--session-from",
        "path:/sessions/{sid}",
        "--engine-dialect",
        "vllm-openai",
        *[f for v in RLLM_VOLATILE for f in ("--volatile", v)],
    ]
    with (
        tito(
            "fake-engine",
            "--script",
            str(script),
            "--listen",
            f"127.0.0.1:{port}",
            "--openai-dialect",
            "vllm-openai",
            ready=f"http://127.0.0.1:{port}/health",
        ),
        rllm_gateway(f"http://127.0.0.1:{listen}/v1", tmp_path) as url,
    ):
        run = record(
            out, f"http://127.0.0.1:{port}", script, "--target", url, "--engine-listen", f"127.0.0.1:{listen}", *flags
        )
    assert "finished, the target offers no samples" in run.stderr, run.stderr[-2000:]
    cassette = read_cassette(out)
    assert SECRET.encode() not in out.read_bytes()
    assert set(cassette.sessions) == {"ro-apples-rllm", "ro-pears-rllm"}
    for log in cassette.sessions.values():
        assert log.samples == [] and all(a.path.startswith(f"/sessions/{log.name}/v1/") for a in log.agent)
        assert [e.path for e in log.engine] == ["/v1/chat/completions"] * 2 and log.agent[-1].status == 200
    listen = free_port()
    with rllm_gateway(f"http://127.0.0.1:{listen}/v1", tmp_path) as url:
        args = (str(out), "--target", url, "--engine-listen", f"127.0.0.1:{listen}")
        runs = [replay(*args, *extra) for extra in (("--update-goldens",), (), ())]
    assert [r.returncode for r in runs] == [0, 0, 0], runs[-1].stdout + runs[-1].stderr
    assert runs[1].stdout == runs[2].stdout and "2 session(s): 2 ok" in runs[1].stdout
    golden = out.with_suffix(".golden").read_text()
    assert golden.count("no samples on either side at 1 finish(es): 2 exchange(s) verified") == 2, golden


@pytest.mark.parametrize(("status", "answer", "kind"), [(500, 502, "target_failed"), (404, 404, "no_samples")])
async def test_the_agent_tap_tells_the_agent_a_failed_finish_from_one_without_samples(
    tmp_path: Path, status: int, answer: int, kind: str
) -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _Finishing(status).handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    writer = CassetteWriter(tmp_path / "finish.tito", Header("sha256:test"))
    around = TapsAround(writer, HttpTarget(f"http://127.0.0.1:{port}"), "http://127.0.0.1:1")
    try:
        ends = await around.start(("127.0.0.1", 0), ("127.0.0.1", 0))
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{ends.agent_url}/tito/sessions/ro-1/finish", json={"reward": 1.0}) as resp,
        ):
            assert resp.status == answer
            error = (await resp.json())["error"]
        assert error["type"] == kind
        if status == 500:
            assert "finish (POST /tito/sessions/ro-1/finish) answered 500" in error["message"]
        async with aiohttp.ClientSession() as http, http.delete(f"{ends.agent_url}/tito/sessions/ro-1") as resp:
            assert resp.status == (502 if status == 500 else 200)  # a failed drop is the gateway's failure too
    finally:
        await around.stop()
        writer.close()
        await runner.cleanup()


def test_an_anonymous_session_of_health_checks_in_an_older_recording_is_not_replayed(tmp_path: Path) -> None:
    """An older tito made the readiness checks' `GET /health` around a gateway an `anonymous` session, which
    failed replay; such a session (no engine call) is skipped, saying why."""
    out = tmp_path / "old.tito"
    target: dict[str, Any] = {
        "kind": "http",
        "ref": "http://127.0.0.1:1",
        "name": "http",
        "version": None,
        "volatile": [],
        "routing_header": None,
        "settings": {},
    }
    header = Header(fingerprint(), target=target)
    with CassetteWriter(out, header) as writer:
        for _ in range(2):
            writer.agent_request("anonymous", "anonymous", {"Accept": "*/*"})
            writer.agent_exchange(
                "anonymous",
                "anonymous",
                AgentExchange("GET", "/health", "", {"Accept": "*/*"}, b"", 200, {}, reply_body=b'{"ok":true}'),
            )
    listen = free_port()
    with gateway(f"http://127.0.0.1:{listen}") as url:
        run = replay(str(out), "--target", url, "--engine-listen", f"127.0.0.1:{listen}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "skipped (requests that named no session (health checks, model lists): not a session)" in run.stdout
