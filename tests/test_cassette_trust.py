"""A cassette never runs what it names (issue 45, `recorder/targets/profiles/trust.py`): hostile cassettes made from
a committed one, their headers holding a gateway profile whose `start.command` and `samples.function` would leave a
marker file, and a recorded `--target module:attribute` whose module would leave one on import. `tito replay`,
`inspect`, `diff`, `audit`, `cassette info` and pytest collecting and running them leave no marker and, where they
would replay, refuse in one line (exit 2) saying what the cassette asks to run and how to allow it. The user's word
runs it: `--trust-cassette`, or the user's own profile file (the same as recorded: the recorded target; another:
one line naming the key that differs)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tito_rl.cassette.reader import CassetteReader, read_header
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.main import main
from tito_rl.recorder.targets.base import TargetError
from tito_rl.recorder.targets.profiles.format import parse_profile, profile_to_dict
from tito_rl.recorder.targets.profiles.trust import (
    UntrustedTarget,
    first_difference,
    profile_digest,
    recorded_ref,
    resolve,
)

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "cassettes" / "targets" / "agentlightning_mixed.tito"  # recorded through a (built-in) profile
ASKS_PROFILE = "the cassette asks to run the gateway profile 'gw.yaml': start.command"
ASKS_DRIVER = "the cassette asks to import and call evil_driver:create (the driver it was recorded around)"


def hostile_profile(folder: Path) -> dict[str, Any]:
    """A profile as a recording keeps it: its command, and its samples module on import, leave markers."""
    return profile_to_dict(
        parse_profile(
            {
                "profile": 1,
                "name": "innocent",
                "python": {"default": sys.executable},
                "start": {
                    "command": [sys.executable, "-c", f"open({str(folder / 'marker_command')!r}, 'w').close()"],
                    "ready": {"path": "/health", "timeout_s": 60},
                },
                "sessions": {"from": "path:/proxy/rollout/{sid}", "routing_header": None},
                "samples": {"request": {"method": "GET", "path": "/s/{session}"}, "function": "evil_samples:rows"},
            }
        )
    )


def rewrite(to: Path, target: dict[str, Any]) -> Path:
    """The committed cassette's sessions under a header whose `target` is `target`."""
    with CassetteReader(BASE) as reader:
        header, records = reader.header, list(reader.records())
    with CassetteWriter(to, dataclasses.replace(header, target=target), header_redacted=True) as writer:
        for record in records:
            writer.append_redacted(record)
    return to


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stranger's cassettes beside the modules they name (a pull request can bring both)."""
    root = tmp_path_factory.mktemp("stranger")
    recorded = read_header(BASE).target or {}
    profile = hostile_profile(root)
    rewrite(
        root / "profile.tito",
        {
            **recorded,
            "ref": "gw.yaml",
            "name": "innocent",
            "settings": {"profile": profile, "profile_source": "gw.yaml"},
        },
    )
    rewrite(root / "driver.tito", {**recorded, "ref": "evil_driver:create", "name": "evil", "settings": {}})
    (root / "evil_driver.py").write_text(
        f"open({str(root / 'marker_import')!r}, 'w').close()\n\ndef create(options):\n    raise RuntimeError('ran')\n"
    )
    (root / "evil_samples.py").write_text(f"open({str(root / 'marker_function')!r}, 'w').close()\n")
    return root


def markers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("marker_*"))


def run_tito(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=folder, capture_output=True, text=True, timeout=300
    )


# ---- the decision ----


def test_only_what_the_user_gives_or_has_installed_is_chosen_without_trust(tmp_path: Path) -> None:
    profile = hostile_profile(tmp_path)
    recorded = {"kind": "driver", "ref": "gw.yaml", "settings": {"profile": profile}}
    with pytest.raises(UntrustedTarget) as refused:
        resolve(recorded, None)
    line = str(refused.value)
    assert "\n" not in line and line.startswith(ASKS_PROFILE)
    assert "samples.function evil_samples:rows" in line and "marker_command" in line
    assert "--target gw.yaml" in line and "--trust-cassette" in line
    assert resolve(recorded, None, trust=True).profile == profile  # trusted: the cassette's copy runs
    with pytest.raises(UntrustedTarget, match="import and call evil_driver:create"):
        resolve({"kind": "driver", "ref": "evil_driver:create"}, None)
    with pytest.raises(UntrustedTarget) as refused:  # whatever the header holds, the refusal is one line
        resolve({"kind": "driver", "ref": "evil\nmod:x\x1b[2J", "settings": {"profile": profile}}, None)
    assert str(refused.value).isprintable() and "import and call evil\\nmod:x\\x1b[2J" in str(refused.value)
    # tito's adapter, a running gateway (its address, no code), the drivers installed here: as recorded
    assert resolve(None, None).spec.text == recorded_ref(None) == "tito"
    assert resolve({"kind": "http", "ref": "http://127.0.0.1:9"}, None).spec.kind == "http"
    for name in ("slime", "rllm", "verifiers", "agentlightning", "tito_rl.recorder.targets.slime:create"):
        assert resolve({"kind": "driver", "ref": name}, None).spec.text == name
    # what the user types is the user's word, whatever the cassette says
    assert resolve(recorded, "evil_driver:create").spec.text == "evil_driver:create"
    with pytest.raises(TargetError, match="gone.yaml"):
        resolve(recorded, str(tmp_path / "gone.yaml"))


def test_a_name_wins_over_a_file_the_cassette_could_bring_along(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "slime").write_text(yaml.safe_dump(hostile_profile(tmp_path)))  # a "profile file" named slime
    from tito_rl.recorder.targets.registry import load_factory

    factory = load_factory("slime")
    assert getattr(factory, "__module__", "") == "tito_rl.recorder.targets.slime"


