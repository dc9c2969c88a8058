"""The one-time builds of a fresh machine (the gateways' Pythons, the agent CLIs), each announced in a line when it
starts and one when it ends, with its size on disk and its time: a first `make test` spends minutes in pip and npm,
and without these lines nothing says what it is waiting on."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


@dataclass
class Build:
    """One build under way; a builder that fails without raising sets `ok` to False."""

    what: str  # what is installed: a pip or npm spec
    folder: Path  # where it ends up, measured when it is done
    ok: bool = True


def size_mb(folder: Path) -> float:
    """What `folder` takes on disk (allocated blocks, as du counts them; links not followed, each file once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                stat = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if (stat.st_dev, stat.st_ino) not in seen:
                seen.add((stat.st_dev, stat.st_ino))
                total += stat.st_blocks * 512
    return total / 1e6


@contextmanager
def announced(what: str, folder: Path, label: str = "tito", stream: TextIO | None = None) -> Iterator[Build]:
    """Print `<label>: installing WHAT into FOLDER (once; cached)`, run the build, then `<label>: installed WHAT:
    N MB in S s`, or `<label>: installing WHAT failed after S s` where it raised or set `ok` to False."""
    out = stream or sys.stderr
    build = Build(what, folder)
    print(f"{label}: installing {what} into {folder} (once; cached)", file=out, flush=True)
    started = time.monotonic()
    try:
        yield build
    except BaseException:
        build.ok = False
        raise
    finally:
        took = time.monotonic() - started
        if build.ok:
            print(f"{label}: installed {what}: {size_mb(folder):.0f} MB in {took:.0f} s", file=out, flush=True)
        else:
            print(f"{label}: installing {what} failed after {took:.0f} s", file=out, flush=True)
