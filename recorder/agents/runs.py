"""`tito record --agent`: run the pinned real CLI per session against the recording proxy, then finish
each session through the session API so its samples land in the cassette with the given reward.
With `--scenario`, the scenario's CLI script (`recorder/agents/cli_script.py`) says what each session runs."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, TypeVar

import aiohttp

from tito_rl.recorder.agents.cli_script import CliScript
from tito_rl.recorder.agents.pins import pin_for
from tito_rl.recorder.agents.sandbox import SandboxError
from tito_rl.recorder.agents.sessions import SessionPlan, run_sessions, sandbox_factory

T = TypeVar("T")


def agent_header(name: str, script: CliScript | None = None) -> dict[str, Any]:
    """The CLI's pin; a scenario's name too, and for a script of several CLIs, each one's version."""
    agents = script.agents if script is not None else [name]
    if len(agents) > 1:
        header: dict[str, Any] = {"client": "mixed", "agents": {a: pin_for(a).version for a in agents}}
    else:
        pin = pin_for(agents[0])
        header = {"client": pin.name, "package": pin.package, "version": pin.version}
    return header | ({"scenario": script.name} if script is not None else {})


async def finish_session(base_url: str, session_id: str, reward: float) -> int:
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{base_url}/tito/sessions/{session_id}/finish", json={"reward": reward}) as resp,
    ):
        data = await resp.json()
        return len(data.get("samples", [])) if isinstance(data, dict) else 0


async def result_or_exit_code(work: asyncio.Future[T], stop: asyncio.Event) -> T | int:
    """The agents' results, or the exit code: 130 when a stop came first, 1 when a sandbox could not be made
    (e.g. the same scenario recorded twice at once: its sandbox paths are fixed)."""
    stopper = asyncio.ensure_future(stop.wait())
    waiting: set[asyncio.Future[Any]] = {work, stopper}
    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    if work not in done:
        print("tito record: stop requested; open sessions are finalized with reward 0", file=sys.stderr)
        return 130
    stopper.cancel()
    try:
        return work.result()
    except SandboxError as exc:
        print(f"tito record: {exc}", file=sys.stderr, flush=True)
        return 1


async def run_agent_sessions(args: argparse.Namespace, base_url: str, stop: asyncio.Event) -> int:
    """Runs the agents off the event loop (the proxy keeps serving them), then finishes their sessions."""
    script = getattr(args, "cli_script", None)
    if script is not None:
        return await run_script_sessions(args, script, base_url, stop)
    plan = SessionPlan(
        agent=args.agent,
        base_url=base_url,
        task=args.task,
        model=args.agent_model,
        sessions=args.sessions,
        timeout_s=args.agent_timeout,
        parallel=args.concurrency,
        session_path=getattr(args, "session_path", None),
    )
    loop = asyncio.get_running_loop()
    runs = await result_or_exit_code(
        loop.run_in_executor(None, run_sessions, plan, sandbox_factory(args.sandbox)), stop
    )
    if isinstance(runs, int):
        return runs
    failed = 0
    for run in runs:
        samples = await finish_session(base_url, run.session_id, args.reward)
        status = "ok" if run.ok else ("timed out" if run.timed_out else f"exit {run.exit_code}")
        failed += not run.ok
        print(
            f"tito record: {run.agent} {run.version} session {run.session_id}: {status} in "
            f"{run.duration_s:.1f}s, {samples} sample(s)",
            file=sys.stderr,
            flush=True,
        )
        if not run.ok:
            print(f"  stderr: {run.stderr_tail[-800:]}", file=sys.stderr)
    return 1 if failed else 0


async def run_script_sessions(args: argparse.Namespace, script: CliScript, base_url: str, stop: asyncio.Event) -> int:
    """A scenario's CLI script: its sessions at once, each one's runs in order, then each session finished."""
    from tito_rl.recorder.agents.cli_runs import run_ok, run_script
    from tito_rl.recorder.agents.stream_cut import CuttingRelay

    relays = {s.id: CuttingRelay(base_url, s.cut_streams) for s in script.sessions if s.cut_streams}
    urls = {sid: await relay.start() for sid, relay in relays.items()}
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(
        None,
        run_script,
        script,
        base_url,
        args.agent_model,
        sandbox_factory(args.sandbox),
        urls,
        getattr(args, "session_path", None),
    )
    try:
        outcomes = await result_or_exit_code(work, stop)
    finally:
        for relay in relays.values():
            await relay.stop()
    if isinstance(outcomes, int):
        return outcomes
    failed = 0
    for outcome in outcomes:
        samples = await finish_session(base_url, outcome.session.id, args.reward)
        failed += not outcome.ok
        for n, (spec, run) in enumerate(zip(outcome.session.runs, outcome.runs, strict=False)):
            status = (
                "killed as scripted"
                if spec.kill_after_s is not None and run.timed_out
                else "ok"
                if run.ok
                else "timed out"
                if run.timed_out
                else f"exit {run.exit_code}"
            )
            print(
                f"tito record: {run.agent} {run.version} session {run.session_id} run {n}: {status} in "
                f"{run.duration_s:.1f}s",
                file=sys.stderr,
                flush=True,
            )
            if not run_ok(spec, run):
                print(f"  stderr: {run.stderr_tail[-800:]}\n  stdout: {run.stdout_tail[-800:]}", file=sys.stderr)
        cutter = relays.get(outcome.session.id)
        if cutter is not None:
            cut = ", ".join(f"#{n}" for n in cutter.cut) or "none (no reply had that many events)"
            print(f"tito record: session {outcome.session.id}: replies cut mid-stream: {cut}", file=sys.stderr)
        print(f"tito record: session {outcome.session.id}: {samples} sample(s)", file=sys.stderr, flush=True)
    return 1 if failed else 0
