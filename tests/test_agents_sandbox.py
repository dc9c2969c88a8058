"""LocalSandbox: fresh directories, exact environment, stdin from /dev/null, timeouts that kill everything, pids
that repeat (a PID namespace where allowed)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tito_rl.recorder.agents.pid_namespace import pid_namespace_prefix
from tito_rl.recorder.agents.sandbox import LocalSandbox, SandboxError

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ONLY_THIS": "1"}


@pytest.fixture
def sandbox(tmp_path: Path):
    with LocalSandbox(parent=tmp_path) as box:
        yield box


def test_fresh_home_and_workdir_under_one_root(sandbox: LocalSandbox, tmp_path: Path) -> None:
    assert Path(sandbox.home).is_dir() and Path(sandbox.workdir).is_dir()
    assert Path(sandbox.home).parent == sandbox.root == Path(sandbox.workdir).parent
    assert sandbox.root.parent == tmp_path.resolve()
    assert list(Path(sandbox.home).iterdir()) == []


def test_two_sandboxes_never_share_a_home(tmp_path: Path) -> None:
    with LocalSandbox(parent=tmp_path) as a, LocalSandbox(parent=tmp_path) as b:
        assert a.home != b.home


def test_named_sandbox_has_a_stable_path_and_refuses_reuse(tmp_path: Path) -> None:
    with LocalSandbox(parent=tmp_path, name="sess-1") as box:
        assert isinstance(box, LocalSandbox)  # Sandbox.__enter__ is typed to return the base class
        assert box.root == (tmp_path / "sess-1").resolve()
        with pytest.raises(SandboxError, match="sess-1 exists: a recording of the same session is running"):
            LocalSandbox(parent=tmp_path, name="sess-1")
    with pytest.raises(ValueError, match="single path component"):
        LocalSandbox(parent=tmp_path, name="../escape")


def test_write_file_relative_to_home_creates_parents(sandbox: LocalSandbox) -> None:
    written = sandbox.write_file(".config/tool/conf.json", '{"a": "é"}')
    assert written == str(Path(sandbox.home) / ".config/tool/conf.json")
    assert Path(written).read_text(encoding="utf-8") == '{"a": "é"}'
    assert Path(sandbox.write_file(sandbox.workdir + "/data.bin", b"\x00\x01")).read_bytes() == b"\x00\x01"


def test_write_outside_the_sandbox_is_refused(sandbox: LocalSandbox) -> None:
    with pytest.raises(ValueError, match="outside the sandbox"):
        sandbox.write_file("../../escaped.txt", "x")
    with pytest.raises(ValueError, match="outside the sandbox"):
        sandbox.write_file("/etc/tito-escaped", "x")


def test_run_gets_exactly_the_given_env_in_the_workdir(sandbox: LocalSandbox) -> None:
    code = "import json, os, sys; print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd()}))"
    result = sandbox.run([sys.executable, "-c", code], ENV, timeout_s=60)
    assert result.exit_code == 0 and not result.timed_out
    seen = json.loads(result.stdout)
    # Python itself may add LC_CTYPE on some platforms; nothing of ours may leak in but the sandbox's temp folder.
    assert {k: v for k, v in seen["env"].items() if k != "LC_CTYPE"} == {**ENV, "TMPDIR": sandbox.tmp}
    assert seen["cwd"] == sandbox.workdir


def test_a_cli_s_temp_files_stay_in_the_sandbox_and_go_with_it(tmp_path: Path) -> None:
    """opencode's binary unpacks a 5.5 MB library into its temp folder on every run and leaves it: TMPDIR is the
    sandbox's own, removed at close (a TMPDIR the launcher gives wins)."""
    code = "import tempfile; f = tempfile.NamedTemporaryFile(delete=False, suffix='.so'); print(f.name)"
    with LocalSandbox(parent=tmp_path) as box:
        left = box.run([sys.executable, "-c", code], ENV, timeout_s=60).stdout.strip()
        assert Path(left).parent == Path(box.tmp) and Path(left).is_file()
        own = box.run([sys.executable, "-c", code], {**ENV, "TMPDIR": str(tmp_path)}, timeout_s=60).stdout.strip()
        assert Path(own).parent == tmp_path
    assert not Path(left).exists() and not box.root.exists()


def test_stdin_is_dev_null(sandbox: LocalSandbox) -> None:
    code = "import os, sys; print(os.path.realpath('/proc/self/fd/0')); print(repr(sys.stdin.read()))"
    result = sandbox.run([sys.executable, "-c", code], ENV, timeout_s=60)
    assert result.stdout.splitlines() == ["/dev/null", "''"]


def test_exit_code_and_both_streams_are_collected(sandbox: LocalSandbox) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)"
    result = sandbox.run([sys.executable, "-c", code], ENV, timeout_s=60)
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (7, "out\n", "err\n", False)


