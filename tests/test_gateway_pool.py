"""Gateways kept started between cassettes (`recorder/targets/gateway_pool.py`): a replay run and a pytest process
of the plugin start a driver's gateway once. The pool's rules with a driver double (no gateway process): one
gateway for cassettes of the same target and settings where the driver can be cleared (its `reset` between them),
one per cassette where it cannot, a fresh one after a harness that left work in flight or a reset that failed, the
engine leg handed to whoever holds the gateway now. Then the plugin through verifiers' real server: a session
failing mid-replay is named, the sessions after it in the same, once-started gateway replay green against their
goldens.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import CassetteReader
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.recorder.targets import gateway_pool
from tito_rl.recorder.targets.base import TargetInfo, TargetOptions
from tito_rl.recorder.targets.gateway_pool import GatewayPool

ROOT = Path(__file__).resolve().parent.parent


class Driver:
    """A driver double: `start` serves nothing but says where; counts its starts, stops and resets."""

    log: list[str] = []

    def __init__(self, name: str, resettable: bool, version: str = "1") -> None:
        self.info = TargetInfo(name=name, version=version)
        self.engine_url = ""
        self.fail_reset = False
        if resettable:
            self.reset = self._reset

    async def start(self, engine_url: str) -> str:
        self.engine_url = engine_url
        self.log.append(f"start {self.info.name}")
        return f"http://gateway-{self.info.name}/"

    async def stop(self) -> None:
        self.log.append(f"stop {self.info.name}")

    async def _reset(self) -> None:
        self.log.append(f"reset {self.info.name}")
        if self.fail_reset:
            raise RuntimeError("the gateway is gone")


async def holder(request: web.Request) -> web.Response:
    return web.json_response({"held": True})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_resettable_gateway_serves_every_cassette_of_its_settings_reset_between_them() -> None:
    Driver.log = []

    async def main() -> None:
        pool, options = GatewayPool(), TargetOptions()
        first = await pool.borrow("vf", options, Driver("vf", True), "a.tito", holder)
        assert first.url == "http://gateway-vf"
        await pool.give_back(first, quiet=True)
        again = await pool.borrow("vf", options, Driver("vf", True), "b.tito", holder)
        assert again is first  # another cassette, the same started gateway
        await pool.give_back(again, quiet=True)
        other = await pool.borrow("vf", options, Driver("vf", True, version="2"), "b.tito", holder)
        assert other is not first  # the driver says other settings of itself: a gateway of its own
        await pool.give_back(other, quiet=True)
        changed = await pool.borrow("vf", TargetOptions(tool_parser="other"), Driver("vf", True), "b.tito", holder)
        assert changed not in (first, other)
        await pool.give_back(changed, quiet=True)
        assert pool.started == {"vf": 3}
        await pool.close()

    run(main())
    assert (
        Driver.log
        == ["start vf", "reset vf", "reset vf", "start vf", "reset vf", "start vf", "reset vf"] + ["stop vf"] * 3
    )


def test_a_gateway_that_cannot_be_reset_serves_one_cassette_and_stops_for_the_next() -> None:
    Driver.log = []

    async def main() -> None:
        pool, options = GatewayPool(), TargetOptions()
        lease = await pool.borrow("agl", options, Driver("agl", False), "a.tito", holder)
        await pool.give_back(lease, quiet=True)
        assert await pool.borrow("agl", options, Driver("agl", False), "a.tito", holder) is lease  # a's next session
        await pool.give_back(lease, quiet=True)
        assert Driver.log == ["start agl"]
        other = await pool.borrow("agl", options, Driver("agl", False), "b.tito", holder)
        assert other is not lease and Driver.log == ["start agl", "stop agl", "start agl"]
        await pool.give_back(other, quiet=True)
        await pool.stop_unshared()  # b's sessions are done (the plugin, at the cassette's teardown)
        assert not pool.idle and Driver.log[-1] == "stop agl"
        again = await pool.borrow("agl", options, Driver("agl", False), "b.tito", holder)
        assert again is not other
        await pool.give_back(again, quiet=True)
        await pool.close()

    run(main())
    assert Driver.log == ["start agl", "stop agl", "start agl", "stop agl", "start agl", "stop agl"]


def test_a_gateway_left_busy_or_failing_its_reset_is_stopped_and_the_next_harness_starts_afresh() -> None:
    Driver.log = []

    async def main() -> None:
        pool, options = GatewayPool(), TargetOptions()
        lease = await pool.borrow("vf", options, Driver("vf", True), "a.tito", holder)
        await pool.give_back(lease, quiet=False)  # an agent request still in flight, or the harness raised
        assert not pool.idle
        broken = Driver("vf", True)
        broken.fail_reset = True
        lease = await pool.borrow("vf", options, broken, "a.tito", holder)
        await pool.give_back(lease, quiet=True)
        assert not pool.idle and pool.started == {"vf": 2}
        await pool.close()

    run(main())
    assert Driver.log == ["start vf", "stop vf", "start vf", "reset vf", "stop vf"]


def test_the_engine_leg_answers_for_whoever_holds_the_gateway_and_503_between_holders() -> None:
    async def main() -> None:
        pool = GatewayPool()
        driver = Driver("vf", True)
        lease = await pool.borrow("vf", TargetOptions(), driver, "a.tito", holder)
        async with aiohttp.ClientSession() as http:
            async with http.post(driver.engine_url + "/generate", json={}) as resp:
                assert resp.status == 200 and await resp.json() == {"held": True}
            await pool.give_back(lease, quiet=True)
            async with http.post(driver.engine_url + "/generate", json={}) as resp:
                assert resp.status == 503
                assert "no cassette is being replayed now" in (await resp.json())["error"]["message"]
        await pool.close()

    run(main())


def test_pooled_is_what_harnesses_borrow_from_and_closes_the_pool_it_made() -> None:
    Driver.log = []

    async def main() -> None:
        assert gateway_pool.active() is None
        async with gateway_pool.pooled() as pool:
            assert gateway_pool.active() is pool
            lease = await pool.borrow("vf", TargetOptions(), Driver("vf", True), "a.tito", holder)
            await pool.give_back(lease, quiet=True)
        assert gateway_pool.active() is None

    run(main())
    assert Driver.log == ["start vf", "reset vf", "stop vf"]


def changed_copy(source: Path, out: Path) -> None:
    """`source` with its first engine request's sampling changed (a temperature the replayed gateway does not
    send): that session's replay fails at that call, mid-session, with a request held in the gateway."""
    with CassetteReader(source) as reader:
        header, records = reader.header, list(reader.records())
    first = next(r for r in records if isinstance(r, EngineRecord) and r.path == "/inference/v1/generate")
    first.request = json.loads(json.dumps(first.request))
    first.request["sampling_params"]["temperature"] = 0.25
    with CassetteWriter(out, header, header_redacted=True) as writer:
        for record in records:
            writer.append_redacted(record)


