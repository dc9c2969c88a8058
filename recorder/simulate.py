"""`tito simulate`: one scenario, recorded end to end with no GPU, into a cassette and its golden.

    tito simulate --scenario cassettes/scenarios/claude_tool_loop.yaml --out /tmp/claude_tool_loop.tito
    tito simulate --scenario fake_engine/examples/claude_tool_loop.yaml --agent opencode --task "list the files" \\
        --out /tmp/opencode.tito

It installs the pinned CLI(s) the scenario's `client:` names (npm, cached in .tools/npm; a Python CLI with pip
into a venv of its own in ~/.cache/tito), starts
`tito fake-engine --script SCENARIO` on a free port, runs `tito record --scenario SCENARIO` against it with
the scenario's `client.record_args` (the real CLI per session in a local sandbox, or the scripted client),
stops the engine, and writes the golden with `tito replay --update-goldens`.

`--target TARGET` records *through* another gateway than the one the scenario names (slime, rllm, a driver, or
tito): the client talks to the target, the target to the fake engine, so the client echoes the target's own
replies and the samples are the target's live ones: what `make conformance` compares gateways by.
`--engine-dialect` makes the fake engine answer in that dialect where a target's calls could be either.
The cassette only appears once the recording succeeded; `--replace` swaps it for an existing one. `make corpus`
runs this per scenario.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tito_rl.recorder.processes import free_port, stop, wait_http

if TYPE_CHECKING:
    from tito_rl.fake_engine.channels.moe import MoeShape

ROOT = Path(__file__).resolve().parent.parent


class SimulateError(Exception):
    """The scenario could not be recorded; the message says why."""


class InvalidScenario(SimulateError):
    """The scenario file does not fit its model (exit 2, as tito record and tito fake-engine give)."""


@dataclass(frozen=True)
class Simulated:
    cassette: Path
    seconds: float
    log: str  # tito record's lines about its sessions


def tito(*args: str) -> list[str]:
    return [sys.executable, "-m", "tito_rl", *args]


def install_clis(scenario: Path, agent: str | None, task: str | None) -> list[str]:
    """The pinned CLIs the recording will run, installed first (a cached install is a stat)."""
    from tito_rl.recorder.agents.cli_script import SCRIPTED, client_agent, load_cli_script
    from tito_rl.recorder.agents.install import ensure_installed
    from tito_rl.recorder.agents.pins import pin_for

    if agent in (None, SCRIPTED) and client_agent(scenario) == SCRIPTED:
        return []  # the scripted client: nothing to install
    script = load_cli_script(scenario, agent, task)  # no client: section and no --agent/--task: refused here
    for name in script.agents:
        ensure_installed(pin_for(name))  # a first install says so, in a line when it starts and one when done
    return script.agents


def with_target(record_args: list[str], target: str | None, dialect: str | None) -> list[str]:
    """The scenario's `record_args` with its `--target` (and `--engine-dialect`) replaced by the ones asked for."""
    args, i = [], 0
    while i < len(record_args):
        if (target and record_args[i] == "--target") or (dialect and record_args[i] == "--engine-dialect"):
            i += 2
            continue
        args.append(record_args[i])
        i += 1
    args += ["--target", target] if target else []
    return args + (["--engine-dialect", dialect] if dialect else [])


def target_of(record_args: list[str]) -> str | None:
    """The `--target` a scenario's `record_args` name; None when they name none."""
    if "--target" not in record_args or record_args.index("--target") + 1 >= len(record_args):
        return None
    return record_args[record_args.index("--target") + 1]


