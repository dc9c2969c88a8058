"""Gateways that run in a Python of their own, and the cached virtual environments tito's tests make for them.

verifiers (`verifiers` 0.4.0, Python >= 3.11), Agent Lightning (`agentlightning` 1.0.2, Python >= 3.12) and NeMo
Gym (`nemo-gym` 0.7.0, Python >= 3.13; installed with `--ignore-requires-python`, as it asks 3.13.14) are never
dependencies of tito: a driver runs them with the Python its environment variable names (`TITO_VERIFIERS_PYTHON`,
`TITO_AGENTLIGHTNING_PYTHON`, `TITO_NEMOGYM_PYTHON`, `TITO_MILES_PYTHON`), else the one in the cached environment this
module makes (`~/.cache/tito/<name>-venv`, or under `$XDG_CACHE_HOME`). `make test` runs

    python -m tito_rl.recorder.targets.own_python.envs verifiers agentlightning nemogym miles

which creates what is missing (a stat where its stamp says what pip was told) with a Python new enough; an
environment is made under a file lock beside it (`<name>-venv.lock`), so two `make test`s at once do not delete each
other's half-made environment: the second waits, then finds it stamped.
`TITO_GATEWAY_BASE_PYTHON`, else `python3.12`/`python3.13`/`python3.14` on the PATH that runs, else a pyenv-installed
one. Where none is found it says so in one line and exits 0: the tests of that gateway then skip, saying why.

miles' session server (not on PyPI: its code comes from a checkout, `TITO_MILES_PATH`) imports torch
(`miles/utils/types.py`), ray (`miles/utils/misc.py`) and sglang's OpenAI protocol with `encoding_dsv4`
(`miles/utils/chat_template_utils/deepseek.py`), which sglang 0.5.16 has and 0.5.23 has not. torch from PyPI is a
CUDA build of several GB; the real SGLang tito builds for its engine tests (`make real-sglang`,
`recorder/real_engine/sglang_paths.py`) already has it, with fastapi, uvicorn and the rest. So miles' environment is
a layer over that one (`over_real_sglang`): a venv of the same Python whose `.pth` puts the real SGLang's
site-packages after its own, holding sglang 0.5.16 (`--no-deps`: its protocol module only is imported), ray and
miles' pinned transformers (about 500 MB). Where the real SGLang is not built it says so and is not made.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import io
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tito_rl.recorder.one_time_build import announced
from tito_rl.recorder.targets.base import TargetError, TargetUnavailable


@dataclass(frozen=True)
class GatewayEnv:
    name: str  # the target's name
    spec: str  # what pip installs
    python_env: str  # the environment variable naming a Python that has it
    min_python: tuple[int, int]
    module: str  # imported to check the environment
    # what else pip is told: NeMo Gym 0.7.0 asks Python >= 3.13.14 (`--ignore-requires-python` installs it on an
    # older 3.13, which runs its model server here), and its own environment has `uv` beside it
    pip_args: tuple[str, ...] = ()
    no_deps: tuple[str, ...] = ()  # installed first, without their dependencies
    over_real_sglang: bool = False  # a layer over the real SGLang's venv (its Python, its site-packages after ours)

    @property
    def folder(self) -> Path:
        return cache_root() / f"{self.name}-venv"

    @property
    def python(self) -> Path:
        return self.folder / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.folder / ".tito-installed"

    @property
    def lock(self) -> Path:
        """Held while the environment is made: beside the folder, which is deleted and made again."""
        return self.folder.with_name(f"{self.folder.name}.lock")

    def stamped(self) -> bool:
        return self.stamp.is_file() and self.stamp.read_text(encoding="utf-8") == self.stamp_text

    @property
    def stamp_text(self) -> str:
        """What the stamp says: what pip was told (an environment made by hand the same way may be stamped so)."""
        layer = ("--no-deps", *self.no_deps) if self.no_deps else ()
        over = ("over", str(real_sglang_site())) if self.over_real_sglang else ()
        return " ".join((self.spec, *self.pip_args, *layer, *over)) + "\n"


ENVS = {
    "verifiers": GatewayEnv("verifiers", "verifiers==0.4.0", "TITO_VERIFIERS_PYTHON", (3, 11), "verifiers.v1"),
    "agentlightning": GatewayEnv(
        "agentlightning", "agentlightning==1.0.2", "TITO_AGENTLIGHTNING_PYTHON", (3, 12), "agentlightning.server.app"
    ),
    "nemogym": GatewayEnv(
        "nemogym",
        "nemo-gym==0.7.0",
        "TITO_NEMOGYM_PYTHON",
        (3, 13),
        "nemo_gym.token_id_capture.consumer",
        ("--ignore-requires-python", "uv"),
    ),
    # miles' requirements.txt pins transformers 5.12.1 (its tokenizers pin with it); ray as tito's `[ray]` extra
    "miles": GatewayEnv(
        "miles",
        "ray==2.60.0",
        "TITO_MILES_PYTHON",
        (3, 11),
        "torch, ray, transformers, sglang.srt.entrypoints.openai.encoding_dsv4",
        ("transformers==5.12.1",),
        no_deps=("sglang==0.5.16",),
        over_real_sglang=True,
    ),
}
BASE_ENV = "TITO_GATEWAY_BASE_PYTHON"
SITE = "import sysconfig; print(sysconfig.get_paths()['purelib'])"


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tito"


def real_sglang_python() -> Path | None:
    """The real SGLang's Python (`make real-sglang`), or None where it is not built."""
    from tito_rl.recorder.real_engine.sglang_paths import read_ready

    ready = read_ready()
    return Path(ready.python) if ready is not None else None


