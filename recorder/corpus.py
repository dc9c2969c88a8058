"""`make cassettes`: re-record the committed scenario corpus from scratch.

For each `cassettes/scenarios/<name>.yaml`: start `tito fake-engine --script <it>` on a free loopback
port, run `tito record --agent scripted --scenario <it>` (plus the scenario's `client.record_args`) into
a temporary file, stop the engine, then replace `cassettes/<name>.tito` with the new recording. A failed
recording leaves the committed cassette as it was. Then every new cassette's golden is written by
`tito replay --update-goldens`: read the golden diffs before committing them.

    python -m recorder.corpus                  # every scenario
    python -m recorder.corpus tool_loop retry_529
    python -m recorder.corpus --jobs 1         # one at a time (default: two, one per core here)

Most of a scenario's time is the two processes starting (the tokenizer import); the traffic takes seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from recorder.processes import free_port, stop, wait_http
from recorder.scripted_script import load_client_script

ROOT = Path(__file__).resolve().parent.parent
CASSETTES = ROOT / "cassettes"
SCENARIOS = CASSETTES / "scenarios"


class CorpusError(Exception):
    """A scenario could not be recorded; the message says which and why."""


@dataclass(frozen=True)
class Recorded:
    name: str
    cassette: Path
    seconds: float
    log: str  # tito record's stderr: one line per scripted session


def tito(*args: str) -> list[str]:
    return [sys.executable, "-m", "tito_cli", *args]


def record(scenario: Path, out_dir: Path = CASSETTES, timeout_s: float = 300.0) -> Recorded:
    """One scenario, recorded against its own fresh fake engine (fresh: `fault_attempts` counts requests)."""
    name = scenario.stem
    record_args = list(load_client_script(scenario).record_args)
    out = out_dir / f"{name}.tito"
    partial = out_dir / f"{name}.tito.tmp"
    partial.unlink(missing_ok=True)
    port = free_port()
    started = time.monotonic()
    engine = subprocess.Popen(tito("fake-engine", "--script", str(scenario), "--port", str(port)), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        try:
            wait_http(f"http://127.0.0.1:{port}/health", engine, timeout_s=120)
        except (RuntimeError, TimeoutError) as exc:
            raise CorpusError(f"{name}: the fake engine did not start: {exc}") from None
        proc = subprocess.run(
            tito("record", "--engine", f"http://127.0.0.1:{port}", "--listen", f"127.0.0.1:{free_port()}",
                 "--out", str(partial), "--agent", "scripted", "--scenario", str(scenario), "--quiet", *record_args),
            cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    finally:
        stop(engine)
        engine_err = engine.stderr.read().decode(errors="replace") if engine.stderr else ""
        if engine.stderr:
            engine.stderr.close()
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        raise CorpusError(f"{name}: tito record exited with {proc.returncode}\n{proc.stderr[-3000:]}"
                          f"\nfake engine: {engine_err[-1500:]}")
    os.replace(partial, out)
    log = "\n".join(line for line in proc.stderr.splitlines() if "scripted session" in line)
    return Recorded(name, out, time.monotonic() - started, log)


def update_goldens(cassettes: list[Path]) -> None:
    """Each re-recorded cassette's golden, written from a replay of it (one process: one start-up)."""
    proc = subprocess.run(tito("replay", *map(str, cassettes), "--update-goldens"), cwd=ROOT, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise CorpusError(f"tito replay --update-goldens exited with {proc.returncode}\n"
                          f"{(proc.stdout + proc.stderr)[-3000:]}")
    print(proc.stdout.rstrip(), flush=True)


def scenario_paths(names: list[str]) -> list[Path]:
    if not names:
        return sorted(SCENARIOS.glob("*.yaml"))
    paths = [SCENARIOS / f"{n.removesuffix('.yaml')}.yaml" for n in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise CorpusError(f"no such scenario: {', '.join(missing)}")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recorder.corpus", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="scenario names (default: every cassettes/scenarios/*.yaml)")
    parser.add_argument("--no-goldens", action="store_true", help="record only; leave the goldens alone")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios recorded at once (default 2)")
    args = parser.parse_args(argv)
    try:
        paths = scenario_paths(args.names)
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for done in pool.map(record, paths):  # in scenario order; the first failure stops the report
                size = done.cassette.stat().st_size
                print(f"{done.name}: {done.cassette.relative_to(ROOT)} ({size} bytes, {done.seconds:.1f}s)",
                      flush=True)
                if done.log:
                    print("  " + done.log.replace("\n", "\n  "), flush=True)
        if not args.no_goldens:
            update_goldens([CASSETTES / f"{path.stem}.tito" for path in paths])
    except CorpusError as exc:
        print(f"make cassettes: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
