"""Finding a target by what the user typed: `tito`, `http://HOST:PORT`, a driver's name, `module:attribute`, or a
gateway profile file (`FILE.yaml`)."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any, cast

from tito_rl.recorder.targets.base import ENTRY_POINT_GROUP, TargetDriver, TargetError, TargetOptions, TargetUnavailable

TITO = "tito"
# Built in, and also registered under the entry-point group by tito's own pyproject.toml.
BUILTIN = {
    "tito": "tito_rl.recorder.targets.tito:create",
    "slime": "tito_rl.recorder.targets.slime:create",
    "rllm": "tito_rl.recorder.targets.rllm:create",
    "miles": "tito_rl.recorder.targets.miles:create",
    "verifiers": "tito_rl.recorder.targets.own_python.verifiers:create",
    "agentlightning": "tito_rl.recorder.targets.profiles.driver:agentlightning",
}


@dataclass(frozen=True)
class TargetSpec:
    """A parsed `--target` value: `kind` is "tito", "http" or "driver"."""

    text: str
    kind: str

    @property
    def url(self) -> str:
        return self.text.rstrip("/")


def parse_target(text: str | None) -> TargetSpec:
    value = (text or TITO).strip()
    if value == TITO:
        return TargetSpec(TITO, TITO)
    if value.startswith(("http://", "https://")):
        return TargetSpec(value, "http")
    if not value:
        raise TargetError("--target is empty: give tito, http://HOST:PORT, a driver's name or module:attribute")
    return TargetSpec(value, "driver")


def same_target(replayed: str, recorded: str) -> bool:
    """Whether a replay goes through the target a cassette was recorded around: the same `--target`, or any
    `http://` address for an `http://` recording (an address is not an identity: the team starts its gateway
    again, on another port, and replays through it; goldens apply and replies compare byte for byte)."""
    web = ("http://", "https://")
    return replayed == recorded or (replayed.startswith(web) and recorded.startswith(web))


def available() -> list[str]:
    """Driver names this environment knows: the built-in ones and the entry points of `tito.targets`."""
    names = set(BUILTIN)
    names.update(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
    return sorted(names)


def load_factory(name: str) -> Any:
    """The factory a driver name or `module:attribute` stands for; `TargetError` (one line) otherwise."""
    from tito_rl.recorder.targets.profiles.format import is_profile_path

    reference = name
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name] if ":" not in name else []
    if found:
        reference = found[0].value
    elif ":" not in name and name in BUILTIN:
        reference = BUILTIN[name]
    elif is_profile_path(name):  # a gateway profile file (recorder/targets/profiles/format.py); a name wins
        from tito_rl.recorder.targets.profiles.driver import from_file

        return lambda options: from_file(name, options)
    elif ":" not in name:
        raise TargetError(
            f"unknown target {name!r}: give tito, http://HOST:PORT, module:attribute, or one of "
            f"{', '.join(available())} (entry-point group {ENTRY_POINT_GROUP})"
        )
    module_name, _, attribute = reference.partition(":")
    if os.getcwd() not in sys.path:  # `module:attribute` of the user's own folder, as uvicorn and gunicorn take it
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetUnavailable(f"target {name!r}: cannot import {module_name}: {exc}") from None
    factory: Any = module
    for part in attribute.split(".") if attribute else []:
        factory = getattr(factory, part, None)
        if factory is None:
            raise TargetError(f"target {name!r}: {module_name} has no attribute {attribute!r}")
    if not callable(factory):
        raise TargetError(f"target {name!r}: {reference} is not callable (a factory taking TargetOptions)")
    return factory


def create_driver(name: str, options: TargetOptions) -> TargetDriver:
    """A driver instance for `name`; its gateway is not started yet."""
    factory = load_factory(name)
    try:
        driver = factory(options)
    except TargetError:
        raise
    except ImportError as exc:  # the gateway's own code is not installed here
        raise TargetUnavailable(f"target {name!r}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a driver that cannot start says why, in one line
        raise TargetError(f"target {name!r}: {type(exc).__name__}: {exc}") from None
    missing = [m for m in ("info", "start", "finish", "drop", "stop") if not hasattr(driver, m)]
    if missing:
        raise TargetError(f"target {name!r}: the driver lacks {', '.join(missing)} (see recorder/targets/base.py)")
    return cast(TargetDriver, driver)
