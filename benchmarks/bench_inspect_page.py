"""`tito inspect --html`'s page for a long session (150k tokens, 14 outputs), moved here from its test (issue 40):
its render time against a session a tenth as long, in the same process. A page that renders in time linear in the
session prints a ratio near 1; the test asserts the page's size and every trained token shown.

Prints `inspect page: <X> s for 150k tokens, <Y> s for 15k, ratio X / (10 Y): <R>`; best of 3 each."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.test_inspect import synthetic  # noqa: E402
from tito_rl.replayer.inspection.html_page import render_html  # noqa: E402
from tito_rl.trajectory.linearize import Span  # noqa: E402


def render_seconds(n: int) -> float:
    prompt, step = n * 2 // 15, n // 15
    spans = [Span(t, start, 400, True) for t, start in enumerate(range(prompt + step // 2, n, step))]
    inspection = synthetic(list(range(n)), prompt, spans, [], [])
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        render_html(inspection)
        best = min(best, time.perf_counter() - started)
    return best


def main() -> int:
    small, large = render_seconds(15_000), render_seconds(150_000)
    print(
        f"inspect page: {large:.2f} s for 150k tokens, {small:.3f} s for 15k, ratio X / (10 Y): "
        f"{large / (10 * small):.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
