"""`make real-sglang-cassettes`: `cassettes/real_sglang/` re-recorded live against the real SGLang, with their goldens.

Each committed cassette there is one `tito record --agent scripted` of a scenario in `cassettes/real_sglang/scenarios/`
(its `client.record_args` applied) against the real SGLang of `make real-sglang`, started here for that recording
alone with `--random-seed 7`: SGLang ignores a request's `sampling_seed` on this backend (it needs
`--enable-deterministic-inference`, which refuses torch-native attention), so what repeats is the whole request
sequence from a fresh start, one server start per recording. The MoE's server also has
`--enable-return-routed-experts`: tito's adapter learns that from `/get_server_info` and asks for routes.
`tests/test_real_sglang_cassettes.py` re-records live and compares the engine leg with the committed one; CI replays
the committed ones with no engine (slime's only where slime is importable).

    python -m tito_rl.recorder.real_engine.sglang_cassettes                 # all, into cassettes/real_sglang/
    python -m tito_rl.recorder.real_engine.sglang_cassettes tito_sglang_moe --out /tmp/again
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tito_rl.recorder.real_engine.cassettes import ROOT, LiveCassette, record
from tito_rl.recorder.real_engine.server import RealEngineError
from tito_rl.recorder.real_engine.sglang_paths import SglangStart
from tito_rl.recorder.real_engine.sglang_server import RealSglangServer
from tito_rl.recorder.simulate import SimulateError, write_goldens

REAL_SGLANG_CASSETTES = ROOT / "cassettes" / "real_sglang"
SGLANG_SCENARIOS = REAL_SGLANG_CASSETTES / "scenarios"
RANDOM_SEED = 7  # the server's --random-seed: its sampler's seed for the whole request sequence


@dataclass(frozen=True)
class SglangCassette(LiveCassette):
    """`cassettes/real_sglang/<name>.tito`, recorded from `scenarios/<scenario>.yaml` against a fresh real SGLang
    started as `start` says."""

    start: SglangStart = SglangStart(random_seed=RANDOM_SEED)

    @property
    def scenario_path(self) -> Path:
        return SGLANG_SCENARIOS / f"{self.scenario}.yaml"

    @property
    def needs_slime(self) -> bool:
        return self.scenario.startswith("slime")


SGLANG_CASSETTES = (
    SglangCassette("tito_sglang_dense", "tito_sglang"),
    SglangCassette("tito_sglang_moe", "tito_sglang", start=SglangStart(moe=True, random_seed=RANDOM_SEED)),
    SglangCassette("slime_sglang", "slime_sglang"),
)


def record_fresh(cassette: SglangCassette, out: Path) -> None:
    """One recording into `out` (which must not exist) against a real SGLang started for it and stopped after."""
    with RealSglangServer(cassette.start) as server:
        record(cassette, server.url, out)


def record_all(chosen: list[SglangCassette], folder: Path) -> list[Path]:
    """Each cassette recorded against its own fresh server, replacing the file only once recorded."""
    written = []
    for cassette in chosen:
        out = folder / f"{cassette.name}.tito"
        partial = out.with_name(out.name + ".partial")
        partial.unlink(missing_ok=True)
        record_fresh(cassette, partial)
        os.replace(partial, out)
        print(f"real-sglang-cassettes: recorded {out}", file=sys.stderr, flush=True)
        written.append(out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.recorder.real_engine.sglang_cassettes",
        description="Re-record cassettes/real_sglang/ live against the real SGLang (one server start each).",
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help=f"which ({', '.join(c.name for c in SGLANG_CASSETTES)}; default: all)"
    )
    parser.add_argument("--out", type=Path, default=REAL_SGLANG_CASSETTES, help="folder (default %(default)s)")
    args = parser.parse_args(argv)
    known = {c.name: c for c in SGLANG_CASSETTES}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        print(f"real-sglang-cassettes: no cassette {unknown[0]!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    if not args.out.is_dir():
        print(f"real-sglang-cassettes: --out {args.out} is not a folder", file=sys.stderr)
        return 2
    chosen = [known[n] for n in args.names] if args.names else list(SGLANG_CASSETTES)
    try:
        written = record_all(chosen, args.out)
        print(write_goldens(written), file=sys.stderr)
    except (RealEngineError, SimulateError, subprocess.TimeoutExpired) as exc:
        print(f"real-sglang-cassettes: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
