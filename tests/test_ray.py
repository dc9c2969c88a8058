"""`tito audit --ray` and `tito replay --ray` against a real local Ray cluster that this module starts (`ray start
--head`, two CPUs, loopback only, its files in a temporary folder removed afterwards): the same output, exit codes,
exports, JUnit and HTML as `-j`, byte for byte, and each way it cannot run said in one line (Ray not installed, no
cluster at the address, a cassette not where a worker runs, another tito there)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process_helpers import ROOT
from tests.ray_support import LOOPBACK, local_cluster
from tito_rl.main import main
from tito_rl.replayer import workers

# One worker runs the module (tests/xdist_groups.py): one cluster.
pytestmark = pytest.mark.xdist_group("ray-cluster")

AUDITED = ("drift_realign", "mixed_concurrent", "openai_wires", "tool_loop", "compaction")
REPLAYED = ("drift_realign", "openai_wires", "tool_loop", "plain_chat")


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """The address of a Ray cluster on this machine (two CPUs), ended with the module."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (the `ray` extra; `make test` installs it)")
    with local_cluster(cpus=2) as address:
        yield address


def tito(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tito_rl", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **LOOPBACK, **(env or {})},
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def copy_corpus(folder: Path, names: tuple[str, ...]) -> Path:
    folder.mkdir()
    for name in names:
        for suffix in (".tito", ".golden", ".audit.toml"):
            source = ROOT / "cassettes" / f"{name}{suffix}"
            if source.is_file():
                shutil.copy(source, folder / source.name)
    return folder


# A driver that saw another size than the workers will (a copy of another length on their node): the audit fails.
OTHER_SIZE = """
import sys
from tito_rl.main import main
from tito_rl.replayer import workers

seen = workers.manifest
workers.manifest = lambda paths: [(p, s + 7) for p, s in seen(paths)]
sys.exit(main(["audit", sys.argv[2], "--ray", sys.argv[1]]))
"""


@pytest.mark.slow
def test_audit_and_replay_on_ray_give_the_bytes_of_workers(cluster: str, tmp_path: Path) -> None:
    """The audit from the run's folder with relative paths (the workers read them where tito was started), the
    replay with `--ray auto` and RAY_ADDRESS; each against `-j 2`, all at once. An allowlist taken away makes the
    audit fire and a changed golden fails one replayed session: exit 1 on both. A cassette a worker sees otherwise
    than tito did fails in one line naming it and the worker's host."""
    audited = copy_corpus(tmp_path / "run", AUDITED)
    (audited / "drift_realign.audit.toml").unlink()  # its rules fire unallowed (compaction's stay allowed)
    replayed = copy_corpus(tmp_path / "corpus", REPLAYED)
    golden = replayed / "drift_realign.golden"
    golden.write_text(golden.read_text().replace("reward 1, 283 tokens", "reward 1, 280 tokens"))
    runs = {}
    for name, spread, env in (("local", ["-j", "2"], None), ("remote", ["--ray", "auto"], {"RAY_ADDRESS": cluster})):
        folder = tmp_path / name
        folder.mkdir()
        page = ["--html", str(folder / "audit.html"), "--fail-on", "coverage,prefix-break"]
        runs[f"audit {name}"] = tito(audited, "audit", ".", *page, *spread, env=env)
        exports = [
            "--export-samples",
            str(folder / "replayed.jsonl"),
            "--export-live-samples",
            str(folder / "live.jsonl"),
        ]
        junit = ["--junit-xml", str(folder / "report.xml")]
        runs[f"replay {name}"] = tito(replayed, "replay", str(replayed), *exports, *junit, *spread, env=env)
    cassette = str(copy_corpus(tmp_path / "one", ("tool_loop",)) / "tool_loop.tito")
    other_size = subprocess.Popen(
        [sys.executable, "-c", OTHER_SIZE, cluster, cassette],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **LOOPBACK},
    )
    done = {name: finish(proc) for name, proc in runs.items()}

    for what in ("local", "remote"):
        assert done[f"audit {what}"] == (
            1,
            f"wrote {tmp_path / what / 'audit.html'} ({len(AUDITED)} cassette(s))\n",
            "",
        )
    assert done["replay local"] == done["replay remote"]  # exit code, output, errors
    code, out, err = done["replay remote"]
    assert code == 1 and " session(s): " in out and ", 1 failed" in out and err == ""
    for name in ("audit.html", "replayed.jsonl", "live.jsonl", "report.xml"):
        assert (tmp_path / "local" / name).read_bytes() == (tmp_path / "remote" / name).read_bytes(), name
    assert "drift_realign.tito" in (tmp_path / "remote" / "audit.html").read_text()

    size = Path(cassette).stat().st_size
    assert finish(other_size) == (
        2,
        "",
        f"tito audit: {cassette}: {size} bytes on Ray worker {socket.gethostname()}, {size + 7} here "
        "(--ray needs the same files on every node)\n",
    )


def length(_: None, unit: str) -> int:
    return len(unit)


