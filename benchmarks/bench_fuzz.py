"""The seeded cassette fuzz run's time (tests/cassette_fuzz.py), moved here from its test (issue 40): the slowest
mutated file against the mean one, in the same run (the slowest is a zlib bomb the reader's budget cuts short: about
90x the mean on a quiet host, 225x with its two cores loaded); the test asserts only the outcomes and the memory.

Prints `fuzz: <N> cases in <T> s, slowest case <S> s (<which>), mean <M> ms, ratio slowest/mean: <S/M>, host steal
<P>%`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    done = subprocess.run(
        [sys.executable, "-m", "tests.cassette_fuzz", "--json"], cwd=ROOT, capture_output=True, text=True
    )
    report = json.loads(done.stdout)
    mean = report["seconds"] / report["cases"]
    print(
        f"fuzz: {report['cases']} cases in {report['seconds']:.1f} s, slowest case {report['slowest_s']:.2f} s "
        f"({report['slowest_case']}), mean {1000 * mean:.1f} ms, ratio slowest/mean: "
        f"{report['slowest_s'] / mean:.0f}, host steal {report['steal_pct']:.1f}%, load average {report['load']:.2f}"
    )
    return 1 if report["findings"] or done.returncode else 0


if __name__ == "__main__":
    sys.exit(main())
