"""`tito record --agent scripted --scenario FILE`: the scripted client in-process against the recording proxy.

The counterpart of `agent_runs.py` for the scripted client: it plays the scenario's `client:` section
against the proxy's own URL, on the proxy's event loop. The script finishes or drops its sessions itself
through the session API; sessions it leaves open are finalized with reward 0 when the proxy stops.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from tito_rl.recorder.scripted.client import run_script
from tito_rl.recorder.scripted.script import load_client_script


def unapplied_record_args(args: argparse.Namespace, record_args: tuple[str, ...]) -> list[str]:
    """The options `client.record_args` sets that this `tito record` run does not: the run would record
    another scenario than the corpus's (e.g. reasoning preserved where the scenario needs it dropped)."""
    from tito_rl.recorder.record_options import add_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_arguments(parser)
    base = ["--engine", "-", "--out", "-"]
    wanted, defaults = vars(parser.parse_args(base + list(record_args))), vars(parser.parse_args(base))
    return [k for k, v in wanted.items() if v != defaults[k] and getattr(args, k, None) != v]


def scripted_header(scenario: str | Path) -> dict[str, Any]:
    from tito_rl.cassette.format.records import tito_version
    from tito_rl.recorder.agents.cli_script import scenario_name

    name = scenario_name(scenario)
    return {"client": "scripted", "scenario": name, "version": tito_version()}


async def run_scripted_sessions(args: argparse.Namespace, base_url: str, stop: asyncio.Event) -> int:
    """Plays the script until it ends or a stop is requested; 1 if any session failed."""
    script = load_client_script(args.scenario)
    missing = unapplied_record_args(args, script.record_args)
    if missing:
        print(
            f"tito record: warning: {args.scenario} is recorded with client.record_args {list(script.record_args)}, "
            f"but this run differs in {', '.join(missing)}",
            file=sys.stderr,
        )
    work = asyncio.ensure_future(run_script(script, base_url, timeout_s=args.agent_timeout))
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({work, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if work not in done:
        work.cancel()
        print("tito record: stop requested; open sessions are finalized with reward 0", file=sys.stderr)
        return 130
    stopper.cancel()
    results = work.result()
    for result in results:
        print(f"tito record: scripted {result.line()}", file=sys.stderr, flush=True)
    return 0 if all(r.ok for r in results) else 1
