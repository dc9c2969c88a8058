"""Rules a cassette is expected to fire, each with its reason, in a file kept beside it: `X.audit.toml` for
`X.tito` (as `X.golden` is its golden). An allowed rule is still reported, marked allowed with its reason, and
never fails the audit; a rule id the audit does not know, or an allowance without a reason, makes the file
unusable (exit 2), so a typo cannot silently allow nothing.

    # cassettes/drift_realign.audit.toml
    [allow]
    never-trained = "recorded with splice off: the drifted turn is realigned and masked, as its golden says"
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tito_rl.replayer.audit.protocol import RULES

SUFFIX = ".audit.toml"


class AllowlistError(ValueError):
    pass


def allowlist_path(cassette: str | Path) -> Path:
    path = Path(cassette)
    return path.with_name(path.stem + SUFFIX)


def read_allowlist(cassette: str | Path) -> dict[str, str]:
    """Rule id -> reason for the cassette; {} when it has no allowlist beside it."""
    path = allowlist_path(cassette)
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AllowlistError(f"{path}: not a readable TOML file ({str(exc).splitlines()[0]})") from None
    allow = data.get("allow", {})
    unknown_keys = sorted(set(data) - {"allow"})
    if unknown_keys or not isinstance(allow, dict):
        raise AllowlistError(f'{path}: expected one [allow] table of rule = "reason", found {unknown_keys or "allow"}')
    out = {}
    for rule, reason in allow.items():
        if rule not in RULES:
            raise AllowlistError(f"{path}: unknown rule {rule!r} (rules: {', '.join(RULES)})")
        if not isinstance(reason, str) or not reason.strip():
            raise AllowlistError(f"{path}: rule {rule!r} is allowed without a reason (give it as a string)")
        out[rule] = reason.strip()
    return out