def test_the_users_profile_is_checked_against_the_recorded_copy(tmp_path: Path) -> None:
    profile = hostile_profile(tmp_path)
    recorded = {"kind": "driver", "ref": "/elsewhere/gw.yaml", "settings": {"profile": profile}}
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(profile))
    same = resolve(recorded, str(mine))
    assert same.note is None and same.profile == profile
    assert same.spec.text == "/elsewhere/gw.yaml"  # the very profile recorded: goldens apply, wherever the file is
    changed = {**profile, "start": {**profile["start"], "ready": {**profile["start"]["ready"], "timeout_s": 5.0}}}
    mine.write_text(yaml.safe_dump(changed))
    other = resolve(recorded, str(mine))
    assert other.spec.text == str(mine) and other.profile == changed
    assert other.note == f"{mine} is not the profile the cassette was recorded with: start.ready.timeout_s differs"
    assert first_difference(profile, {**profile, "volatile": ["id"]}) == "volatile"
    # the digest is the profile's, however it was read: tuples from the format, lists from a header's JSON
    assert profile_digest(profile) == profile_digest(yaml.safe_load(yaml.safe_dump(profile)))


def test_the_committed_agent_lightning_cassettes_replay_through_the_builtin_profile_as_recorded() -> None:
    for path in sorted((ROOT / "cassettes" / "targets").glob("agentlightning_*.tito")):
        chosen = resolve(read_header(path).target, None)
        assert chosen.spec.text == "agentlightning" and chosen.note is None and chosen.profile is None


# ---- every command that reads a cassette ----


@pytest.mark.parametrize(
    ("command", "exits"),
    [("replay", 2), ("inspect", 2), ("diff", 2), ("audit", None), ("cassette info", 0)],
)
@pytest.mark.parametrize("cassette", ["profile", "driver"])
def test_reading_a_strangers_cassette_runs_nothing_it_names(
    folder: Path, command: str, exits: int | None, cassette: str, monkeypatch: Any, capsys: Any
) -> None:
    monkeypatch.chdir(folder)  # where `module:attribute` is looked for, and the module is
    path = f"{cassette}.tito"
    args = [*command.split(), path, *([path] if command == "diff" else [])]
    rc = main(args)
    err = capsys.readouterr().err
    assert markers(folder) == []
    if exits is None:
        assert rc in (0, 1), err  # an audit reads the recording: it starts nothing
        return
    assert rc == exits, err
    if exits == 2:
        (line,) = err.splitlines()
        assert (ASKS_PROFILE if cassette == "profile" else ASKS_DRIVER) in line, line
        assert line.startswith(f"tito {command}: {path}: ") and "--trust-cassette" in line


@pytest.mark.slow
def test_pytest_collecting_and_running_them_fails_each_item_in_one_line_and_runs_nothing(folder: Path) -> None:
    project = folder / "project"
    (project / "cassettes").mkdir(parents=True)
    for name in ("profile.tito", "driver.tito"):
        (project / "cassettes" / name).write_bytes((folder / name).read_bytes())
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "evil_driver.py").write_text((folder / "evil_driver.py").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}

    def pytest_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-q", *args],
            cwd=project,
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )

    run = pytest_run("-rf")
    assert markers(folder) == [] and markers(project) == []
    assert run.returncode == 1 and "8 failed" in run.stdout, run.stdout[-3000:]
    assert "passed" not in run.stdout and "skipped" not in run.stdout
    assert "--tito-target gw.yaml), or --tito-trust-cassette" in run.stdout
    assert ASKS_DRIVER in run.stdout and "--tito-target evil_driver:create" in run.stdout
    # the user's word, in the ini file: the cassette's own driver is imported and called
    (project / "pytest.ini").write_text("[pytest]\ntito_trust_cassette = true\n")
    run = pytest_run("cassettes/driver.tito")
    assert markers(folder) == ["marker_import"] and "RuntimeError: ran" in run.stdout, run.stdout[-3000:]
    (folder / "marker_import").unlink()


# ---- the user's word ----


@pytest.mark.slow
def test_trusted_the_cassettes_target_runs(folder: Path) -> None:
    run = run_tito(folder, "replay", "driver.tito", "--trust-cassette")
    assert markers(folder) == ["marker_import"] and run.returncode == 2, run.stderr  # imported, and called
    assert "RuntimeError: ran" in run.stderr
    (folder / "marker_import").unlink()
    run = run_tito(folder, "replay", "profile.tito", "--trust-cassette")
    assert markers(folder) == ["marker_command"] and run.returncode == 2, run.stderr  # it exits: never ready
    (folder / "marker_command").unlink()


@pytest.mark.slow
def test_the_users_own_profile_file_runs_and_one_that_differs_is_named(folder: Path, tmp_path: Path) -> None:
    recorded = read_header(folder / "profile.tito").target["settings"]["profile"]
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(recorded))
    run = run_tito(folder, "replay", "profile.tito", "--target", str(mine))
    assert markers(folder) == ["marker_command"] and run.returncode == 2, run.stderr
    assert "not the profile the cassette was recorded with" not in run.stderr
    (folder / "marker_command").unlink()
    mine.write_text(yaml.safe_dump({**recorded, "volatile": ["id"]}))
    run = run_tito(folder, "replay", "profile.tito", "--target", str(mine))
    assert markers(folder) == ["marker_command"], run.stderr
    assert f"tito: note: profile.tito: {mine} is not the profile the cassette was recorded with: volatile differs" in (
        run.stderr.splitlines()
    )
    (folder / "marker_command").unlink()
