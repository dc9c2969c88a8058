"""Where an agent CLI runs: a fresh HOME and working directory per session, one command at a time.

Agent CLIs keep device ids, caches and installation ids under HOME, so every recorded session gets a new
sandbox; commands get exactly the environment the launcher built (nothing inherited) and stdin from
/dev/null, because several CLIs block or wait seconds on an open stdin.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from tito_rl.recorder.agents.install import DEFAULT_PREFIX, ensure_installed, install_command, pip_install_command
from tito_rl.recorder.agents.pid_namespace import pid_namespace_prefix, resolve_program
from tito_rl.recorder.agents.pins import AgentPin

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class SandboxError(RuntimeError):
    pass


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None  # None when the command was killed at its timeout
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float


class Sandbox(ABC):
    """A place where an agent CLI runs. Paths are POSIX paths as seen inside the sandbox."""

    kind: str
    home: str
    workdir: str
    base_path: str  # PATH for commands, before the agent's own binary directory is prepended

    @abstractmethod
    def write_file(self, path: str, content: str | bytes) -> str:
        """Write a file (parents created); a relative path is relative to HOME. Returns the full path."""

    @abstractmethod
    def run(
        self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: str | None = None
    ) -> CommandResult:
        """Run argv in `cwd` (default: the working directory) with exactly `env` and stdin from /dev/null."""

    @abstractmethod
    def install_agent(self, pin: AgentPin) -> str:
        """Make the pinned CLI available inside the sandbox; returns its binary path there."""

    @abstractmethod
    def close(self) -> None:
        """Release the sandbox; safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_command(argv: Sequence[str], env: Mapping[str, str], timeout_s: float) -> list[str]:
    if isinstance(argv, str) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError("argv must be a non-empty list of strings")
    for key, value in env.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key or "=" in key:
            raise ValueError(f"invalid environment entry {key!r}: names and values must be strings")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
    return list(argv)


class LocalSandbox(Sandbox):
    """A temporary directory on this machine and a subprocess per command; the default."""

    kind = "local"

    def __init__(
        self,
        parent: str | os.PathLike[str] | None = None,
        name: str | None = None,
        tools_prefix: Path = DEFAULT_PREFIX,
        keep: bool = False,
        pid_namespace: bool | None = None,
    ) -> None:
        """`name` (e.g. the session id) gives a stable directory instead of a random one: the CLIs put
        their working directory into the prompt, so a stable path keeps re-recordings token-identical.
        `pid_namespace`: run each command in a fresh PID namespace (`recorder/agents/pid_namespace.py`), so the
        process ids tool results show repeat too; None uses one where this machine allows it."""
        if pid_namespace is False:
            self._unshare: tuple[str, ...] = ()
        else:
            self._unshare = pid_namespace_prefix()
            if pid_namespace and not self._unshare:
                raise SandboxError("no PID namespace on this machine (unshare --pid is not allowed)")
        if name is None:
            self.root = Path(tempfile.mkdtemp(prefix="tito-sandbox-", dir=parent)).resolve()
        else:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"sandbox name {name!r} must be a single path component")
            self.root = (Path(parent or tempfile.gettempdir()) / name).resolve()
            try:
                self.root.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                raise SandboxError(
                    f"sandbox {self.root} exists: a recording of the same session is running, or "
                    "one was killed before it cleaned up (then remove the folder)"
                ) from None
        self.home = str(self.root / "home")
        self.workdir = str(self.root / "work")
        self._logs = self.root / "logs"
        # the CLIs' temp folder (TMPDIR), removed with the sandbox: opencode's binary unpacks a 5.5 MB library
        # into it on every run and never removes it (two in /tmp per test suite before)
        self.tmp = str(self.root / "tmp")
        for path in (self.home, self.workdir, self._logs, self.tmp):
            Path(path).mkdir()
        self.base_path = os.environ.get("PATH") or SYSTEM_PATH
        self.tools_prefix = Path(tools_prefix)
        self.keep = keep
        self._closed = False
        self._commands = 0

    def write_file(self, path: str, content: str | bytes) -> str:
        self._check_open()
        target = self._inside(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, str):
            content = content.encode()
        target.write_bytes(content)
        return str(target)

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: str | None = None
    ) -> CommandResult:
        self._check_open()
        argv = _check_command(argv, env, timeout_s)
        workdir = str(self._inside(cwd or self.workdir))
        if self._unshare:
            if resolve_program(argv[0], env, workdir) is None:
                raise SandboxError(f"cannot run {argv[0]!r}: not found")
            argv = [*self._unshare, *argv]
        self._commands += 1
        # Output goes to files, not pipes: a tool's leftover background child holding a pipe open would
        # otherwise keep us waiting after the agent itself exited.
        out_path = self._logs / f"{self._commands:04d}.stdout"
        err_path = self._logs / f"{self._commands:04d}.stderr"
        started = time.monotonic()
        with out_path.open("wb") as out, err_path.open("wb") as err:
            try:
                proc = subprocess.Popen(
                    argv,
                    env={"TMPDIR": self.tmp, **env},
                    cwd=workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                )
            except FileNotFoundError as exc:
                raise SandboxError(f"cannot run {argv[0]!r}: not found") from exc
            timed_out = False
            try:
                exit_code: int | None = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out, exit_code = True, None
            _kill_group(proc.pid)  # the whole session: the agent and anything its tools left running
            proc.wait()
        duration = time.monotonic() - started
        return CommandResult(exit_code, _read_text(out_path), _read_text(err_path), timed_out, duration)

    def install_agent(self, pin: AgentPin) -> str:
        return str(ensure_installed(pin, self.tools_prefix))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")

    def _inside(self, path: str) -> Path:
        target = (Path(self.home) / path).resolve()
        if not target.is_relative_to(self.root):
            raise ValueError(f"path {path!r} is outside the sandbox {self.root}")
        return target


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", errors="replace")


