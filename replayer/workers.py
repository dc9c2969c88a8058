"""Where `tito replay` and `tito audit` run their work units when not in this process: worker processes forked on
this machine (`-j N`), or tasks on an existing Ray cluster (`--ray ADDRESS`, `--ray auto`).

A unit is a `replayer/units.py` work unit (a range of one cassette's sessions); `running(backend)` gives the
dispatcher that runs `run_unit(job, unit)` for each unit and yields the results in the order of the units,
whichever finishes first, so that what the caller prints from the results is the same bytes on either backend.
An exception a unit raises is raised here with its type, as in one process.

Ray is an optional extra (`pip install 'tito-rl[ray]'`), imported only when `--ray` asks for it. A Ray task reads
the cassettes where it runs: the same paths (the working directory of `tito`, for relative ones) must hold the same
files on every node, as a shared file system gives, and the cluster's Python must have the same tito installed.
Each task checks both before its unit, and the run fails in one line naming the path or version and the host where
they are not so (docs/replay.md, "Ray").
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

from tito_rl.replayer.units import Dispatch, pool_dispatch, run_unit

C = TypeVar("C")
U = TypeVar("U")
R = TypeVar("R")

RAY_EXTRA = "pip install 'tito-rl[ray]'"
CONNECT_TIMEOUT_S = 10.0  # a cluster's address that answers nothing within this is unreachable (ray.init: 6 times it)
AHEAD = 2  # tasks submitted per CPU of the cluster beyond those whose results are awaited
RETRIES = 2  # a task whose worker died (a node lost) runs again: a unit's result does not depend on where it ran


class WorkersError(Exception):
    """The workers cannot run the units (Ray missing or unreachable, a cassette not where a worker runs); its
    message is one line, for the command's `tito COMMAND: ...`."""


@dataclass(frozen=True)
class Backend:
    """What the user chose: `jobs` worker processes here, or the Ray cluster at `ray` (an address, or `auto`)."""

    jobs: int = 1
    ray: str | None = None

    @property
    def remote(self) -> bool:
        return self.ray is not None


@contextmanager
def running(backend: Backend) -> Iterator[tuple[Dispatch, int]]:
    """The backend ready to take units, as (a dispatcher, how many units it runs at once): `-j`'s forked processes
    (what this process loaded is theirs), or this process connected to the Ray cluster as a
    driver, disconnected at the end (the cluster goes on). `WorkersError` where Ray is not installed or its cluster
    cannot be reached."""
    if backend.ray is None:
        yield pool_dispatch(backend.jobs), max(1, backend.jobs)
        return
    cluster = RayWorkers(backend.ray)
    try:
        yield (lambda units, job: cluster.map(run_unit, job, units, job.reads)), cluster.slots
    finally:
        cluster.close()


# ---- tasks on a Ray cluster ----


class RayWorkers:
    """This process connected to a Ray cluster as a driver, its units sent as tasks of one CPU each; a few per CPU
    are in flight at a time, and the results are taken in order."""

    def __init__(self, address: str) -> None:
        self.ray = _import_ray()
        self.address = address
        target = resolve_address(address)
        if target is not None:
            check_reachable(address, target)
        connect(self.ray, address, target or "auto", driver_timeout_s())
        cpus = self.ray.cluster_resources().get("CPU", 1)
        self.slots = max(1, int(cpus))

    def map(
        self,
        function: Callable[[C, U], R],
        context: C,
        units: Sequence[U],
        reads: Callable[[U], Sequence[str]] | None = None,
    ) -> Iterator[R]:
        ray = self.ray
        task = ray.remote(num_cpus=1, max_retries=RETRIES)(run_task)
        shared = ray.put(context)
        cwd, version = os.getcwd(), tito_version()
        pending: deque[Any] = deque()
        submitted = iter(units)

        def submit() -> None:
            for unit in itertools.islice(submitted, 1):
                files = manifest(reads(unit) if reads is not None else ())
                pending.append(task.remote(function, shared, unit, files, cwd, version))

        for _ in range(self.slots * (1 + AHEAD)):
            submit()
        while pending:
            ref = pending.popleft()
            submit()
            try:
                ok, value = ray.get(ref)
            except ray.exceptions.RayError as exc:
                raise WorkersError(f"--ray {self.address}: a task failed on the cluster: {task_failure(exc)}") from None
            if not ok:
                raise value
            yield value

    def close(self) -> None:
        self.ray.shutdown()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise WorkersError(f"--ray needs Ray, which is not installed here: {RAY_EXTRA}") from None
    return ray


def resolve_address(address: str) -> str | None:
    """The cluster's address: as given, or for `auto` the one `RAY_ADDRESS` names; None for `auto` without it
    (Ray then looks for a cluster started on this machine)."""
    if address == "auto":
        return os.environ.get("RAY_ADDRESS") or None
    return address


RAY_TIMEOUT_ENV = "TITO_RAY_CONNECT_TIMEOUT_S"


