"""The npm install helper, driven by a stand-in `npm` script so it runs without the registry."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tito_rl.recorder.agents.install import (
    AgentInstallError,
    binary_path,
    ensure_installed,
    install_command,
    install_dir,
    is_installed,
)
from tito_rl.recorder.agents.pins import CODEX, QWEN_CODE

# Mimics `npm install --prefix DIR PKG@VER`: writes the package manifest and the .bin entry, and counts calls.
FAKE_NPM = """#!/bin/sh
echo "$@" >> "{log}"
[ -n "$FAIL" ] && {{ echo "npm ERR! 404 Not Found" >&2; exit 1; }}
prefix="$3"; spec=$(eval echo \\${{$#}})
pkg="${{spec%@*}}"; ver="${{spec##*@}}"
mkdir -p "$prefix/node_modules/$pkg" "$prefix/node_modules/.bin"
printf '{{"name":"%s","version":"%s"}}' "$pkg" "$ver" > "$prefix/node_modules/$pkg/package.json"
[ -n "$NO_BIN" ] || {{ printf '#!/bin/sh\\necho agent\\n' > "$prefix/node_modules/.bin/{binary}";
  chmod +x "$prefix/node_modules/.bin/{binary}"; }}
"""


@pytest.fixture
def fake_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "npm.log"
    npm = tmp_path / "bin" / "npm"
    npm.parent.mkdir()
    npm.write_text(FAKE_NPM.format(log=log, binary=CODEX.binary))
    npm.chmod(npm.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{npm.parent}:{os.environ['PATH']}")
    return log


def test_install_command_pins_the_exact_version() -> None:
    assert install_command(CODEX, "/p/codex-0.169.0") == [
        "npm",
        "install",
        "--prefix",
        "/p/codex-0.169.0",
        "--save-exact",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        "@openai/codex@0.169.0",
    ]


def test_installs_once_into_a_per_version_dir(tmp_path: Path, fake_npm: Path) -> None:
    prefix = tmp_path / "tools"
    binary = ensure_installed(CODEX, prefix)
    assert binary == prefix / "codex-0.169.0" / "node_modules" / ".bin" / "codex" == binary_path(CODEX, prefix)
    assert os.access(binary, os.X_OK)
    assert is_installed(CODEX, prefix)
    assert ensure_installed(CODEX, prefix) == binary
    assert len(fake_npm.read_text().splitlines()) == 1  # the second call found it installed
    assert (prefix / ".gitignore").read_text() == "*\n"
    assert [p.name for p in prefix.iterdir() if p.name.startswith(".staging")] == []


def test_a_different_installed_version_is_not_accepted(tmp_path: Path, fake_npm: Path) -> None:
    prefix = tmp_path / "tools"
    ensure_installed(CODEX, prefix)
    manifest = install_dir(CODEX, prefix) / "node_modules" / "@openai/codex" / "package.json"
    manifest.write_text(json.dumps({"version": "0.1.0"}))
    assert not is_installed(CODEX, prefix)


def test_npm_failure_is_reported_and_leaves_nothing_behind(
    tmp_path: Path, fake_npm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL", "1")
    prefix = tmp_path / "tools"
    with pytest.raises(AgentInstallError, match="(?s)exit code 1.*404 Not Found"):
        ensure_installed(QWEN_CODE, prefix)
    assert sorted(p.name for p in prefix.iterdir()) == [".gitignore"]


def test_a_package_without_its_binary_is_an_error(
    tmp_path: Path, fake_npm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NO_BIN", "1")
    with pytest.raises(AgentInstallError, match="is missing"):
        ensure_installed(CODEX, tmp_path / "tools")
    assert not install_dir(CODEX, tmp_path / "tools").exists()


def test_missing_npm_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(AgentInstallError, match="npm not found"):
        ensure_installed(CODEX, tmp_path / "tools", npm=str(tmp_path / "no-such-npm"))