@pytest.mark.slow
def test_the_plugin_replays_every_verifiers_session_in_one_gateway_a_failure_named_the_rest_green(
    tmp_path: Path,
) -> None:
    from tito_rl.recorder.targets.base import TargetUnavailable
    from tito_rl.recorder.targets.own_python.envs import gateway_python

    try:
        gateway_python("verifiers")
    except TargetUnavailable as exc:
        pytest.skip(str(exc))
    cassettes = tmp_path / "cassettes"
    cassettes.mkdir()
    targets = ROOT / "cassettes" / "targets"
    changed_copy(targets / "verifiers_qwen_tool_loop.tito", cassettes / "a_changed.tito")
    shutil.copy(targets / "verifiers_qwen_tool_loop.golden", cassettes / "a_changed.golden")
    for name in ("verifiers_mixed", "verifiers_opencode_tool_loop"):
        for suffix in (".tito", ".golden"):
            shutil.copy(targets / f"{name}{suffix}", cassettes / f"{name}{suffix}")
    for suffix in (".tito", ".golden"):
        shutil.copy(targets / f"rllm_qwen_tool_loop{suffix}", cassettes / f"rllm_qwen_tool_loop{suffix}")
    (tmp_path / "test_after.py").write_text(
        "import threading\n"
        "from tito_rl.recorder.targets.rllm import THREAD_NAME\n\n"
        "def test_no_gateway_thread_outlives_its_cassette():\n"
        "    assert not any(t.name == THREAD_NAME for t in threading.enumerate())\n"
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(
        "def pytest_sessionfinish(session):\n"
        "    from tito_rl.replayer.pytest_plugin.plugin import gateways\n"
        "    print('gateways started:', sorted(gateways.pool.started.items()))\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-v", "-s"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TITO_VERIFIERS_C"))},
    )
    out = run.stdout
    assert run.returncode == 1, out[-3000:] + run.stderr[-2000:]
    assert "1 failed, 7 passed" in out, out[-3000:]
    assert "FAILED cassettes/a_changed.tito::sid-4521a670f3f5d5c6" in out
    assert "engine request differs at sampling_params.temperature: recorded 0.25, replayed '<absent>'" in out
    # the failing session's gateway, cleared, served the five after it; rllm's in-process gateway (its own thread)
    # was stopped once its cassette's items were done, before the test after them
    assert "gateways started: [('rllm', 1), ('verifiers', 1)]" in out
    assert "test_after.py::test_no_gateway_thread_outlives_its_cassette PASSED" in out