def driver_timeout_s() -> float:
    """How long `ray.init` may take as the cluster's driver: six times `CONNECT_TIMEOUT_S`, or `RAY_TIMEOUT_ENV`'s
    seconds (a host so loaded that a driver takes over a minute to join; an unusable value is the default)."""
    try:
        given = float(os.environ.get(RAY_TIMEOUT_ENV, ""))
    except ValueError:
        return CONNECT_TIMEOUT_S * 6
    return given if given > 0 else CONNECT_TIMEOUT_S * 6


def check_reachable(given: str, target: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A TCP connection to the cluster's `HOST:PORT` (a `ray://` address too), so that an address where nothing
    listens fails at once in one line rather than after Ray's own retries."""
    hostport = target.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # not HOST:PORT: Ray says what it makes of it
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        said = "" if given == target else f" (RAY_ADDRESS={target})"
        raise WorkersError(
            f"--ray {given}{said}: no Ray cluster answers at {hostport} ({exc.strerror or type(exc).__name__})"
        ) from None


def connect(ray: Any, given: str, target: str, timeout_s: float) -> None:
    """`ray.init` as a driver of the cluster at `target`, bounded: Ray retries an address that accepts connections
    but does not answer as a cluster for many minutes. Ray's own messages (its core writes to the standard error
    itself) are kept from the terminal meanwhile; what goes wrong is said in one line."""
    outcome: list[BaseException | None] = []

    def init() -> None:
        try:
            ray.init(
                address=target,
                log_to_driver=False,  # the workers' output is theirs: the command prints its report only
                # Ray's logging down to what would be fatal: a failure is said in one line by tito, and results left
                # unread after one would be logged again as "unhandled" errors
                logging_level=logging.CRITICAL,
            )
            outcome.append(None)
        except Exception as exc:  # ray.init's failures are of many types (ConnectionError, RuntimeError, ...)
            outcome.append(exc)

    thread = threading.Thread(target=init, name="ray-connect", daemon=True)
    with _quiet_stderr():
        thread.start()
        thread.join(timeout_s)
    if not outcome:
        raise WorkersError(f"--ray {given}: {target} did not answer as a Ray cluster within {timeout_s:.0f} s")
    failure = outcome[0]
    if failure is not None:
        if given == "auto" and "Could not find any running Ray instance" in str(failure):
            raise WorkersError(
                "--ray auto: no Ray cluster found (RAY_ADDRESS is not set, and none runs on this machine)"
            )
        raise WorkersError(f"--ray {given}: {_first_line(failure)}")


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null for the block (Ray's C++ core prints its retries there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def manifest(paths: Sequence[str]) -> list[tuple[str, int]]:
    """The files a unit reads as this machine sees them, each with its size (-1: a folder)."""
    out = []
    for path in paths:
        full = os.path.abspath(path)
        out.append((full, -1 if os.path.isdir(full) else os.path.getsize(full)))
    return out


@cache
def tito_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tito-rl")
    except PackageNotFoundError:
        return "unknown"


def run_task(
    function: Callable[[C, U], R], context: C, unit: U, files: list[tuple[str, int]], cwd: str, version: str
) -> tuple[bool, R | BaseException]:
    """One unit, on a Ray worker: the same tito, its files where the driver saw them, then the unit run in the
    driver's working directory (relative paths name the same files). (False, the exception) when it raised."""
    try:
        check_worker(files, version)
        if os.path.isdir(cwd):
            os.chdir(cwd)
        return True, function(context, unit)
    except Exception as exc:
        return False, exc


def check_worker(files: list[tuple[str, int]], version: str) -> None:
    """`WorkersError` naming this host unless its tito is the driver's and every file is here, readable and of the
    size the driver saw."""
    host = socket.gethostname()
    here = tito_version()
    if here != version:
        raise WorkersError(f"tito {here} on Ray worker {host}, {version} here: install the same tito on every node")
    for path, size in files:
        try:
            if size < 0:
                os.listdir(path)
                continue
            with open(path, "rb") as file:
                found = os.fstat(file.fileno()).st_size
        except OSError as exc:
            raise WorkersError(
                f"{path}: {exc.strerror or 'cannot be read'} on Ray worker {host} "
                "(--ray reads the cassettes where the workers run: the same path on every node)"
            ) from None
        if found != size:
            raise WorkersError(
                f"{path}: {found} bytes on Ray worker {host}, {size} here (--ray needs the same files on every node)"
            )


def task_failure(exc: BaseException) -> str:
    """What a Ray task's failure says, in a line: its innermost error (Ray's message holds the worker's traceback),
    with the likely cause where that is tito not being importable there."""
    lines = [_ANSI.sub("", line).strip() for line in str(exc).splitlines()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    said = errors[-1] if errors else _first_line(exc)
    if "tito_rl" in said and "ModuleNotFoundError" in said:
        said += " (tito must be installed in the Python the cluster's workers run)"
    return said


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
