"""`tito audit` on the production cassette (`bench_production.py`, 2,048 sessions): fast and flat, in one run.

- time: the whole cassette's audit against its `tito replay -j 1`. A whole replay with `-j 1` takes minutes on
  2 cores, so the replay is measured on a cut of every 16th session (128 sessions, their goldens sliced from the
  whole one's) and scaled to the whole cassette by the share of engine calls the cut holds (said in the output);
  `--full-replay` replays the whole cassette instead. The ratio must be at most 1/10.
- memory: the audit's peak (PSS, sampled every 50 ms) on the whole cassette against the first 512 sessions' cut:
  at most 1.1x, since the audit holds only the sessions live at once.

    .venv/bin/python benchmarks/bench_audit.py [--full-replay]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_production import cache_dir, cut_with_golden, record, scenario, timed  # noqa: E402
from host_steal import steal_watch  # noqa: E402

SESSIONS = 2048
STRIDE = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full-replay", action="store_true", help="replay the whole cassette (minutes)")
    args = parser.parse_args()
    from tito_rl.cassette.reader import summarize

    spec = scenario(SESSIONS)
    folder = cache_dir(spec)
    cassette = record(folder, spec)
    summary = summarize(cassette, verify=False)
    names = [s.session for s in summary.sessions]
    calls = {s.session: s.engine_exchanges for s in summary.sessions}
    first = cut_with_golden(cassette, folder / "first-512.tito", names[:512])
    steal: list[float] = []
    with steal_watch(steal):
        whole_s, whole_peak, _ = timed("audit", str(cassette), "--json", "--fail-on", "")
        cut_s, cut_peak, _ = timed("audit", str(first), "--json", "--fail-on", "")
        if args.full_replay:
            replay_s, _, _ = timed("replay", str(cassette), "-j", "1")
            how = "the whole cassette replayed"
        else:
            chosen = names[::STRIDE]
            part = cut_with_golden(cassette, folder / f"every-{STRIDE}th.tito", chosen)
            part_s, _, _ = timed("replay", str(part), "-j", "1")
            share = sum(calls[n] for n in chosen) / sum(calls.values())
            replay_s = part_s / share
            how = (
                f"replay of every {STRIDE}th session ({len(chosen)} sessions, {share:.1%} of the engine calls) "
                f"took {part_s:.1f} s, scaled by engine calls"
            )
    print(
        f"cassette: {cassette} ({len(names)} sessions, {sum(calls.values())} engine calls, "
        f"{cassette.stat().st_size / 2**20:.0f} MiB); {time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"audit of the whole cassette: {whole_s:.1f} s, peak memory {whole_peak.total / 2**20:.0f} MiB")
    print(f"audit of the first 512 sessions: {cut_s:.1f} s, peak memory {cut_peak.total / 2**20:.0f} MiB")
    print(f"replay -j 1 of the whole cassette: {replay_s:.1f} s ({how})")
    print(f"time ratio audit / replay -j 1: {whole_s / replay_s:.3f} (at most 0.100)")
    print(f"memory ratio 2,048 / 512 sessions: {whole_peak.total / cut_peak.total:.2f}x (at most 1.10x)")
    print(f"host steal during the run: {max(steal, default=0.0):.1f}%")


if __name__ == "__main__":
    main()