@pytest.mark.parametrize("pid_namespace", [False, None], ids=["host-pids", "pid-namespace-if-allowed"])
def test_timeout_kills_the_command_and_its_background_children(tmp_path: Path, pid_namespace: bool | None) -> None:
    with LocalSandbox(parent=tmp_path, pid_namespace=pid_namespace) as box:
        result = box.run(["sh", "-c", "sleep 301.25 & echo started; wait"], ENV, timeout_s=5)  # room to start
    assert result.timed_out and result.exit_code is None
    assert result.stdout == "started\n"
    assert _all_die("301.25")


@pytest.mark.parametrize("pid_namespace", [False, None], ids=["host-pids", "pid-namespace-if-allowed"])
def test_a_leftover_background_child_does_not_hold_the_run_open(tmp_path: Path, pid_namespace: bool | None) -> None:
    with LocalSandbox(parent=tmp_path, pid_namespace=pid_namespace) as box:
        result = box.run(["sh", "-c", "sleep 302.25 & echo bye"], ENV, timeout_s=120)
    assert (result.exit_code, result.timed_out, result.stdout) == (0, False, "bye\n")
    assert _all_die("302.25")


def _namespaces() -> None:
    if not pid_namespace_prefix():
        pytest.skip("this machine does not allow unshare --pid (not root, or no unshare): commands run with host pids")


def test_pids_repeat_between_runs_in_a_pid_namespace(tmp_path: Path) -> None:
    """What Gemini CLI's `Process Group PGID: N` needs: the same commands see the same pids every time."""
    _namespaces()
    script = "echo $$; sh -c 'echo $$'; sleep 0 & echo $!"
    with LocalSandbox(parent=tmp_path) as box:
        runs = [box.run(["sh", "-c", script], ENV, timeout_s=60) for _ in range(2)]
    assert runs[0].stdout == runs[1].stdout == "1\n2\n3\n"


def test_the_namespace_ends_with_the_command_even_for_other_process_groups(tmp_path: Path) -> None:
    """A tool child in a session of its own (Gemini CLI runs each shell command so) escapes the process-group
    kill; the namespace takes it down when the CLI exits."""
    _namespaces()
    with LocalSandbox(parent=tmp_path) as box:
        result = box.run(["sh", "-c", "setsid sleep 303.25 & sleep 0.5; echo bye"], ENV, timeout_s=120)
    assert (result.exit_code, result.stdout) == (0, "bye\n")
    assert _all_die("303.25")


def test_a_required_namespace_that_is_not_allowed_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tito_rl.recorder.agents.sandbox.pid_namespace_prefix", lambda: ())
    with pytest.raises(SandboxError, match="no PID namespace"):
        LocalSandbox(parent=tmp_path, pid_namespace=True)
    with LocalSandbox(parent=tmp_path) as box:  # the default runs plainly instead
        assert box.run(["sh", "-c", "echo $$"], ENV, timeout_s=60).stdout != "1\n"


def _all_die(marker: str) -> bool:
    """Every host process running `sleep <marker>` gone (or a zombie) within a bounded wait: SIGKILL is
    delivered asynchronously. Found by its command line, since a pid written inside a namespace is not a host pid."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not [pid for pid in _pids_running(["sleep", marker]) if not _zombie(pid)]:
            return True
        time.sleep(0.05)
    return False


def _pids_running(argv: list[str]) -> list[int]:
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if (proc / "cmdline").read_bytes() == wanted:
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def test_bad_commands_are_clear_errors(sandbox: LocalSandbox) -> None:
    with pytest.raises(SandboxError, match="not found"):
        sandbox.run(["/nonexistent/agent-cli"], ENV, timeout_s=5)
    with pytest.raises(ValueError, match="list of strings"):
        sandbox.run("echo hi", ENV, timeout_s=5)  # a str: a Sequence[str] to mypy, refused at run time
    with pytest.raises(ValueError, match="invalid environment entry"):
        sandbox.run(["true"], {"PATH": None}, timeout_s=5)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="timeout_s"):
        sandbox.run(["true"], ENV, timeout_s=0)


def test_close_removes_everything_and_is_final(tmp_path: Path) -> None:
    box = LocalSandbox(parent=tmp_path)
    box.write_file("a.txt", "x")
    box.close()
    box.close()
    assert not box.root.exists()
    with pytest.raises(SandboxError, match="closed"):
        box.run(["true"], ENV, timeout_s=5)


def test_keep_leaves_the_tree_for_inspection(tmp_path: Path) -> None:
    with LocalSandbox(parent=tmp_path, keep=True) as box:
        box.write_file("a.txt", "x")
    assert (Path(box.home) / "a.txt").read_text() == "x"
