"""Throughput on one machine (issue 40, point 3): `tito replay` and `tito audit` of the production cassette
(`bench_production.py`: 2,048 sessions recorded through `tito record`), per core and with `-j N`, each figure a
ratio measured in this run, with the host's steal beside it.

- per core: sessions per CPU second of the command and all its processes (user + system time, from the kernel's
  accounting of the child, `wait4`), so that what other jobs on a shared host take from the core does not count;
  the wall-clock rate is printed beside it. Goals: replay 15, audit 100 sessions/s per core.
- `-j N` scaling: the wall time of `-j 1` over that of `-j N`, against the host's parallel capacity measured right
  before and right after (a pure-CPU Python loop in 1 and N processes at once: N whole cores give N.00x). The
  efficiency is scaling / capacity; goal 0.9. On a shared host the capacity moves from minute to minute: the two
  measurements around the run say how much.
- audit memory: its peak (PSS of the process and its workers, sampled every 50 ms) on the whole cassette against
  the first 512 sessions' cut: flat when about 1.0.

- calibration (issue 46, point 6): this machine's speed, measured in the same run before and after the figures:
  a fixed pure-Python workload (a loop of 4M additions, in millions per CPU second) and the tokenizer's encode rate
  (a fixed 150k-token text through tito's Qwen3 tokenizer, in thousands of tokens per CPU second), best of 3 each.
  Each per-core rate is printed divided by both, so figures from other machines compare: a host half as fast halves
  the rate and the calibration alike.

- routes (issue 46, point 6; `--routes`): the same workload recorded again in front of an MoE engine serving expert
  routes (`moe: 8,8,64`, `--enable-return-routed-experts`: tito's adapter asks for them, every answer carries the
  routes of its whole sequence from the turn's start, and every sample holds a row of 64 ids per token), then
  `tito replay` and `tito audit` (`-j 1`) of both cassettes' same sessions, by CPU time; printed as the rate with
  routes over the rate without (goal: at least 0.5).

The replay runs on a cut of the cassette's first `--replay-sessions` sessions (default 512, their goldens sliced
from the whole one's: a `-j 1` replay of all 2,048 takes minutes on a loaded 2-core host); the audit on the whole.
`--sessions N` records (and caches) a production cassette of the scenario's first N sessions instead of 2,048: a
smaller run, for a loaded host; `--calibration-only` prints the calibration alone.

    .venv/bin/python benchmarks/bench_throughput.py [--jobs 2] [--replay-sessions 512] [--skip-replay|--skip-audit]
        [--sessions 2048] [--calibration-only] [--routes]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_production import ROOT, PeakRss, cache_dir, cut_with_golden, record, scenario  # noqa: E402
from host_steal import parallel_capacity, steal_watch  # noqa: E402

SESSIONS = 2048
GOALS = {"replay": 15.0, "audit": 100.0}
ROUTES_MOE = "8,8,64"  # layers, top_k, experts: 64 ids a token
ROUTES_GOAL = 0.5  # replay and audit with routes at no less than half their rate without
EFFICIENCY_GOAL = 0.9


@dataclass
class Run:
    wall: float
    cpu: float  # user + system seconds of the command and every process it waited for
    steal: float
    peak: int = 0  # bytes, when sampled


@dataclass
class Calibration:
    """This machine's speed on fixed work: what per-core rates are divided by to compare across machines."""

    python_mops: float  # millions of loop additions per CPU second
    encode_ktps: float  # thousands of tokens the tokenizer encodes per CPU second

    def __str__(self) -> str:
        return f"pure Python {self.python_mops:.1f} M additions/s, tokenizer encode {self.encode_ktps:.0f} k tokens/s"

    def per(self, rate: float) -> str:
        """A rate divided by each calibration figure."""
        return f"{rate / self.python_mops:.3f} per M additions/s, {rate / self.encode_ktps:.4f} per k tokens/s"


CALIBRATION_LOOP = 4_000_000
CALIBRATION_TEXT = "".join(
    f"def part_{i}(x: int) -> int:\n    return x * {i} + len('part {i}')\n\n" for i in range(6000)
)


def calibration() -> Calibration:
    """Best of 3 CPU times (this process's: what other jobs take from the core does not count) of each fixed work."""
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    def loop() -> None:
        x = 0
        for i in range(CALIBRATION_LOOP):
            x += i

    tokenizer = load_tokenizer()
    tokens = len(tokenizer.encode(CALIBRATION_TEXT))

    def best(work: Any) -> float:
        times = []
        for _ in range(3):
            started = time.process_time()
            work()
            times.append(time.process_time() - started)
        return min(times)

    python_s = best(loop)
    encode_s = best(lambda: tokenizer.encode(CALIBRATION_TEXT))
    return Calibration(CALIBRATION_LOOP / python_s / 1e6, tokens / encode_s / 1e3)


def run(args: list[str], sample_memory: bool = False) -> Run:
    """A `tito` command (exit 0 or 1 expected: the audit's exit says whether a rule fired), its wall and CPU time."""
    steal: list[float] = []
    with steal_watch(steal):
        started = time.perf_counter()
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errors
            )
            peak = PeakRss(proc.pid) if sample_memory else None
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - started
            if peak is not None:
                peak.stop()
            errors.seek(0)
            error = errors.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), (args, code, error[-2000:])
    return Run(wall, usage.ru_utime + usage.ru_stime, steal[0], peak.total if peak is not None else 0)


