"""Install a pinned agent CLI once: from npm into a project-local prefix, or from PyPI into a cached venv.

Each npm pin gets its own directory (`.tools/npm/<agent>-<version>`) so two versions never share a
node_modules, and a finished install is never touched again. npm runs in a staging directory that is
renamed into place only after the binary is there, so an interrupted or concurrent install can not leave a
half-installed CLI behind.

A PyPI pin (a Python CLI, e.g. mini-swe-agent) gets a virtual environment of its own outside the checkout,
`~/.cache/tito/<agent>-<version>-venv` (under `$XDG_CACHE_HOME` where set), made with the Python running tito:
it is never a dependency of tito. A venv can not be moved once made, so it is made in place and counts as
installed only once its stamp (the exact pins) is written; a half-made one is made again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tito_rl.recorder.agents.pins import PINS, AgentPin
from tito_rl.recorder.one_time_build import announced

# The checkout's .tools/npm; TITO_NPM_PREFIX moves it (e.g. for a non-editable install or a shared cache).
DEFAULT_PREFIX = Path(os.environ.get("TITO_NPM_PREFIX") or Path(__file__).resolve().parents[2] / ".tools" / "npm")
INSTALL_TIMEOUT_S = 900.0


class AgentInstallError(RuntimeError):
    pass


def npm_path(npm: str = "npm") -> str | None:
    return shutil.which(npm)


def venv_root() -> Path:
    """Where PyPI pins get their environments: the cache folder the gateways' environments share."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tito"


def install_dir(pin: AgentPin, prefix: Path = DEFAULT_PREFIX) -> Path:
    """An npm pin's folder under `prefix`; a PyPI pin's environment (`prefix` does not apply)."""
    if pin.registry == "pypi":
        return venv_root() / f"{pin.name}-{pin.version}-venv"
    return Path(prefix) / f"{pin.name}-{pin.version}"


def binary_path(pin: AgentPin, prefix: Path = DEFAULT_PREFIX) -> Path:
    if pin.registry == "pypi":
        return install_dir(pin) / "bin" / pin.binary
    return install_dir(pin, prefix) / "node_modules" / ".bin" / pin.binary


def pip_install_command(pin: AgentPin, venv: str) -> list[str]:
    """The pip command line into the environment `venv`: the CLI and the libraries pinned with it."""
    return [f"{venv}/bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check", pin.spec, *pin.with_pins]


def _stamp(pin: AgentPin) -> Path:
    return install_dir(pin) / ".tito-installed"


def _stamp_text(pin: AgentPin) -> str:
    return " ".join((pin.spec, *pin.with_pins)) + "\n"


def install_command(pin: AgentPin, target: str, npm: str = "npm") -> list[str]:
    """The npm command line; also run inside remote sandboxes, hence a plain argv."""
    return [
        npm,
        "install",
        "--prefix",
        target,
        "--save-exact",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        pin.spec,
    ]


def installed_version(pin: AgentPin, prefix: Path = DEFAULT_PREFIX) -> str | None:
    manifest = install_dir(pin, prefix) / "node_modules" / pin.package / "package.json"
    try:
        version = json.loads(manifest.read_text())["version"]
        return version if isinstance(version, str) else None
    except (OSError, ValueError, KeyError):
        return None


def is_installed(pin: AgentPin, prefix: Path = DEFAULT_PREFIX) -> bool:
    if pin.registry == "pypi":
        try:
            return binary_path(pin).exists() and _stamp(pin).read_text() == _stamp_text(pin)
        except OSError:
            return False
    return binary_path(pin, prefix).exists() and installed_version(pin, prefix) == pin.version


def ensure_installed(pin: AgentPin, prefix: Path = DEFAULT_PREFIX, npm: str = "npm") -> Path:
    """Return the CLI's binary, installing the pinned version first if it is not there yet."""
    if pin.registry == "pypi":
        return _ensure_venv(pin)
    prefix = Path(prefix)
    if is_installed(pin, prefix):
        return binary_path(pin, prefix)
    npm_bin = npm_path(npm)
    if npm_bin is None:
        raise AgentInstallError(f"npm not found on PATH; it is needed to install {pin.spec}")
    prefix.mkdir(parents=True, exist_ok=True)
    _ignore_in_git(prefix)
    final = install_dir(pin, prefix)
    with announced(pin.spec, final):
        _npm_install(pin, prefix, final, npm_bin)
    return binary_path(pin, prefix)


def _npm_install(pin: AgentPin, prefix: Path, final: Path, npm_bin: str) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{final.name}-", dir=prefix))
    try:
        _run_npm(install_command(pin, str(staging), npm_bin), pin)
        staged_binary = staging / "node_modules" / ".bin" / pin.binary
        if not staged_binary.exists():
            raise AgentInstallError(f"npm installed {pin.spec} but {staged_binary} is missing")
        os.chmod(staging, 0o755)  # mkdtemp makes it private; the CLI may run as another user
        try:
            os.rename(staging, final)
        except OSError:
            if not is_installed(pin, prefix):  # not a concurrent install that won the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not is_installed(pin, prefix):
        raise AgentInstallError(f"{pin.spec} did not install to {final}")


def _ensure_venv(pin: AgentPin) -> Path:
    if is_installed(pin):
        return binary_path(pin)
    folder = install_dir(pin)
    with announced(pin.spec, folder):
        _make_venv(pin, folder)
    return binary_path(pin)


def _make_venv(pin: AgentPin, folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)  # a half-made one: pip may have stopped anywhere
    folder.parent.mkdir(parents=True, exist_ok=True)
    for step in ([sys.executable, "-m", "venv", str(folder)], pip_install_command(pin, str(folder))):
        try:
            done = subprocess.run(
                step, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
            )
        except subprocess.TimeoutExpired as exc:
            raise AgentInstallError(f"installing {pin.spec} took longer than {INSTALL_TIMEOUT_S:.0f} s") from exc
        if done.returncode != 0:
            lines = [x for x in (done.stderr or done.stdout).splitlines() if x.strip() and not x.startswith("WARNING")]
            why = lines[-1] if lines else f"exit code {done.returncode}"
            raise AgentInstallError(f"installing {pin.spec} into {folder}: {' '.join(step[:4])} failed: {why}")
    if not binary_path(pin).exists():
        raise AgentInstallError(f"pip installed {pin.spec} but {binary_path(pin)} is missing")
    _stamp(pin).write_text(_stamp_text(pin))


def _run_npm(argv: list[str], pin: AgentPin) -> None:
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AgentInstallError(f"npm install {pin.spec} took longer than {INSTALL_TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        raise AgentInstallError(
            f"npm install {pin.spec} failed with exit code {done.returncode}:\n{done.stderr[-2000:]}"
        )


def _ignore_in_git(prefix: Path) -> None:
    """Installed CLIs are hundreds of MB: keep the prefix out of git without touching the root .gitignore."""
    marker = prefix / ".gitignore"
    if not marker.exists():
        marker.write_text("*\n")


def main() -> int:
    """Every pinned CLI installed where it is missing (`make test` runs this before the suite, whose real-CLI
    tests would otherwise install them on first use, their lines hidden by pytest's capture). One that cannot be
    installed (no npm) is said in one line: its tests skip or fail saying so."""
    from concurrent.futures import ThreadPoolExecutor

    def one(pin: AgentPin) -> None:
        try:
            ensure_installed(pin)
        except (OSError, AgentInstallError) as exc:
            print(f"tito: {pin.spec} not installed: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=len(PINS)) as pool:  # npm's and pip's downloads overlap
        list(pool.map(one, PINS.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