def driver_engine_args(record_args: list[str], given: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The fake engine's arguments the recorded target's driver asks for (`TargetInfo.fake_engine_args`: verifiers'
    client reads vLLM 0.31's answers), those `given` already set left out; () for tito, an `http://` target, or a
    driver that cannot be made here (recording it says why)."""
    name = target_of(record_args)
    if name is None:
        return ()
    from tito_rl.recorder.targets.base import TargetError, TargetOptions
    from tito_rl.recorder.targets.registry import create_driver, parse_target

    try:
        if parse_target(name).kind != "driver":
            return ()
        wanted = tuple(getattr(create_driver(name, TargetOptions()).info, "fake_engine_args", ()))
    except TargetError:  # TargetUnavailable included
        return ()
    flags = [a for a in wanted if a.startswith("--")]
    if any(flag in given for flag in flags):  # a setting the caller gave wins: the driver's are left out
        return ()
    return wanted


def with_routes_layout(
    record_args: list[str], scenario: Path, moe: MoeShape | None, engine_args: tuple[str, ...]
) -> list[str]:
    """`record_args` plus `--routes-layout LAYERS,TOP_K` where tito's adapter will call the fake engine in SGLang's
    `/generate` and the fake serves routes: SGLang's rows are flat, and the adapter learns their split from the
    model folder the engine names, which the fake has not unless `--model-path` gives one. The simulator started the
    fake, so it knows the shape; the adapter keeps it in the header as a setting (no path: the cassette is the same
    wherever it was recorded). Unchanged where the flag is given, another gateway is recorded, or no shape is known."""
    from tito_rl.fake_engine.cli import served_routes_shape
    from tito_rl.recorder.record_options import add_arguments
    from tito_rl.recorder.targets.base import TargetError
    from tito_rl.recorder.targets.registry import TITO, parse_target
    from tito_rl.trajectory.dialects.view import SGLANG

    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_arguments(parser)
    try:
        parsed, _ = parser.parse_known_args(["--engine", "http://-", "--out", "-", *record_args])
        if parsed.routes_layout is not None or parse_target(parsed.target).kind != TITO:
            return record_args
        if (parsed.engine_dialect or SGLANG) != SGLANG:
            return record_args
        shape = served_routes_shape(["--script", str(scenario), *engine_args], moe)
    except (argparse.ArgumentError, ValueError, TargetError):  # the fake engine or tito record says why, at start
        return record_args
    return record_args if shape is None else [*record_args, "--routes-layout", f"{shape.layers},{shape.top_k}"]


def simulate(
    scenario: Path,
    out: Path,
    agent: str | None = None,
    task: str | None = None,
    replace: bool = False,
    golden: bool = True,
    timeout_s: float = 900.0,
    target: str | None = None,
    dialect: str | None = None,
    engine_args: tuple[str, ...] = (),
) -> Simulated:
    """Record `scenario` into `out`; `engine_args` are added to the fake engine's command line (e.g.
    `--vllm-version 0.31.0`, for a gateway whose client reads that release's answers)."""
    # the engine and tito record run in the checkout: paths the caller gave relative to its own folder, made absolute
    scenario, out = scenario.absolute(), out.absolute()
    if out.exists() and not replace:
        raise SimulateError(f"{out} exists: pass --replace to re-record it")
    if not out.parent.is_dir():
        raise SimulateError(f"folder {out.parent} does not exist")
    from tito_rl.recorder.scenario_file import ScenarioError, check_scenario

    try:  # the whole file before anything starts: the same errors as tito record and tito fake-engine
        checked = check_scenario(scenario)
        record_args = with_target(list(checked.record_args), target, dialect)
    except ScenarioError as exc:
        raise InvalidScenario(str(exc)) from None
    engine_args = (*checked.engine_args, *engine_args)
    engine_args = (*driver_engine_args(record_args, engine_args), *engine_args)
    record_args = with_routes_layout(record_args, scenario, checked.engine.moe_shape, engine_args)
    try:
        install_clis(scenario, agent, task)
    except (OSError, ValueError, RuntimeError) as exc:
        raise SimulateError(str(exc) if str(scenario) in str(exc) else f"{scenario}: {exc}") from None
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    started = time.monotonic()
    port = free_port()
    forced = ["--openai-dialect", dialect] if dialect in ("sglang-openai", "vllm-openai") else []
    engine = subprocess.Popen(
        tito("fake-engine", "--script", str(scenario), "--listen", f"127.0.0.1:{port}", *forced, *engine_args),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        try:
            wait_http(f"http://127.0.0.1:{port}/health", engine, timeout_s=120)
        except (RuntimeError, TimeoutError) as exc:
            raise SimulateError(f"{scenario.name}: the fake engine did not start: {exc}") from None
        command = [
            "record",
            "--engine",
            f"http://127.0.0.1:{port}",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--out",
            str(partial),
            "--scenario",
            str(scenario),
            "--quiet",
        ]
        command += ["--agent", agent] if agent else []
        command += ["--task", task] if task else []
        proc = subprocess.run(tito(*command, *record_args), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    finally:
        stop(engine)
        engine_err = engine.stderr.read().decode(errors="replace") if engine.stderr else ""
        if engine.stderr:
            engine.stderr.close()
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SimulateError(
            f"{scenario.name}: tito record exited with {proc.returncode}\n{proc.stderr[-4000:]}"
            f"\nfake engine: {engine_err[-1500:]}"
        )
    os.replace(partial, out)
    if golden:
        write_goldens([out])
    log = "\n".join(line for line in proc.stderr.splitlines() if " session " in line)
    return Simulated(out, time.monotonic() - started, log)


def write_goldens(cassettes: list[Path]) -> str:
    """The goldens of cassettes this process just recorded, from one replay process (one start-up); its report.
    Their targets are the ones the user's scenarios and options named (a profile file, `module:attribute`): the
    replay trusts them (`--trust-cassette`), as it would never trust a cassette from elsewhere."""
    proc = subprocess.run(
        tito("replay", *map(str, cassettes), "--update-goldens", "--trust-cassette"),
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SimulateError(
            f"tito replay --update-goldens exited with {proc.returncode}\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return proc.stdout.rstrip()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--scenario",
        required=True,
        metavar="FILE",
        help="engine script plus an optional client: section (cassettes/scenarios/*.yaml)",
    )
    parser.add_argument("--out", required=True, metavar="CASSETTE", help="the cassette to write (its golden beside)")
    parser.add_argument(
        "--agent",
        help="the pinned CLI to run (default: the one the scenario's client: names); named here, it runs every session",
    )
    parser.add_argument("--task", help="the task text (needed when the scenario has no CLI client: section)")
    parser.add_argument("--replace", action="store_true", help="replace an existing cassette once the new one is done")
    parser.add_argument("--no-golden", action="store_true", help="record only; write no golden")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole recording")
    parser.add_argument(
        "--target",
        metavar="TARGET",
        help="record through this gateway instead of the one the scenario's record_args name: tito, "
        "slime, rllm, miles, verifiers, agentlightning, a tito.targets entry point, "
        "module:attribute or a gateway profile FILE.yaml (docs/targets.md)",
    )
    parser.add_argument(
        "--engine-dialect",
        metavar="DIALECT",
        choices=("sglang", "sglang-openai", "vllm-openai", "vllm-generate"),
        help="the engine API the fake engine answers in where a call could be either, and the "
        "recording names (docs/engine-dialects.md)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        done = simulate(
            Path(args.scenario),
            Path(args.out),
            args.agent,
            args.task,
            args.replace,
            golden=not args.no_golden,
            timeout_s=args.timeout,
            target=args.target,
            dialect=args.engine_dialect,
        )
    except SimulateError as exc:
        print(f"tito simulate: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, InvalidScenario) else 1
    print(done.log, file=sys.stderr)
    golden = "" if args.no_golden else f" and {done.cassette.with_suffix('.golden')}"
    print(
        f"tito simulate: wrote {done.cassette} ({done.cassette.stat().st_size} bytes){golden} in {done.seconds:.1f}s",
        file=sys.stderr,
    )
    return 0
