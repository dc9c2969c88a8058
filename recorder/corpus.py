"""`make corpus` and `make cassettes`: re-record the committed scenario corpus from scratch.

Each `cassettes/scenarios/<name>.yaml` is recorded into `cassettes/<name>.tito` by whoever its `client.agent`
names, through `tito simulate` (the fake engine on the scenario, the recording proxy, the client): the
scripted client (`scripted`, the default; `make cassettes` records only these, no npm needed), or a pinned
real CLI (claude-code, codex, qwen-code, opencode, gemini-cli, mini-swe-agent) in a local sandbox. Every pinned CLI
the scenarios name is installed first (npm, cached in .tools/npm; mini-swe-agent with pip into ~/.cache/tito).
Scenarios run `--jobs` at a time, each against its own fresh fake engine (fresh: `fault_attempts` counts
requests), into a temporary file that replaces the committed cassette only once complete: a failed scenario
leaves its committed cassette as it was, is reported, and the others go on. Then the new cassettes' goldens are
written by one `tito replay --update-goldens` process: read the golden diffs before committing them. A scenario
in `cassettes/targets/scenarios/` is recorded around the target its `client.record_args` name (`--target slime`)
into `cassettes/targets/<name>.tito`, and skipped, saying why, where that target's code is not installed.

    python -m tito_rl.recorder.corpus                    # every scenario (make corpus)
    python -m tito_rl.recorder.corpus --scripted         # the scripted-client ones only (make cassettes)
    python -m tito_rl.recorder.corpus tool_loop mixed_concurrent
    python -m tito_rl.recorder.corpus --jobs 1           # one at a time (default: two, one per core here)
    python -m tito_rl.recorder.corpus --out-dir /tmp/c   # a trial run: cassettes/ untouched

Prints one line per scenario as it finishes; exit 1 when any scenario failed (its reason is printed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from tito_rl.recorder.simulate import SimulateError, simulate, target_of, write_goldens

ROOT = Path(__file__).resolve().parent.parent
CASSETTES = ROOT / "cassettes"
SCENARIOS = CASSETTES / "scenarios"
TARGET_SCENARIOS = CASSETTES / "targets" / "scenarios"  # recorded around another target than tito's adapter


class CorpusError(Exception):
    """A scenario could not be recorded; the message says which and why."""


@dataclass(frozen=True)
class Recorded:
    name: str
    cassette: Path
    seconds: float
    log: str  # tito record's lines about its sessions


def record(scenario: Path, out_dir: Path = CASSETTES, timeout_s: float = 300.0) -> Recorded:
    """One scenario through `tito simulate`, against its own fresh fake engine, by whoever its `client:` names
    (its golden comes later, with the others')."""
    folder = out_dir
    if scenario.parent.resolve() == TARGET_SCENARIOS.resolve():  # recorded around another target: beside its kind
        folder = out_dir / TARGET_SCENARIOS.parent.name
        folder.mkdir(exist_ok=True)
    out = folder / f"{scenario.stem}.tito"
    try:
        done = simulate(scenario, out, replace=True, golden=False, timeout_s=timeout_s)
    except SimulateError as exc:  # named by its file there; here, as everywhere in the corpus, by its name
        raise CorpusError(f"{scenario.stem}: {str(exc).removeprefix(f'{scenario.name}: ')}") from None
    return Recorded(scenario.stem, out, done.seconds, done.log)


def client_of(scenario: Path) -> str:
    """`scripted` or the pinned CLI's name; a scenario without a `client:` section is not a corpus scenario."""
    from tito_rl.recorder.agents.cli_script import client_agent

    try:
        agent = client_agent(scenario)
    except (OSError, ValueError) as exc:
        raise CorpusError(f"{scenario.stem}: {exc}") from None
    if agent is None:
        raise CorpusError(f"{scenario.stem}: no client: section (scripted or a pinned CLI)")
    return agent


def install_clis(paths: list[Path]) -> dict[str, str]:
    """Every pinned CLI the real-CLI scenarios name, installed once up front (cached: a stat); the scenarios
    that can not run, with why."""
    from tito_rl.recorder.agents.cli_script import load_cli_script
    from tito_rl.recorder.agents.install import ensure_installed
    from tito_rl.recorder.agents.pins import pin_for

    needs: dict[str, list[str]] = {}
    broken: dict[str, str] = {}
    for path in paths:
        try:
            for agent in load_cli_script(path).agents:
                needs.setdefault(agent, []).append(path.stem)
        except (OSError, ValueError) as exc:
            broken[path.stem] = str(exc).removeprefix(f"{path}: ")
    for agent, users in needs.items():
        pin = pin_for(agent)
        try:  # a first install says so, in a line when it starts and one when done
            ensure_installed(pin)
        except (OSError, RuntimeError) as exc:
            broken.update({name: f"{pin.spec} is not installed: {exc}" for name in users})
    return broken


def update_goldens(cassettes: list[Path]) -> None:
    """The re-recorded cassettes' goldens, written from a replay of them (one process: one start-up)."""
    try:
        print(write_goldens(cassettes), flush=True)
    except SimulateError as exc:
        raise CorpusError(str(exc)) from None


def scenario_paths(names: list[str]) -> list[Path]:
    if not names:
        return sorted(SCENARIOS.glob("*.yaml")) + sorted(TARGET_SCENARIOS.glob("*.yaml"))
    paths = []
    for name in names:
        file = f"{name.removesuffix('.yaml')}.yaml"
        paths.append(next((f / file for f in (SCENARIOS, TARGET_SCENARIOS) if (f / file).is_file()), SCENARIOS / file))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise CorpusError(f"no such scenario: {', '.join(missing)}")
    return paths


def target_missing(scenario: Path) -> str | None:
    """Why the target the scenario is recorded around cannot run here (its code is not installed); None if it can."""
    from tito_rl.recorder.scenario_file import ScenarioError, check_scenario
    from tito_rl.recorder.targets.base import TargetError, TargetOptions, TargetUnavailable
    from tito_rl.recorder.targets.registry import create_driver, parse_target

    try:
        args = list(check_scenario(scenario).record_args)
    except ScenarioError:
        return None  # recording it says what is wrong with the file, as a failure
    name = target_of(args)
    if name is None:
        return None
    try:
        if parse_target(name).kind == "driver":
            create_driver(name, TargetOptions())
    except TargetUnavailable as exc:
        return str(exc)
    except TargetError:
        return None  # tito record says what is wrong with it, as a failure
    return None


def record_all(
    paths: list[Path], jobs: int, out_dir: Path = CASSETTES, skipped: dict[str, str] | None = None
) -> tuple[list[Recorded], dict[str, str]]:
    """Every scenario, `jobs` at a time, each reported as it finishes; the recordings and the failures. Scenarios
    around a target not installed here go into `skipped` with why."""
    clients: dict[Path, str] = {}
    failed: dict[str, str] = {}
    skipped = {} if skipped is None else skipped
    for path in paths:
        try:
            clients[path] = client_of(path)
        except CorpusError as exc:
            failed[path.stem] = str(exc)
            continue
        why = target_missing(path)
        if why is not None:
            skipped[path.stem] = why
            del clients[path]
            print(f"{path.stem}: skipped ({why})", flush=True)
    failed |= install_clis([p for p, c in clients.items() if c != "scripted"])
    todo = [p for p in clients if p.stem not in failed]
    labels = {p: _label(p, clients[p]) for p in todo}
    for name, why in failed.items():
        print(f"{name}: FAILED ({why.splitlines()[0]})", flush=True)
    done: list[Recorded] = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures: dict[Future[Recorded], Path] = {
            pool.submit(record, p, out_dir, 300.0 if clients[p] == "scripted" else 900.0): p for p in todo
        }
        for future in as_completed(futures):
            path = futures[future]
            try:
                rec = future.result()
            except (CorpusError, OSError, subprocess.TimeoutExpired) as exc:
                failed[path.stem] = str(exc)
                print(
                    f"{path.stem} [{labels[path]}]: FAILED ({str(exc).splitlines()[0]}); "
                    f"the committed cassette is untouched",
                    flush=True,
                )
                continue
            done.append(rec)
            shown = rec.cassette.relative_to(ROOT) if rec.cassette.is_relative_to(ROOT) else rec.cassette
            print(
                f"{rec.name} [{labels[path]}]: {shown} ({rec.cassette.stat().st_size} bytes, {rec.seconds:.1f}s)",
                flush=True,
            )
    order = {p.stem: i for i, p in enumerate(paths)}
    return sorted(done, key=lambda r: order[r.name]), failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tito_rl.recorder.corpus", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="scenario names (default: every cassettes/scenarios/*.yaml)")
    parser.add_argument("--scripted", action="store_true", help="only the scripted-client scenarios (no npm)")
    parser.add_argument("--no-goldens", action="store_true", help="record only; leave the goldens alone")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios recorded at once (default 2)")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=CASSETTES,
        metavar="DIR",
        help="write the cassettes and goldens there instead (a trial run; cassettes/ untouched)",
    )
    args = parser.parse_args(argv)
    prog = "make cassettes" if args.scripted else "make corpus"
    try:
        paths = scenario_paths(args.names)
        if args.scripted:
            paths = [p for p in paths if _is_scripted(p)]
        started = time.monotonic()
        if not args.out_dir.is_dir():
            raise CorpusError(f"folder {args.out_dir} does not exist")
        skipped: dict[str, str] = {}
        done, failed = record_all(paths, args.jobs, args.out_dir, skipped)
        if done and not args.no_goldens:
            update_goldens([r.cassette for r in done])
    except CorpusError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    print(
        f"{prog}: {len(done)} of {len(paths)} scenario(s) re-recorded in {time.monotonic() - started:.0f}s"
        + (f"; skipped: {', '.join(sorted(skipped))}" if skipped else "")
        + (f"; FAILED: {', '.join(sorted(failed))}" if failed else ""),
        flush=True,
    )
    for name, why in sorted(failed.items()):
        print(f"{prog}: {name}: {why}", file=sys.stderr)
    return 1 if failed else 0


def _label(path: Path, client: str) -> str:
    """Who plays the scenario, for the progress line: `scripted`, a CLI, or each CLI of a mixed recording."""
    if client == "scripted":
        return client
    from tito_rl.recorder.agents.cli_script import load_cli_script

    return ", ".join(load_cli_script(path).agents)


def _is_scripted(path: Path) -> bool:
    try:
        return client_of(path) == "scripted"
    except CorpusError:
        return False


if __name__ == "__main__":
    sys.exit(main())