def real_sglang_site() -> Path:
    """The site-packages of the real SGLang's venv (where it would be: the stamp names it)."""
    from tito_rl.recorder.real_engine.sglang_paths import PYTHON_VERSION, real_sglang_home, venv_dir

    minor = ".".join(map(str, PYTHON_VERSION))
    return venv_dir(real_sglang_home()) / "lib" / f"python{minor}" / "site-packages"


def how_to_make(env: GatewayEnv) -> str:
    """What a user does to get `env`'s Python, in a clause."""
    made = f"run `python -m tito_rl.recorder.targets.own_python.envs {env.name}`"
    if env.over_real_sglang:
        made = f"build the real SGLang (`make real-sglang`, about 7 GB) and {made}"
    return made


def gateway_python(name: str) -> str:
    """The Python that runs gateway `name`: its environment variable, else the cached environment; otherwise
    `TargetUnavailable` saying how to get one (`TargetError` for a variable naming no executable)."""
    env = ENVS[name]
    configured = os.environ.get(env.python_env, "").strip()
    if configured:
        if not os.access(configured, os.X_OK):
            raise TargetError(f"target {name!r}: {env.python_env}={configured} is not an executable")
        return configured
    base_gone = env.over_real_sglang and real_sglang_python() is None  # the layer lies over nothing
    if env.stamp.is_file() and os.access(env.python, os.X_OK) and not base_gone:
        return str(env.python)
    raise TargetUnavailable(
        f"target {name!r}: no Python with {env.spec}: set {env.python_env} to one (Python >= "
        f"{'.'.join(map(str, env.min_python))}), or {how_to_make(env)}"
    )