def scaling(
    name: str, command: list[str], sessions: int, jobs: int, calibrated: Calibration, memory: bool = False
) -> tuple[Run, Run]:
    """`-j 1` and `-j N` of one command, the host's capacity measured around `-j N`; prints the figures."""
    one = run([*command, "-j", "1"], sample_memory=memory)
    before = parallel_capacity(sys.executable, jobs)
    many = run([*command, "-j", str(jobs)])
    after = parallel_capacity(sys.executable, jobs)
    per_core = sessions / one.cpu
    print(
        f"{name} -j 1: {sessions} sessions in {one.wall:.1f} s wall, {one.cpu:.1f} s CPU: {per_core:.1f} sessions/s "
        f"per core (goal {GOALS[name]:g}; {sessions / one.wall:.1f}/s by the wall clock); host steal up to "
        f"{one.steal:.1f}%"
    )
    print(f"{name} -j 1, calibrated: {calibrated.per(per_core)}")
    speedup = one.wall / many.wall
    capacity = (before + after) / 2
    print(
        f"{name} -j {jobs}: {many.wall:.1f} s wall, {many.cpu:.1f} s CPU ({sessions / many.cpu:.1f} sessions/s per "
        f"core); scaling -j {jobs} / -j 1: {speedup:.2f}x, host capacity {before:.2f}x before and {after:.2f}x "
        f"after: {speedup / capacity:.2f} of the host's parallel capacity (goal {EFFICIENCY_GOAL}); host steal up "
        f"to {many.steal:.1f}%"
    )
    return one, many


def routes_variant(spec: dict[str, Any], plain: Path, sessions: int) -> None:
    """Replay and audit (`-j 1`) of the workload without and with expert routes, the same sessions: the rates and
    their ratio, by CPU time."""
    routed_spec = {**spec, "moe": ROUTES_MOE}
    routed = record(cache_dir(routed_spec), routed_spec, ("--enable-return-routed-experts",))
    print(f"routes cassette: {routed.stat().st_size / 2**20:.1f} MiB, without {plain.stat().st_size / 2**20:.1f} MiB")
    for name, command in (("replay", ["replay", "-q"]), ("audit", ["audit", "--json"])):
        without = run([command[0], str(plain), *command[1:], "-j", "1"])
        with_routes = run([command[0], str(routed), *command[1:], "-j", "1"])
        ratio = without.cpu / with_routes.cpu
        print(
            f"{name} with routes: {sessions / with_routes.cpu:.1f} sessions/s per core against "
            f"{sessions / without.cpu:.1f} without ({with_routes.cpu:.1f} s and {without.cpu:.1f} s CPU): ratio "
            f"{ratio:.2f} (goal {ROUTES_GOAL:g}); host steal up to {max(without.steal, with_routes.steal):.1f}%"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="the N of -j N (default 2: this host's cores)")
    parser.add_argument("--replay-sessions", type=int, default=512, help="replay the cassette's first N sessions")
    parser.add_argument("--skip-replay", action="store_true")
    parser.add_argument("--skip-audit", action="store_true")
    parser.add_argument("--sessions", type=int, default=SESSIONS, help="the scenario's first N sessions (2,048)")
    parser.add_argument("--calibration-only", action="store_true", help="print this machine's calibration alone")
    parser.add_argument("--routes", action="store_true", help="also the workload with expert routes, and the ratio")
    args = parser.parse_args()
    from tito_rl.cassette.reader import StoredSessions, open_cassette

    steal: list[float] = []
    with steal_watch(steal):
        calibrated = calibration()
    print(f"calibration: {calibrated}; host steal up to {steal[-1]:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.calibration_only:
        return
    spec = scenario(args.sessions)
    folder = cache_dir(spec)
    cassette = record(folder, spec)
    sessions = open_cassette(cassette, verify=False).sessions
    assert isinstance(sessions, StoredSessions)
    names = list(sessions.index)
    exchanges = sum(e.agent for e in sessions.index.values())
    print(
        f"cassette: {len(names)} sessions, {exchanges} agent exchanges, {cassette.stat().st_size / 2**20:.0f} MiB; "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"host parallel capacity at the start: {parallel_capacity(sys.executable, args.jobs):.2f}x of one process")
    if not args.skip_replay:
        count = min(args.replay_sessions, len(names))
        part = (
            cassette
            if count == len(names)
            else cut_with_golden(cassette, folder / f"first-{count}.tito", names[:count])
        )
        scaling("replay", ["replay", str(part), "-q"], count, args.jobs, calibrated)
    if not args.skip_audit:
        first = cut_with_golden(cassette, folder / "first-512.tito", names[:512])
        whole, _ = scaling("audit", ["audit", str(cassette), "--json"], len(names), args.jobs, calibrated, memory=True)
        small = run(["audit", str(first), "--json", "-j", "1"], sample_memory=True)
        print(
            f"audit memory: {whole.peak / 2**20:.0f} MiB for {len(names)} sessions "
            f"({cassette.stat().st_size / 2**20:.0f} MiB), {small.peak / 2**20:.0f} MiB for the first 512 "
            f"({first.stat().st_size / 2**20:.0f} MiB): ratio {whole.peak / small.peak:.2f} (flat: about 1.0); "
            f"host steal up to {small.steal:.1f}%"
        )
    if args.routes:
        routes_variant(spec, cassette, len(names))
    with steal_watch(steal):
        after = calibration()
    print(
        f"calibration after: {after}; host steal up to {steal[-1]:.1f}%; load average at the end: "
        f"{os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
