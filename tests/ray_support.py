"""A Ray cluster on this machine, started as a user starts one (`ray start --head`) for `--ray` to connect to: the
test's (tests/test_ray.py) and the benchmark's (benchmarks/bench_ray.py). Loopback only, its files in a temporary
folder, and every process it started ended by their process group, the folder removed: nothing is left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# Ray binds a cluster to the machine's outward address unless told it is a one-machine cluster; a driver connecting
# to it must be told too (Ray reads this when it is imported).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
# The cluster's own node is declared dead by its GCS after 5 health checks of 10 s missed 3 s apart (Ray's defaults):
# on a two-core host under the whole suite's load (load average 8-10) a starved raylet can miss them, and the cluster
# then no longer takes a driver ("did not answer as a Ray cluster"). The test cluster is patient instead.
PATIENT = {
    "RAY_health_check_period_ms": "10000",
    "RAY_health_check_timeout_ms": "60000",
    "RAY_health_check_failure_threshold": "30",
}


@contextmanager
def local_cluster(cpus: int = 2) -> Iterator[str]:
    """The cluster's address (HOST:PORT) while the block runs."""
    folder = tempfile.mkdtemp(prefix="tito-ray-")  # short: Ray's socket paths under it must fit in 107 bytes
    started = subprocess.run(
        [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--head",
            "--port=0",
            f"--num-cpus={cpus}",
            "--object-store-memory=80000000",
            f"--temp-dir={folder}",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        env={**os.environ, **LOOPBACK, **PATIENT},
        capture_output=True,
        text=True,
        timeout=180,
        start_new_session=True,  # every process it starts keeps its process group: ended together below
    )
    group = _group_of(folder)
    try:
        if started.returncode != 0:
            raise RuntimeError(f"ray start failed: {started.stdout[-2000:]}{started.stderr[-2000:]}")
        yield (Path(folder) / "ray_current_cluster").read_text().strip()
    finally:
        if group is not None:
            os.killpg(group, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)


def _group_of(folder: str) -> int | None:
    """The process group of the cluster's processes: those whose command line names its folder."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if folder.encode() in command:
            return os.getpgid(int(pid))
    return None