def _version(python: str) -> tuple[int, int] | None:
    try:
        run = subprocess.run(
            [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = run.stdout.split() if run.returncode == 0 else []
    return (int(parts[0]), int(parts[1])) if len(parts) == 2 else None


def base_python(minimum: tuple[int, int]) -> str | None:
    """A Python at least `minimum` to make an environment with, or None."""
    candidates = [os.environ.get(BASE_ENV, "").strip(), sys.executable]
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in (12, 13, 14)]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates += sorted(glob.glob(str(pyenv / "3.1[2-4]*" / "bin" / "python3")))
    for python in filter(None, candidates):
        found = _version(python)
        if found is not None and found >= minimum:
            return python
    return None


def ensure(name: str, quiet: bool = False) -> str | None:
    """Make gateway `name`'s cached environment where it is missing; its Python, or None (said in one line)."""
    env = ENVS[name]
    if os.environ.get(env.python_env, "").strip() or env.stamped():
        return gateway_python(name)
    env.lock.parent.mkdir(parents=True, exist_ok=True)
    with env.lock.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed; a process that dies releases it too
        if env.stamped():  # made by another process while this one waited
            return gateway_python(name)
        return _make_locked(env, quiet)


def _make_locked(env: GatewayEnv, quiet: bool) -> str | None:
    if env.over_real_sglang:
        real = real_sglang_python()
        if real is None:
            print(
                f"gateway_envs: {env.name}: the real SGLang is not built (`make real-sglang`); its tests will skip",
                file=sys.stderr,
            )
            return None
        base: str | None = str(real)
    else:
        base = base_python(env.min_python)
    if base is None:
        print(
            f"gateway_envs: no Python >= {'.'.join(map(str, env.min_python))} found for {env.spec} (set {BASE_ENV}); "
            f"its tests will skip",
            file=sys.stderr,
        )
        return None
    what = " ".join((*env.no_deps, env.spec, *env.pip_args)) if env.no_deps else env.spec
    with announced(what, env.folder, "gateway_envs", stream=io.StringIO() if quiet else None) as build:
        build.ok = _make(env, base)
    return str(env.python) if build.ok else None


def _steps(env: GatewayEnv, base: str) -> list[list[str]]:
    pip = [str(env.python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps = [[base, "-m", "venv", str(env.folder)]]
    if env.no_deps:
        steps.append([*pip, "--no-deps", *env.no_deps])
    return [*steps, [*pip, env.spec, *env.pip_args], [str(env.python), "-c", f"import {env.module}"]]


def _make(env: GatewayEnv, base: str) -> bool:
    """A fresh environment at `env.folder`, stamped once its module imports; False where a step failed (said). Only
    under `env.lock`: it deletes what is there."""
    shutil.rmtree(env.folder, ignore_errors=True)
    env.folder.parent.mkdir(parents=True, exist_ok=True)
    for i, step in enumerate(_steps(env, base)):
        if i == 1 and env.over_real_sglang:  # before pip runs: it then takes what the real SGLang has as installed
            site = Path(subprocess.run([str(env.python), "-c", SITE], capture_output=True, text=True).stdout.strip())
            (site / "tito-real-sglang.pth").write_text(f"{real_sglang_site()}\n")
        run = subprocess.run(step, capture_output=True, text=True)
        if run.returncode != 0:
            lines = [x for x in (run.stderr or run.stdout).splitlines() if x.strip() and not x.startswith("WARNING")]
            print(
                f"gateway_envs: {env.spec}: {' '.join(step[:3])} failed: {lines[-1] if lines else run.returncode}",
                file=sys.stderr,
            )
            return False
    env.stamp.write_text(env.stamp_text)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.recorder.targets.own_python.envs",
        description="Make the cached environments of gateways that run in a Python "
        "of their own (a stat where they exist).",
    )
    parser.add_argument("names", nargs="*", help=f"which: {', '.join(ENVS)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in ENVS]
    if unknown:
        parser.error(f"unknown gateway {', '.join(unknown)}: give {', '.join(ENVS)}")
    names = args.names or list(ENVS)

    def one(name: str) -> str | None:
        try:
            return ensure(name)
        except TargetError as exc:  # a TITO_*_PYTHON that names no executable: said, and its tests say so too
            print(f"gateway_envs: {exc}", file=sys.stderr)
            return None

    with ThreadPoolExecutor(max_workers=len(names)) as pool:  # pip's downloads and installs overlap
        found = list(pool.map(one, names))
    for name, python in zip(names, found, strict=True):
        if python is not None:
            print(f"{name}: {python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
