"""tito's built wheel installed into a fresh venv that already holds PyPI's `recorder`, `replayer` and
`trajectory`: the three projects that have the names of tito's folders. Before the `tito_rl` namespace, pip merged
tito's `replayer/` into theirs, and uninstalling theirs deleted tito's `__init__.py`.

The venv gets tito's wheel and the three with no dependencies; what tito and pytest import comes from this venv's
site-packages through a `.pth` line (appended after the venv's own site-packages, so the venv's packages win).
The three projects' wheels (and `six`, which PyPI's `trajectory` imports) are built once from PyPI and kept in
this venv's `tito-test-homonyms/`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HOMONYMS = ("recorder==0.0.2", "replayer==0.5.4", "trajectory==0.1.1", "six==1.16.0")  # six: trajectory's own need
PACKAGE_FOLDERS = ("tito_rl", "trajectory", "cassette", "fake_engine", "recorder", "replayer")
CASSETTE = ROOT / "cassettes" / "plain_chat.tito"

# Run in the venv: the homonyms import as themselves (PyPI's recorder needs pyaudio, a C extension this venv has
# not got: a stand-in module lets its own code import), and tito_rl's packages come from the installed wheel.
BOTH_SIDES = """
import sys, types
sys.modules["pyaudio"] = types.SimpleNamespace(paInt16=8)  # the one name its module body reads
import recorder, replayer, trajectory
import tito_rl.main, tito_rl.replayer.replay.cassette_replay, tito_rl.recorder.targets.registry
import tito_rl.trajectory.manager
assert hasattr(recorder, "Recorder") and replayer.__version__ == "0.5.4" and hasattr(trajectory, "encode")
for module in (recorder, replayer, trajectory, tito_rl.main, tito_rl.replayer.replay.cassette_replay,
               tito_rl.trajectory.manager):
    assert module.__file__.startswith(sys.prefix), module.__file__
print("both sides import")
"""

PLUGIN_TEST = """
import sys

def test_both_sides_import_under_pytest():
    import replayer, trajectory
    import tito_rl.replayer.pytest_plugin.plugin as plugin
    assert replayer.__version__ == "0.5.4" and hasattr(trajectory, "encode")
    assert plugin.__file__.startswith(sys.prefix), plugin.__file__
"""


def homonym_wheels() -> list[Path]:
    """PyPI's three same-named projects as wheels, built once (sdists among them) and kept beside this venv."""
    cache = Path(sys.prefix) / "tito-test-homonyms"
    wheels = sorted(cache.glob("*.whl"))
    if len(wheels) < len(HOMONYMS):
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(cache),
                *HOMONYMS,
            ]
        )
        wheels = sorted(cache.glob("*.whl"))
    assert [w.name.split("-")[0] for w in wheels] == ["recorder", "replayer", "six", "trajectory"], wheels
    return wheels


def source_copy(tmp_path: Path) -> Path:
    """What a build of tito needs, copied from the checkout (which is left without build output)."""
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in PACKAGE_FOLDERS:
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore, symlinks=True)  # as a clone has them
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    return source


def tito_wheel(tmp_path: Path) -> Path:
    """The wheel `pip wheel .` builds, from a copy of what it needs."""
    source = source_copy(tmp_path)
    out = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)])
    (wheel,) = out.glob("tito_rl-*.whl")
    return wheel


def run(
    argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.slow
def test_the_wheel_installs_and_runs_beside_pypis_same_named_projects(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python, tito = venv / "bin" / "python", venv / "bin" / "tito"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "zz-tito-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index"]
    run([*pip, *map(str, homonym_wheels())])
    run([*pip, str(tito_wheel(tmp_path))])
    # Each project keeps its own folder: nothing of tito's inside theirs, theirs whole.
    assert not (site / "replayer" / "replay").exists() and (site / "replayer" / "http_worker.py").exists()
    assert (site / "tito_rl" / "replayer" / "replay" / "cassette_replay.py").exists()
    assert "the `tito` program lives here" in (site / "tito_rl" / "__init__.py").read_text()  # one package, tito's

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    work = tmp_path / "work"  # away from the checkout: its folders must not be on the path
    (work / "cassettes").mkdir(parents=True)
    shutil.copy2(CASSETTE, work / "cassettes" / CASSETTE.name)
    shutil.copy2(CASSETTE.with_suffix(".golden"), work / "cassettes" / CASSETTE.with_suffix(".golden").name)
    (work / "test_both_sides.py").write_text(PLUGIN_TEST)

    version = run([str(tito), "--version"], cwd=work, env=env)
    assert version.stdout == "tito 0.1.0\n", version.stdout
    replay = run([str(tito), "replay", "cassettes/"], cwd=work, env=env)
    assert "1 session(s): 1 ok, 0 failed" in replay.stdout, replay.stdout
    assert run([str(python), "-c", BOTH_SIDES], cwd=work, env=env).stdout == "both sides import\n"
    tests = run([str(python), "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:xdist"], cwd=work, env=env)
    assert "cassettes/plain_chat.tito::sid-" in tests.stdout and " PASSED" in tests.stdout, tests.stdout
    assert "2 passed" in tests.stdout, tests.stdout

    # Uninstalling a homonym takes only its own files.
    run([sys.executable, "-m", "pip", "--python", str(python), "uninstall", "-q", "-y", "replayer"])
    assert not (site / "replayer").exists(), sorted(map(str, (site / "replayer").rglob("*")))
    again = run([str(tito), "replay", "cassettes/"], cwd=work, env=env)
    assert "1 ok, 0 failed" in again.stdout, again.stdout
