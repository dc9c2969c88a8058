"""The install helper, driven by stand-ins so it runs without a registry: an `npm` script for the npm pins, and
a base Python whose `-m venv` makes an environment whose `pip` writes the CLI's script, for a PyPI pin."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from tito_rl.recorder.agents.install import (
    AgentInstallError,
    binary_path,
    ensure_installed,
    install_command,
    install_dir,
    is_installed,
    pip_install_command,
)
from tito_rl.recorder.agents.pins import CODEX, MINI_SWE_AGENT, QWEN_CODE

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


def test_installs_once_into_a_per_version_dir(
    tmp_path: Path, fake_npm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = tmp_path / "tools"
    binary = ensure_installed(CODEX, prefix)
    folder = prefix / "codex-0.169.0"
    assert re.fullmatch(
        f"tito: installing @openai/codex@0.169.0 into {folder} \\(once; cached\\)\n"
        "tito: installed @openai/codex@0.169.0: 0 MB in [0-9]+ s\n",
        capsys.readouterr().err,
    )  # a first install says so when it starts and when it is done
    assert binary == prefix / "codex-0.169.0" / "node_modules" / ".bin" / "codex" == binary_path(CODEX, prefix)
    assert os.access(binary, os.X_OK)
    assert is_installed(CODEX, prefix)
    assert ensure_installed(CODEX, prefix) == binary
    assert len(fake_npm.read_text().splitlines()) == 1  # the second call found it installed
    assert capsys.readouterr().err == ""  # and said nothing
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


# Mimics `python -m venv DIR`: DIR/bin/python is a stand-in whose `-m pip install ...` logs its arguments and
# writes bin/mini (or fails as pip does for a version the index lacks).
FAKE_BASE_PYTHON = """#!/bin/sh
[ "$1 $2" = "-m venv" ] || exit 9
mkdir -p "$3/bin"
cat > "$3/bin/python" <<'PY'
#!/bin/sh
echo "$@" >> "{log}"
[ -n "$FAIL" ] && {{ echo "ERROR: No matching distribution found for mini-swe-agent==2.4.6" >&2; exit 1; }}
printf '#!/bin/sh\\necho mini\\n' > "$(dirname "$0")/mini"; chmod +x "$(dirname "$0")/mini"
PY
chmod +x "$3/bin/python"
"""


@pytest.fixture
def fake_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "pip.log"
    python = tmp_path / "base" / "python"
    python.parent.mkdir()
    python.write_text(FAKE_BASE_PYTHON.format(log=log))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return log


def test_a_pypi_pin_installs_once_into_its_own_cached_venv_with_the_libraries_pinned(
    tmp_path: Path, fake_python: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "cache" / "tito" / "mini-swe-agent-2.4.6-venv"
    assert install_dir(MINI_SWE_AGENT, tmp_path / "npm") == folder  # the npm prefix does not apply
    assert not is_installed(MINI_SWE_AGENT)
    binary = ensure_installed(MINI_SWE_AGENT)
    start, done = capsys.readouterr().err.splitlines()
    assert start == f"tito: installing mini-swe-agent==2.4.6 into {folder} (once; cached)"
    assert re.fullmatch(r"tito: installed mini-swe-agent==2\.4\.6: [0-9]+ MB in [0-9]+ s", done), done
    assert binary == folder / "bin" / "mini" == binary_path(MINI_SWE_AGENT) and os.access(binary, os.X_OK)
    assert pip_install_command(MINI_SWE_AGENT, str(folder)) == [
        f"{folder}/bin/python",
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
        "mini-swe-agent==2.4.6",
        "litellm==1.110.2",
        "openai==3.57.0",
    ]
    assert fake_python.read_text().split() == pip_install_command(MINI_SWE_AGENT, str(folder))[1:]
    assert is_installed(MINI_SWE_AGENT) and ensure_installed(MINI_SWE_AGENT) == binary
    assert len(fake_python.read_text().splitlines()) == 1  # the second call found it installed
    # another pin of a library (a bumped pin) is not the same environment: made again
    (folder / ".tito-installed").write_text("mini-swe-agent==2.4.6 litellm==1.0.0\n")
    assert not is_installed(MINI_SWE_AGENT)


def test_a_failed_pip_install_says_why_and_is_made_again_next_time(
    tmp_path: Path, fake_python: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIL", "1")
    with pytest.raises(AgentInstallError, match="pip install failed: ERROR: No matching distribution found"):
        ensure_installed(MINI_SWE_AGENT)
    assert not is_installed(MINI_SWE_AGENT)  # half made: no stamp
    monkeypatch.delenv("FAIL")
    assert ensure_installed(MINI_SWE_AGENT).is_file() and is_installed(MINI_SWE_AGENT)
