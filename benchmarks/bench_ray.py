"""`--ray` against `-j` on this machine: the same units of the same cassette on the same cores, in one run.

A Ray cluster of this machine's CPUs is started as a user starts one (`ray start --head`, loopback; ended after,
tests/ray_support.py), and each command runs with `-j N` and with `--ray ADDRESS`, N the cluster's CPUs:

- replay: every 16th session of the production cassette (`bench_production.py`; 128 sessions with their golden
  sections, the cut `bench_audit.py` replays);
- audit: the production cassette cut into 8 cassettes of 256 sessions, a run's folder as `tito record
  --rotate-sessions` leaves it (a cassette is the audit's unit).

Each output is checked to be the same bytes both ways. Printed: the seconds of each, the ratio Ray / -j (above 1:
Ray is the slower), the host's steal during each, and its parallel capacity (what two CPU-bound processes get done
at once, `host_steal.py`). Ray's tasks load the tokenizer and parsers in each worker, where `-j`'s forked workers
inherit them from the parent: that start-up, and connecting to the cluster, is the difference on one machine.

    .venv/bin/python benchmarks/bench_ray.py      (needs Ray: make ray)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_production import cache_dir, cut_with_golden, record, scenario, timed  # noqa: E402
from host_steal import parallel_capacity, steal_watch  # noqa: E402

from tests.ray_support import LOOPBACK, local_cluster  # noqa: E402

SESSIONS = 2048
STRIDE = 16
PARTS = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 2, help="the cluster's CPUs and -j's N")
    parser.add_argument(
        "--cassette", type=Path, help="another cassette with its golden instead of the production one (a quick run)"
    )
    args = parser.parse_args()
    try:
        import ray  # noqa: F401
    except ImportError:
        sys.exit("bench_ray: Ray is not installed here (make ray, or pip install 'tito-rl[ray]')")
    os.environ.update(LOOPBACK)  # the `tito` processes below connect to a loopback cluster
    from tito_rl.cassette.reader import summarize
    from tito_rl.replayer.cassette_tools.cut_merge import cut

    if args.cassette is not None:
        cassette = args.cassette.resolve()
        folder = cache_dir({"cassette": str(cassette), "size": cassette.stat().st_size})
    else:
        spec = scenario(SESSIONS)
        folder = cache_dir(spec)
        cassette = record(folder, spec)
    names = [s.session for s in summarize(cassette, verify=False).sessions]
    replayed = cut_with_golden(cassette, folder / f"every-{STRIDE}th.tito", names[::STRIDE])
    run = folder / f"run-of-{PARTS}"
    run.mkdir(exist_ok=True)
    size = max(1, len(names) // PARTS)
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
        f"audit: {PARTS} cassettes of {size} sessions; {args.cpus} CPUs; {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"host parallel capacity: {parallel_capacity(sys.executable):.2f} of 2.00")
    with local_cluster(cpus=args.cpus) as address:
        for what, command in commands.items():
            steal: list[float] = []
            with steal_watch(steal):
                local_s, _, local_out = timed(*command, "-j", str(args.cpus))
            with steal_watch(steal):
                ray_s, _, ray_out = timed(*command, "--ray", address)
            assert local_out == ray_out, f"{what}: --ray printed other bytes than -j"
            print(
                f"{what}: -j {args.cpus} {local_s:.1f} s (steal up to {steal[0]:.1f}%), --ray {ray_s:.1f} s (steal up "
                f"to {steal[1]:.1f}%); ratio --ray / -j {ray_s / local_s:.2f}; the same output"
            )


if __name__ == "__main__":
    main()
