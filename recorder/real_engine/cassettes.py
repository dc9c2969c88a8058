"""`make real-vllm-cassettes`: `cassettes/real_vllm/` re-recorded live against the real vLLM, with their goldens.

Each committed cassette there is one `tito record --agent scripted` of a scenario in `cassettes/real_vllm/scenarios/`
(its `client.record_args` applied, plus the flags below) against the real vLLM of `make real-engine`, started here
with `--enable-scale-out` (so one server answers `/inference/v1/generate`, `/v1/completions` and the chat route).
The scenarios seed every generation (`--engine-seed`, or the client's own `seed` where a gateway forwards the body),
so a re-recording gives the same engine leg: `tests/test_real_vllm_cassettes.py` checks exactly that, live, with the
same `record` as here. CI replays the committed ones with no engine.

    python -m tito_rl.recorder.real_engine.cassettes                 # all, into cassettes/real_vllm/
    python -m tito_rl.recorder.real_engine.cassettes rllm_vllm --out /tmp/again
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tito_rl.recorder.processes import free_port
from tito_rl.recorder.real_engine.server import RealEngineError, RealVllmServer, StartFlags
from tito_rl.recorder.scenario_file import check_scenario
from tito_rl.recorder.simulate import SimulateError, write_goldens

ROOT = Path(__file__).resolve().parent.parent.parent
REAL_VLLM_CASSETTES = ROOT / "cassettes" / "real_vllm"
SCENARIOS = REAL_VLLM_CASSETTES / "scenarios"


@dataclass(frozen=True)
class LiveCassette:
    """`cassettes/real_vllm/<name>.tito`, recorded from `scenarios/<scenario>.yaml` with `args` added."""

    name: str
    scenario: str
    args: tuple[str, ...] = ()

    @property
    def scenario_path(self) -> Path:
        return SCENARIOS / f"{self.scenario}.yaml"


LIVE_CASSETTES = (
    LiveCassette("tito_vllm_generate", "tito_vllm", ("--engine-dialect", "vllm-generate")),
    LiveCassette("tito_vllm_openai", "tito_vllm", ("--engine-dialect", "vllm-openai")),
    LiveCassette("rllm_vllm", "rllm_vllm"),
)


def record(cassette: LiveCassette, engine_url: str, out: Path, timeout_s: float = 900.0) -> None:
    """One recording into `out` (which must not exist), as a user runs it; `RealEngineError` when it fails."""
    record_args = check_scenario(cassette.scenario_path).record_args
    command = [
        sys.executable,
        "-m",
        "tito_rl",
        "record",
        "--engine",
        engine_url,
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--out",
        str(out),
        "--agent",
        "scripted",
        "--scenario",
        str(cassette.scenario_path),
        "--quiet",
        *record_args,
        *cassette.args,
    ]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if run.returncode != 0:
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        why = next((line for line in lines if "FAILED" in line), lines[-1] if lines else "no output")
        raise RealEngineError(f"tito record of {cassette.name} exited with {run.returncode}: {why}")


def record_all(chosen: list[LiveCassette], folder: Path) -> list[Path]:
    """Each cassette recorded against one real vLLM started for them, replacing the file only once recorded."""
    written = []
    with RealVllmServer(StartFlags()) as server:
        for cassette in chosen:
            out = folder / f"{cassette.name}.tito"
            partial = out.with_name(out.name + ".partial")
            partial.unlink(missing_ok=True)
            record(cassette, server.url, partial)
            os.replace(partial, out)
            print(f"real-vllm-cassettes: recorded {out}", file=sys.stderr, flush=True)
            written.append(out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.recorder.real_engine.cassettes",
        description="Re-record cassettes/real_vllm/ live against the real vLLM.",
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"which ({', '.join(c.name for c in LIVE_CASSETTES)}; default: all)"
    )
    parser.add_argument("--out", type=Path, default=REAL_VLLM_CASSETTES, help="folder (default %(default)s)")
    args = parser.parse_args(argv)
    known = {c.name: c for c in LIVE_CASSETTES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"real-vllm-cassettes: no cassette {unknown[0]!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if not args.out.is_dir():
        print(f"real-vllm-cassettes: --out {args.out} is not a folder", file=sys.stderr)
        return 2
    chosen = [known[n] for n in args.names] if args.names else list(LIVE_CASSETTES)
    try:
        written = record_all(chosen, args.out)
        print(write_goldens(written), file=sys.stderr)
    except (RealEngineError, SimulateError, subprocess.TimeoutExpired) as exc:
        print(f"real-vllm-cassettes: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
