"""The pytest plugin's settings: each is a `--tito-...` option, a `tito_...` ini key (pytest.ini, or
`[tool.pytest.ini_options]` in pyproject.toml) and, for those tito's fixtures use, a key of the `tito_config`
fixture (as pytest-recording's `vcr_config`). The first of these that is set wins: the command line, then
`tito_config` (fixtures only), then the ini key, then the default. `--update-goldens` keeps the name users
know and has no ini key: updating is an act, not a setting. One more setting is one more line in SETTINGS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pytest

from tito_rl.recorder.targets.profiles.trust import TRUST_HELP
from tito_rl.replayer.replay import whatif
from tito_rl.replayer.replay.whatif import Option

PREFIX = "tito-"
RECORD_MODES = ("none", "once", "new_episodes", "all", "rewrite")  # pytest-recording's, rewrite included

SETTINGS: tuple[Option, ...] = (
    Option(
        "cassette_dir",
        "cassettes collected as tests, one item per session (default cassettes)",
        metavar="DIR",
        default="cassettes",
    ),
    Option(
        "record_mode",
        "the tito_vcr fixture's vcrpy record mode (default none: replay only; pytest-recording's "
        "--record-mode when given)",
        choices=RECORD_MODES,
        default="none",
    ),
    Option(
        "allow_unused_goldens",
        "an unused golden (no cassette, or a section for a session the cassette no "
        "longer has) is a warning, not a failure",
        switch=True,
        default=False,
    ),
    Option(
        "target",
        "replay through this target: tito, a driver's name, module:attribute, your gateway profile file "
        "(FILE.yaml) or http://HOST:PORT (default: each cassette's own where it is tito or a driver installed "
        "here; goldens are checked only through it)",
        metavar="TARGET",
        default="",
    ),
    Option("trust_cassette", TRUST_HELP, switch=True, default=False),
    Option(
        "engine_listen",
        "HOST:PORT where replay serves a foreign target's engine leg (an http:// gateway's engine URL)",
        metavar="HOST:PORT",
        default="",
    ),
    Option(
        "audit",
        "also audit each session's recording (tito audit) and fail it when one of these rules fired "
        "for it and is not allowed beside its cassette: comma-separated rule ids and coverage>=X (e.g. "
        '"coverage>=1.0, trained-twice"; default: no audit)',
        metavar="RULES",
        default="",
    ),
    *whatif.options(),
)
BY_NAME = {s.name: s for s in SETTINGS}
# Keys tito_config may set: what tito's fixtures read (collection settings are the run's, not a test's).
FIXTURE_KEYS = frozenset({"record_mode", *(o.name for o in whatif.options())}) | {"vcr"}


def dest(name: str) -> str:
    return "tito_" + name


def ini_key(name: str) -> str:
    return "tito_" + name


def register(parser: pytest.Parser) -> None:
    group = parser.getgroup("tito", "tito cassettes and goldens")
    group.addoption(
        "--update-goldens",
        action="store_true",
        default=False,
        help="write golden files from the replay instead of failing on a difference; delete unused "
        "goldens and sections",
    )
    for setting in SETTINGS:  # default None: "not given", so tito_config and the ini file can answer
        dataclasses.replace(setting, default=None).add(group.addoption, PREFIX, dest(setting.name))
        parser.addini(ini_key(setting.name), f"{setting.help} (as {setting.flag(PREFIX)})", default="")


def value(config: pytest.Config, name: str, fixture: Mapping[str, Any] | None = None) -> Any:
    """A setting's value: command line, then `fixture` (a tito_config dict), then the ini key, then default.

    Raises pytest.UsageError with a one-line reason for an ini value of the wrong type."""
    setting = BY_NAME[name]
    given = config.getoption(dest(name))
    if given is not None:
        return given
    if fixture is not None and name in fixture:
        return fixture[name]
    text = str(config.getini(ini_key(name)) or "").strip()
    return _parse(setting, text) if text else setting.default


def _parse(setting: Option, text: str) -> Any:
    key = ini_key(setting.name)
    if setting.switch:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise pytest.UsageError(f"ini {key} = {text!r}: expected true or false")
    if setting.choices and text not in setting.choices:
        raise pytest.UsageError(f"ini {key} = {text!r}: expected one of {', '.join(setting.choices)}")
    if setting.type is not None:
        try:
            return setting.type(text)
        except ValueError:
            raise pytest.UsageError(f"ini {key} = {text!r}: expected {setting.type.__name__}") from None
    return text


def checked_fixture_config(config: Any) -> dict[str, Any]:
    """The tito_config fixture's dict, its keys checked (a typo should not silently do nothing)."""
    if not isinstance(config, Mapping):
        raise TypeError(f"tito_config must return a dict, not {type(config).__name__}")
    unknown = sorted(set(config) - FIXTURE_KEYS)
    if unknown:
        raise ValueError(f"tito_config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(FIXTURE_KEYS))}")
    return dict(config)
