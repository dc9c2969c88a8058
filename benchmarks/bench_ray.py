"""`--ray` against `-j` on this machine: the same units of the same cassette on the same cores, in one run.

A Ray cluster of this machine's CPUs is started as a user starts one (`ray start --head`, loopback; ended after,
tests/ray_support.py), and each command runs with `-j N` and with `--ray ADDRESS`, N the cluster's CPUs:

- replay: every 16th session of the production cassette (`bench_production.py`; 128 sessions with their golden
  sections, the cut `bench_audit.py` replays);
- audit: the production cassette's first 1,024 sessions cut into 4 cassettes of 256, a run's folder as `tito
  record --rotate-sessions` leaves it (a cassette is the audit's unit).

Each output is checked to be the same bytes both ways. Printed: the seconds of each, the ratio Ray / -j (above 1:
Ray is the slower), the host's steal during each, and its parallel capacity (what two CPU-bound processes get done
at once, `host_steal.py`). Ray's tasks load the tokenizer and parsers in each worker, where `-j`'s forked workers
inherit them from the parent: that start-up, and connecting to the cluster, is the difference on one machine.

    .venv/bin/python benchmarks/bench_ray.py      (needs Ray: make ray)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_production import ROOT, cache_dir, cut_with_golden, record, scenario  # noqa: E402
from host_steal import parallel_capacity, steal_watch  # noqa: E402

from tests.ray_support import LOOPBACK, local_cluster  # noqa: E402

SESSIONS = 2048
STRIDE = 16
PARTS, PART_SESSIONS = 4, 256  # a run's folder: the first 1,024 sessions in 4 cassettes (cutting takes minutes each)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="the cluster's CPUs and -j's N")
    parser.add_argument(
        "--cassette", type=Path, help="another cassette with its golden instead of the production one (a quick run)"
    )
    parser.add_argument("--repeat", type=int, default=2, help="runs of each, the fastest kept (default 2)")
    args = parser.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        sys.exit("bench_ray: Ray is not installed here (make ray, or pip install 'tito-rl[ray]')")
    os.environ.update(LOOPBACK)  # the `tito` processes below connect to a loopback cluster
    with tempfile.TemporaryDirectory(prefix="tito-bench-ray-") as scratch:
        if args.cassette is not None:  # its cuts in a folder of this run's
            compare(args.cassette.resolve(), Path(scratch), args.cpus, args.repeat)
        else:
            spec = scenario(SESSIONS)
            folder = cache_dir(spec)
            compare(record(folder, spec), folder, args.cpus, args.repeat)


def timed(*args: str) -> tuple[float, str]:
    """Wall seconds and output of a `tito` command (exit 0 expected), run in a session of its own: with the
    scheduler's autogroups (Linux) a session shares the CPU with the other sessions as one, and the Ray cluster runs
    in its own (`ray start`), so that each command gets the share the cluster's workers get."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tito_rl", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    out, err = proc.communicate()
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, (args, out[-2000:], err[-2000:])
    return elapsed, out


def compare(cassette: Path, folder: Path, cpus: int, repeat: int) -> None:
    """The cuts made (kept in `folder`), then each command run both ways, in turn, `repeat` times: the fastest of
    each kept, with the most steal any of its runs saw."""
    from tito_rl.cassette.reader import summarize
    from tito_rl.replayer.cassette_tools.cut_merge import cut

    names = [s.session for s in summarize(cassette, verify=False).sessions]
    replayed = cut_with_golden(cassette, folder / f"every-{STRIDE}th.tito", names[::STRIDE])
    size = max(1, min(PART_SESSIONS, len(names) // PARTS))
    run = folder / f"parts-of-{size}"
    run.mkdir(exist_ok=True)
    for i in range(min(PARTS, len(names))):
        part = run / f"part-{i:04d}.tito"
        if not part.is_file():
            cut(cassette, part, names[i * size : (i + 1) * size])

    commands = {
        "replay": ("replay", str(replayed)),
        "audit": ("audit", str(run), "--json", "--fail-on", ""),
    }
    print(
        f"cassette: {cassette} ({len(names)} sessions); replay: {replayed.name} ({len(names[::STRIDE])} sessions); "
        f"audit: {PARTS} cassettes of {size} sessions; {cpus} CPUs; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"host parallel capacity: {parallel_capacity(sys.executable):.2f} of 2.00")
    with local_cluster(cpus=cpus) as address:
        for what, command in commands.items():
            times: dict[str, list[float]] = {"-j": [], "--ray": []}
            steal: dict[str, list[float]] = {"-j": [], "--ray": []}
            outputs = set()
            for _ in range(repeat):
                for how, spread in (("-j", str(cpus)), ("--ray", address)):
                    with steal_watch(steal[how]):
                        seconds, out = timed(*command, how, spread)
                    times[how].append(seconds)
                    outputs.add(out)
            assert len(outputs) == 1, f"{what}: --ray printed other bytes than -j"
            local_s, ray_s = min(times["-j"]), min(times["--ray"])
            print(
                f"{what}: -j {cpus} {local_s:.1f} s (steal up to {max(steal['-j']):.1f}%), --ray {ray_s:.1f} s "
                f"(steal up to {max(steal['--ray']):.1f}%); ratio --ray / -j {ray_s / local_s:.2f}; the same output"
            )


if __name__ == "__main__":
    main()