class E2BSandbox(Sandbox):
    """A remote E2B micro-VM via the `e2b` SDK.

    The agent inside it must reach the proxy, so the base URL given to the launcher has to be one the VM can
    reach (a public or tunnelled address), not 127.0.0.1 on this machine.
    """

    kind = "e2b"
    USER_HOME = "/home/user"

    def __init__(self, sdk_sandbox: Any, root: str = "/home/user/tito") -> None:
        self._sdk = sdk_sandbox
        self.root = root
        self.home = posixpath.join(root, "home")
        self.workdir = posixpath.join(root, "work")
        self.tools_prefix = posixpath.join(self.USER_HOME, ".tools", "npm")
        self.base_path = SYSTEM_PATH
        self._closed = False
        for path in (self.home, self.workdir):
            self._sdk.files.make_dir(path)

    @classmethod
    def create(
        cls,
        template: str | None = None,
        lifetime_s: int = 3600,
        sandbox_class: Any = None,
        **create_options: Any,
    ) -> E2BSandbox:
        """Start a VM (the SDK reads E2B_API_KEY from the environment); `sandbox_class` is for tests."""
        if sandbox_class is None:
            from e2b import Sandbox as sandbox_class
        return cls(sandbox_class.create(template=template, timeout=lifetime_s, **create_options))

    def write_file(self, path: str, content: str | bytes) -> str:
        self._check_open()
        target = posixpath.normpath(posixpath.join(self.home, path))
        self._sdk.files.write(target, content)
        return target

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float, cwd: str | None = None
    ) -> CommandResult:
        self._check_open()
        argv = _check_command(argv, env, timeout_s)
        from e2b import CommandExitException, TimeoutException

        command = shlex.join(argv) + " < /dev/null"
        started = time.monotonic()
        try:
            result = self._sdk.commands.run(
                command, envs=dict(env), cwd=cwd or self.workdir, timeout=timeout_s, stdin=False
            )
        except CommandExitException as exc:  # the SDK raises on any non-zero exit
            result = exc
        except TimeoutException as exc:
            return CommandResult(None, "", str(exc), True, time.monotonic() - started)
        return CommandResult(
            result.exit_code, result.stdout or "", result.stderr or "", False, time.monotonic() - started
        )

    def install_agent(self, pin: AgentPin) -> str:
        target = posixpath.join(self.tools_prefix, f"{pin.name}-{pin.version}")
        if pin.registry == "pypi":  # a venv of its own, made with the VM's python3
            target = posixpath.join(self.USER_HOME, ".tools", "venv", f"{pin.name}-{pin.version}")
            binary = posixpath.join(target, "bin", pin.binary)
            steps = [["python3", "-m", "venv", target], pip_install_command(pin, target)]
        else:
            binary = posixpath.join(target, "node_modules", ".bin", pin.binary)
            steps = [install_command(pin, target)]
        env = {"HOME": self.USER_HOME, "PATH": self.base_path}
        if self.run(["test", "-x", binary], env, 30).exit_code == 0:
            return binary
        for step in steps:
            done = self.run(step, env, 900, cwd=self.USER_HOME)
            if done.exit_code != 0:
                raise SandboxError(
                    f"installing {pin.spec} in the E2B sandbox failed (exit {done.exit_code}): {done.stderr[-2000:]}"
                )
        return binary

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._sdk.kill()

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("sandbox is closed")
