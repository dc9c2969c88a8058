"""The seeded cassette fuzz run's time (tests/cassette_fuzz.py), moved here from its test (issue 40): the slowest
mutated file against the mean one, in the same run. A hostile file the reader's budgets fail to bound shows as a
ratio in the hundreds; the test asserts only the outcomes and the memory.

Prints `fuzz: <N> cases in <T> s, slowest case <S> s (<which>), mean <M> ms, ratio slowest/mean: <S/M>, host steal
<P>%`."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import cassette_fuzz  # noqa: E402


def main() -> int:
    report = cassette_fuzz.fuzz()
    mean = report.seconds / report.total
    print(f"fuzz: {report.total} cases in {report.seconds:.1f} s, slowest case {report.slowest_s:.2f} s "
          f"({report.slowest_case}), mean {1000 * mean:.1f} ms, ratio slowest/mean: {report.slowest_s / mean:.0f}, "
          f"host steal {report.steal_pct:.1f}%, load average {report.load:.2f}")
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
