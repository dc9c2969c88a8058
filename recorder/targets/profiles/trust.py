"""What a cassette may make tito run: nothing by itself.

A cassette is data and may come from anyone (a pull request, a bug report). Its header names the target it was
recorded around (`--target`'s text: a driver's name, `module:attribute`, a profile file) and keeps the gateway
profile whole (`settings.profile`: its `start.command`, its `version` command, its `samples.function`). Run as
they stand, those would be a cassette that runs code when read, as pickle's documentation warns of its files.

So a replay (and `tito inspect`, `tito diff`, the pytest plugin: everything that replays) goes through the user's
target: one the user typed (`--target FILE`, `--target module:attribute`, `--tito-target`), a built-in driver
(`registry.BUILTIN`) or one an installed package registers (entry point group `tito.targets`), code the user
installed. What only the cassette names is refused in one line that says what it asks to run and how to allow it,
unless the user trusts the cassette (`--trust-cassette`): then its own copy runs. The header's profile otherwise
only checks the user's: the same (by digest) or a note naming the first key that differs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from tito_rl.recorder.targets.base import ENTRY_POINT_GROUP, TargetError
from tito_rl.recorder.targets.registry import BUILTIN, TITO, TargetSpec, parse_target

TRUST_FLAG = "--trust-cassette"
TRUST_HELP = (
    "run the target the cassette itself names, where you gave none: its gateway profile's copy (the command "
    "it starts, its version command, its samples function) or its driver's module:attribute (imported and "
    "called). Only for a cassette you trust: a cassette is data, and without this nothing it names runs"
)
_PROFILE_DRIVER = "tito_rl.recorder.targets.profiles.driver:"
BUILTIN_DIR = Path(__file__).resolve().parent  # the profiles tito ships (`driver.BUILTIN_DIR`)


class UntrustedTarget(TargetError):
    """The cassette names code to run that the user did not give: one line, what it is and how to allow it."""


@dataclass(frozen=True)
class ReplayTarget:
    """The target a replay goes through and what its driver runs."""

    spec: TargetSpec  # as reports and goldens name it (the recorded text where the user's profile is the same)
    profile: dict[str, Any] | None = None  # the profile the driver runs (`TargetOptions.extra["profile"]`)
    note: str | None = None  # the user's profile is not the one recorded: the first key that differs


def recorded_ref(target: Mapping[str, Any] | None) -> str:
    """The target a cassette was recorded around, as `--target` names it (`tito` for tito's adapter)."""
    target = target or {}
    return str(target.get("ref") or target.get("name") or TITO) if target.get("kind", TITO) != TITO else TITO


def kept_profile(target: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The profile the header keeps (recorded through one), else None."""
    settings = (target or {}).get("settings")
    profile = settings.get("profile") if isinstance(settings, Mapping) else None
    return profile if isinstance(profile, dict) else None


@cache
def _installed() -> frozenset[str]:
    """Names and `module:attribute` references of the drivers installed here: tito's own and the entry points'."""
    points = entry_points(group=ENTRY_POINT_GROUP)
    return frozenset({*BUILTIN, *BUILTIN.values(), *(p.name for p in points), *(p.value for p in points)})


def installed(name: str) -> bool:
    """Whether `name` is a driver installed here (code the user installed), not something a cassette brings."""
    return name in _installed()


def profile_digest(profile: Mapping[str, Any]) -> str:
    """A profile's SHA-256 over its canonical JSON: the same profile, however it was read (YAML, the header)."""
    return hashlib.sha256(_canonical(profile).encode()).hexdigest()


def first_difference(recorded: Mapping[str, Any], mine: Mapping[str, Any]) -> str | None:
    """The dotted key where two profiles first differ (`start.command`), None where their digests are equal."""
    if profile_digest(recorded) == profile_digest(mine):
        return None
    return _walk(json.loads(_canonical(recorded)), json.loads(_canonical(mine)), "")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _walk(a: Any, b: Any, where: str) -> str | None:
    if a == b:
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            here = f"{where}.{key}" if where else key
            found = _walk(a[key], b[key], here) if key in a and key in b else here
            if found:
                return found
    return where or "(the whole profile)"


def is_profile_path(text: str) -> bool:
    """Whether a target's text names a profile file (`format.is_profile_path`, without importing the format)."""
    return text.endswith((".yaml", ".yml", ".json")) or Path(text).is_file()


def _read_profile(path: str | Path) -> dict[str, Any]:
    """The profile in file `path` as plain data (what a header keeps); `ProfileError` (one line) otherwise."""
    from tito_rl.recorder.targets.profiles.format import load_profile, profile_to_dict

    return profile_to_dict(load_profile(path))


def _builtin_profile(name: str) -> dict[str, Any] | None:
    """A built-in profile target's profile (`--target agentlightning`), None for any other name."""
    if not BUILTIN.get(name, "").startswith(_PROFILE_DRIVER):
        return None
    from tito_rl.recorder.targets.profiles.format import ProfileError

    try:
        return _read_profile(BUILTIN_DIR / f"{name}.yaml")
    except ProfileError:
        return None  # the driver says what is wrong with it when it is made


def _note(kept: dict[str, Any] | None, mine: dict[str, Any] | None, what: str) -> str | None:
    key = first_difference(kept, mine) if kept is not None and mine is not None else None
    return None if key is None else f"{what} is not the profile the cassette was recorded with: {key} differs"


def resolve(target: Mapping[str, Any] | None, chosen: str | None, trust: bool = False) -> ReplayTarget:
    """The target to replay a cassette recorded around `target` (its header's) through: `chosen` (the user's
    `--target`) when given, else the recorded one where it is tito's adapter, a running gateway's address or an
    installed driver, else, with `trust`, what the cassette names. `UntrustedTarget` otherwise; `TargetError` for
    a profile file of the user's that cannot be read."""
    kept, ref = kept_profile(target), recorded_ref(target)
    if chosen and chosen.strip():
        spec = parse_target(chosen)
        if spec.kind != "driver":
            return ReplayTarget(spec)
        if installed(spec.text) or not is_profile_path(spec.text):
            return ReplayTarget(spec, note=_note(kept, _builtin_profile(spec.text), spec.text))
        from tito_rl.recorder.targets.profiles.format import ProfileError

        try:
            mine = _read_profile(spec.text)
        except ProfileError as exc:
            raise TargetError(f"target {exc}") from None
        note = _note(kept, mine, spec.text)
        if note is None and kept is not None and is_profile_path(ref) and not installed(ref):
            spec = parse_target(ref)  # the very profile recorded: the recorded target, wherever its file is now
        return ReplayTarget(spec, mine, note)
    spec = parse_target(ref)
    if spec.kind != "driver":
        return ReplayTarget(spec)
    if installed(ref):
        return ReplayTarget(spec, note=_note(kept, _builtin_profile(ref), ref))
    if trust:
        return ReplayTarget(spec, kept if is_profile_path(ref) else None)
    raise UntrustedTarget(refusal(ref, kept))


def refusal(ref: str, kept: Mapping[str, Any] | None) -> str:
    """One line: what the cassette asks to run, and how to allow it."""
    if is_profile_path(ref):
        asks = f"the cassette asks to run the gateway profile {ref!r}: " + "; ".join(profile_runs(kept))
        how = f"give your own profile file (--target {ref})"
    else:
        asks = f"the cassette asks to import and call {ref} (the driver it was recorded around)"
        how = f"name it yourself (--target {ref})"
    line = f"{asks}; a cassette runs nothing by itself: {how}, or {TRUST_FLAG} if you trust this cassette"
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)  # one line, whatever the header holds


def profile_runs(profile: Mapping[str, Any] | None) -> list[str]:
    """What a profile runs, each as the user would read it: its command, its version command, its function."""
    if profile is None:
        return ["its file (the header keeps no copy of it)"]
    runs = []
    start = profile.get("start")
    command = start.get("command") if isinstance(start, Mapping) else None
    if isinstance(command, list | tuple):
        runs.append(f"start.command {json.dumps(list(command))}")
    version = profile.get("version")
    if isinstance(version, list | tuple):
        runs.append(f"version {json.dumps(list(version))}")
    samples = profile.get("samples")
    function = samples.get("function") if isinstance(samples, Mapping) else None
    if function:
        runs.append(f"samples.function {function}")
    return runs or ["its commands"]
