"""Finding and importing slime from the user's environment, for the `slime` target.

slime is not on PyPI: the target imports it from a checkout, the folder in `TITO_SLIME_PATH` (the checkout's
root, holding `slime/agent/`) or one already importable (on `PYTHONPATH`, or installed with `pip install -e`).
Two imports need help here. slime's parsers import `sglang.srt...`, which tito loads without sglang's serving
runtime (`tito_rl.trajectory.adapters.parsing.sglang_loader`); and slime's `TrajectoryManager` imports `Sample` from
`slime.utils.types`, which imports torch: where torch is absent, `slime_sample.Sample` stands in (one line on
stderr says so).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tito_rl.recorder.targets.base import TargetError, TargetUnavailable

PATH_ENV = "TITO_SLIME_PATH"
MINIMUM_COMMIT = "624b824a"  # slime main with slime/agent/adapters (Anthropic and OpenAI) and aiohttp_threaded
TYPES_MODULE = "slime.utils.types"
HOW = (
    f"set {PATH_ENV} to a slime checkout (git clone https://github.com/THUDM/slime, main at {MINIMUM_COMMIT} "
    "or later) or put one on PYTHONPATH"
)


@dataclass(frozen=True)
class Slime:
    """What the target uses of slime, imported."""

    root: Path  # the checkout's root (holds slime/)
    commit: str | None  # the checkout's git commit, where it can be read
    AnthropicAdapter: type
    OpenAIAdapter: type
    Sample: type  # slime's own, or the stand-in
    sample_stand_in: bool
    run_app_in_thread: Any  # slime.agent.aiohttp_threaded.run_app_in_thread
    health: Any  # the adapters' /healthz and /v1/models handler
    trajectory: types.ModuleType  # slime.agent.trajectory (its drift classes are observed for finish stats)


def locate() -> Path:
    """The root of the slime checkout the environment points at; `TargetError` saying how to point otherwise."""
    configured = os.environ.get(PATH_ENV, "").strip()
    if configured:
        root = Path(configured).expanduser().resolve()
        where = f"{PATH_ENV}={configured}"
    else:
        try:
            spec = importlib.util.find_spec("slime")
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise TargetUnavailable(f"slime is not importable: {HOW}")
        root = Path(next(iter(spec.submodule_search_locations))).resolve().parent
        where = f"slime on the path ({root})"
    if not (root / "slime" / "agent" / "adapters" / "anthropic.py").is_file():
        raise TargetError(
            f"{where} is not a slime checkout with slime/agent/adapters (slime main at "
            f"{MINIMUM_COMMIT} or later): {HOW}"
        )
    return root


def git_commit(root: Path) -> str | None:
    """The commit checked out in `root` (a clone or a worktree), read from its .git without running git."""
    git = root / ".git"
    if git.is_file():  # a worktree or submodule: "gitdir: <path>"
        text = git.read_text(encoding="utf-8", errors="replace").strip()
        if not text.startswith("gitdir:"):
            return None
        git = (root / text.split(":", 1)[1].strip()).resolve()
    if not (git / "HEAD").is_file():
        return None
    head = (git / "HEAD").read_text(encoding="utf-8", errors="replace").strip()
    if not head.startswith("ref:"):
        return head or None
    ref = head.split(":", 1)[1].strip()
    common = git
    if (git / "commondir").is_file():
        common = (git / (git / "commondir").read_text(encoding="utf-8").strip()).resolve()
    for folder in (git, common):
        loose = folder / ref
        if loose.is_file():
            return loose.read_text(encoding="utf-8", errors="replace").strip() or None
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(encoding="utf-8", errors="replace").splitlines():
            sha, _, name = line.partition(" ")
            if name.strip() == ref:
                return sha
    return None


def _version(root: Path) -> str | None:
    commit = git_commit(root)
    if commit:
        return commit
    try:
        return importlib.metadata.version("slime")
    except importlib.metadata.PackageNotFoundError:
        return None


def _stand_in_sample() -> None:
    """Register `slime.utils.types` as a module holding only the stand-in `Sample` (torch is absent)."""
    from tito_rl.recorder.targets import slime_sample

    utils = importlib.import_module("slime.utils")
    module = types.ModuleType(TYPES_MODULE, "tito's stand-in for slime.utils.types: only Sample (torch is absent)")
    module.Sample = slime_sample.Sample  # type: ignore[attr-defined]  # a module made here, its one name set
    sys.modules[TYPES_MODULE] = module
    utils.types = module  # type: ignore[attr-defined]
    print(
        "tito: torch is not installed, so the slime target stands in slime.utils.types.Sample with a "
        "field-for-field copy (recorder/targets/slime_sample.py)",
        file=sys.stderr,
    )


@cache
def import_slime() -> Slime:
    """Import slime's adapters once per process; `TargetError` (one line) when they cannot be."""
    root = locate()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    loaded = sys.modules.get("slime")
    if loaded is not None and loaded.__file__ is not None and Path(loaded.__file__).resolve().parent.parent != root:
        raise TargetError(f"slime is already imported from {Path(loaded.__file__).parent}, not from {root}")
    from tito_rl.trajectory.adapters.parsing.sglang_loader import SglangInstallError, parsers

    try:
        parsers()  # slime's parsing imports sglang.srt...: loaded without sglang's runtime
    except SglangInstallError as exc:
        raise TargetError(f"slime target: {exc}") from None
    stand_in = False
    if TYPES_MODULE not in sys.modules and importlib.util.find_spec("torch") is None:
        _stand_in_sample()
        stand_in = True
    elif isinstance(sys.modules.get(TYPES_MODULE), types.ModuleType):
        from tito_rl.recorder.targets import slime_sample

        stand_in = getattr(sys.modules[TYPES_MODULE].Sample, "__module__", "") == slime_sample.__name__
    try:
        adapters = importlib.import_module("slime.agent.adapters")
        common = importlib.import_module("slime.agent.adapters.common")
        threaded = importlib.import_module("slime.agent.aiohttp_threaded")
        trajectory = importlib.import_module("slime.agent.trajectory")
        sample = importlib.import_module(TYPES_MODULE).Sample
    except Exception as exc:  # noqa: BLE001 - any import failure in the user's slime is one line
        raise TargetError(f"cannot import slime's adapters from {root}: {type(exc).__name__}: {exc}") from None
    return Slime(
        root=root,
        commit=_version(root),
        AnthropicAdapter=adapters.AnthropicAdapter,
        OpenAIAdapter=adapters.OpenAIAdapter,
        Sample=sample,
        sample_stand_in=stand_in,
        run_app_in_thread=threaded.run_app_in_thread,
        health=common._health,
        trajectory=trajectory,
    )
