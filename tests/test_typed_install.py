"""tito typed for its users (PEP 561): a user's project outside the checkout, which uses the pytest plugin's fixtures
and writes a target driver, type-checked with mypy against tito installed as a user installs it. Once editable, made
the way `make install` makes it (the Makefile's EDITABLE_MODE), and once from the wheel.

mypy must read tito's own types there: the project's two deliberate type errors, which only tito's annotations can
reveal, are reported, and nothing else. Where tito is not visible to a static tool (setuptools' default editable
mode: an import hook, `import-not-found`) or not marked typed (no `py.typed`: `import-untyped`), those two vanish
behind Any and the import errors replace them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.test_install import ROOT, run, source_copy, tito_wheel

# A pytest module of the user's: tito's fixtures (tito_rl.replayer.pytest_plugin.plugin) hand out callables that
# return fixtures.py's records; the user's annotations meet tito's.
USER_TEST = """\
from collections.abc import Callable
from typing import Any

from tito_rl.replayer.pytest_plugin.fixtures import AdapterHandle, ThreadedServer, start_fake_engine


def test_a_session_finishes(
    tito_fake_engine: Callable[..., str], tito_adapter: Callable[..., AdapterHandle]
) -> None:
    handle = tito_adapter(tito_fake_engine({"turns": [{"text": "hello"}]}))
    samples: list[dict[str, Any]] = handle.finish("session-1", 1.0)
    assert samples
    port: int = handle.url  # ERROR assignment: a URL is a str


def test_a_server_of_ones_own() -> None:
    server: ThreadedServer = start_fake_engine({"turns": [{"text": "hello"}]})
    server.stop()
"""

# A gateway team's driver (recorder/targets/base.py's TargetDriver protocol), and one that forgot `stop`.
USER_DRIVER = """\
from tito_rl.recorder.targets.base import TargetDriver, TargetFinish, TargetInfo, TargetOptions


class EchoGateway:
    info = TargetInfo(name="echo", volatile=("id",))

    def __init__(self, options: TargetOptions) -> None:
        self.tool_parser = options.tool_parser

    async def start(self, engine_url: str) -> str:
        return engine_url

    async def finish(self, session: str, reward: float) -> TargetFinish:
        return TargetFinish(samples=[], stats={"turns": 0})

    async def drop(self, session: str) -> bool:
        return False

    async def stop(self) -> None:
        return None


class Unstoppable:
    info = TargetInfo(name="unstoppable")

    async def start(self, engine_url: str) -> str:
        return engine_url

    async def finish(self, session: str, reward: float) -> None:
        return None

    async def drop(self, session: str) -> None:
        return None


def create(options: TargetOptions) -> TargetDriver:
    return EchoGateway(options)


def create_unstoppable(options: TargetOptions) -> TargetDriver:
    return Unstoppable()  # ERROR return-value: no stop()
"""

USER_FILES = {"test_uses_tito.py": USER_TEST, "echo_driver.py": USER_DRIVER}
# The venv's Python tells mypy where packages are: with the checkout on PYTHONPATH, tito would be found there.
AWAY_FROM_THE_CHECKOUT = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MYPYPATH")}
ERROR = re.compile(r"^(?P<file>[\w.]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")


def editable_mode() -> str:
    """The mode `make install` installs tito in (a pip install -e without one is setuptools' default: the hook)."""
    makefile = (ROOT / "Makefile").read_text()
    install = next(line for line in makefile.splitlines() if "pip install -q -e '.[dev]'" in line)
    if "editable_mode=$(EDITABLE_MODE)" not in install:
        return "lenient"  # setuptools' default
    (mode,) = re.findall(r"^EDITABLE_MODE := (\w+)$", makefile, re.MULTILINE)
    return mode


def bare_venv(where: Path) -> Path:
    """A venv without tito whose dependencies (aiohttp, pytest, ...) come from this one's site-packages, through a
    `.pth` line read after the venv's own site-packages (tests/test_install.py does the same)."""
    run([sys.executable, "-m", "venv", "--without-pip", str(where)])
    python = where / "bin" / "python"
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "zz-tito-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def pip_install(python: Path, *args: str) -> None:
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index", *args])


def expected_errors() -> set[tuple[str, int, str]]:
    found = set()
    for name, text in USER_FILES.items():
        for number, line in enumerate(text.splitlines(), 1):
            if "# ERROR " in line:
                found.add((name, number, line.split("# ERROR ")[1].split(":")[0]))
    return found


def mypy_errors(python: Path, tmp_path: Path) -> tuple[set[tuple[str, int, str]], str]:
    """mypy --strict over the user's project, in a folder of its own, with `python`'s installed packages."""
    project = tmp_path / "user-project"
    project.mkdir(exist_ok=True)
    for name, text in USER_FILES.items():
        (project / name).write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--python-executable", str(python), "--cache-dir",
         str(tmp_path / "mypy-cache"), "--no-error-summary", "--show-error-codes", *USER_FILES],
        cwd=project, capture_output=True, text=True, timeout=600, env=AWAY_FROM_THE_CHECKOUT,
    )  # fmt: skip
    errors = {(m["file"], int(m["line"]), m["code"]) for m in map(ERROR.match, done.stdout.splitlines()) if m}
    return errors, done.stdout + done.stderr


def test_the_users_project_is_the_one_that_makes_the_errors() -> None:
    """The two errors the installs below must reveal are where the project says (a guard for the test itself)."""
    assert expected_errors() == {("test_uses_tito.py", 13, "assignment"), ("echo_driver.py", 41, "return-value")}


@pytest.mark.slow
def test_a_users_project_type_checks_against_tito_installed_editable_as_make_install_does(tmp_path: Path) -> None:
    python = bare_venv(tmp_path / "venv")
    pip_install(python, "--no-build-isolation", "-e", str(source_copy(tmp_path)), "--config-settings",
                f"editable_mode={editable_mode()}")  # fmt: skip
    errors, output = mypy_errors(python, tmp_path)
    assert errors == expected_errors(), output


@pytest.mark.slow
def test_a_users_project_type_checks_against_tito_installed_from_its_wheel(tmp_path: Path) -> None:
    python = bare_venv(tmp_path / "venv")
    pip_install(python, str(tito_wheel(tmp_path)))
    errors, output = mypy_errors(python, tmp_path)
    assert errors == expected_errors(), output
