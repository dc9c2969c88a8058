"""Run a sandboxed CLI in a fresh PID namespace, so the process ids its tools report repeat between recordings.

Gemini CLI's (and Qwen Code's) shell tool ends every result with `Process Group PGID: <pid>`, which goes back to
the model as prompt tokens: with host pids every re-recording replays other tokens. In a new PID namespace the
CLI is pid 1 and its children count up from 2 in the order it starts them, so the same session reports the same
pids. The namespace also ends with the CLI: the kernel kills whatever its tools left running, even in process
groups of their own. Needs unshare(1) and the right to make namespaces (root, as in the recording containers);
elsewhere the sandbox runs commands plainly and says so once.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping

log = logging.getLogger(__name__)

# --fork: the command is the namespace's pid 1 (unshare itself stays outside, waiting for it);
# --kill-child: if unshare is killed, so is the namespace; --mount-proc: /proc shows the namespace's pids.
UNSHARE = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")


@functools.cache
def pid_namespace_prefix() -> tuple[str, ...]:
    """The argv prefix (unshare by its full path: the command's own PATH may lack it) that runs a command in a
    fresh PID namespace here, or () where that is not allowed."""
    unshare = shutil.which(UNSHARE[0])
    if unshare is None:
        reason = "unshare(1) is not installed"
    else:
        prefix = (unshare, *UNSHARE[1:])
        try:
            probe = subprocess.run(
                [*prefix, "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            reason = str(exc)
        else:
            if probe.returncode == 0:
                return prefix
            reason = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
    log.warning(
        "no PID namespace for sandboxed commands (%s): tool results that show process ids "
        "(Gemini CLI's PGID) will differ between recordings",
        reason,
    )
    return ()


def resolve_program(program: str, env: Mapping[str, str], cwd: str) -> str | None:
    """Where exec would find `program` with this PATH and working directory (None: nowhere), so a missing
    binary is still reported as missing rather than as unshare's exit code."""
    if "/" in program:
        path = os.path.join(cwd, program)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(program, path=env.get("PATH", ""))