def test_a_task_checks_its_files_and_tito_where_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a Ray task runs before its unit (here in this process): its files there, the same tito, then the unit in
    tito's working folder, so that a relative path names the same file. A failure comes back as the exception."""
    (tmp_path / "unit.txt").write_text("read where tito was started")
    monkeypatch.chdir(ROOT)
    here, host = workers.tito_version(), socket.gethostname()
    assert workers.run_task(lambda _, name: Path(name).read_text(), None, "unit.txt", [], str(tmp_path), here) == (
        True,
        "read where tito was started",
    )
    ok, gone = workers.run_task(length, None, "unit", [(str(tmp_path / "gone.tito"), 10)], str(tmp_path), here)
    assert (
        not ok
        and isinstance(gone, workers.WorkersError)
        and str(gone)
        == (
            f"{tmp_path / 'gone.tito'}: No such file or directory on Ray worker {host} "
            "(--ray reads the cassettes where the workers run: the same path on every node)"
        )
    )
    ok, other = workers.run_task(length, None, "unit", [], str(tmp_path), "0.0.0-other")
    assert (
        not ok
        and str(other) == f"tito {here} on Ray worker {host}, 0.0.0-other here: install the same tito on every node"
    )
    ok, raised = workers.run_task(lambda _, unit: 1 / 0, None, "unit", [], str(tmp_path), here)
    assert not ok and isinstance(raised, ZeroDivisionError)


# An address that accepts connections and never answers: Ray would retry for many minutes; tito gives it 6 times the
# TCP timeout, here 1 s.
NOT_A_CLUSTER = """
import sys
from tito_rl.main import main
from tito_rl.replayer import workers

workers.CONNECT_TIMEOUT_S = 1 / 6
sys.exit(main(["audit", sys.argv[1], "--ray", sys.argv[2]]))
"""


def test_no_cluster_at_the_address_is_said_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (the `ray` extra; `make test` installs it)")
    cassette = str(ROOT / "cassettes" / "tool_loop.tito")
    with socket.socket() as silent, socket.socket() as unused:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        unused.bind(("127.0.0.1", 0))  # bound, never listening: refused
        quiet, refused = (f"127.0.0.1:{s.getsockname()[1]}" for s in (silent, unused))
        run = subprocess.run(
            [sys.executable, "-c", NOT_A_CLUSTER, cassette, quiet],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **LOOPBACK},
        )
        assert (run.returncode, run.stdout) == (2, "")
        assert run.stderr == f"tito audit: --ray {quiet}: {quiet} did not answer as a Ray cluster within 1 s\n"

        assert main(["audit", cassette, "--ray", refused]) == 2
        assert capsys.readouterr().err == (
            f"tito audit: --ray {refused}: no Ray cluster answers at {refused} (Connection refused)\n"
        )
        monkeypatch.setenv("RAY_ADDRESS", refused)
        assert main(["replay", cassette, "--ray", "auto"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"tito replay: --ray auto (RAY_ADDRESS={refused}): no Ray cluster answers at {refused} (Connection refused)\n"
    )


def test_a_task_that_failed_on_the_cluster_is_said_by_its_innermost_error() -> None:
    """Ray's message for a task that could not run holds the worker's traceback, coloured: one line is kept."""
    failure = RuntimeError(
        "\x1b[36mray::run_task()\x1b[39m (pid=32085, ip=127.0.0.1)\n"
        "  At least one of the input arguments for this task could not be computed:\n"
        "ray.exceptions.RaySystemError: System error: No module named 'tito_rl'\n"
        "traceback: Traceback (most recent call last):\n"
        "          ^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "ModuleNotFoundError: No module named 'tito_rl'"
    )
    assert workers.task_failure(failure) == (
        "ModuleNotFoundError: No module named 'tito_rl' "
        "(tito must be installed in the Python the cluster's workers run)"
    )
    assert workers.task_failure(RuntimeError("\n  the worker died\n")) == "the worker died"


@pytest.mark.parametrize("command", ["audit", "replay"])
def test_ray_not_installed_is_said_with_the_install_command(
    command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray is never a dependency of tito: only `--ray` imports it."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as where it is not installed
    assert main([command, str(ROOT / "cassettes" / "tool_loop.tito"), "--ray", "auto"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        f"tito {command}: --ray needs Ray, which is not installed here: pip install 'tito-rl[ray]'\n"
    )


def test_ray_is_neither_with_jobs_nor_through_a_running_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    cassette = str(ROOT / "cassettes" / "tool_loop.tito")
    for command in ("audit", "replay"):
        with pytest.raises(SystemExit) as exit_:
            main([command, cassette, "-j", "2", "--ray", "auto"])
        assert (
            exit_.value.code == 2 and "argument --ray: not allowed with argument -j/--jobs" in capsys.readouterr().err
        )
    assert main(["replay", cassette, "--target", "http://127.0.0.1:9", "--ray", "auto"]) == 2
    assert capsys.readouterr().err == (
        "tito replay: --ray cannot replay through the running gateway http://127.0.0.1:9: its engine leg is one port "
        "here\n"
    )


@pytest.mark.parametrize(("given", "bound"), [(None, 60.0), ("300", 300.0), ("0", 60.0), ("soon", 60.0)])
def test_the_drivers_join_is_bounded_by_60_s_or_the_users_seconds(
    given: str | None, bound: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`TITO_RAY_CONNECT_TIMEOUT_S` lets a loaded host's driver take longer to join; what is not a positive number
    leaves the default."""
    if given is None:
        monkeypatch.delenv(workers.RAY_TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(workers.RAY_TIMEOUT_ENV, given)
    assert workers.driver_timeout_s() == bound
