"""tito's own servers run as child processes (the corpus driver, tests): a free port, waiting until one
answers, and stopping it politely (SIGTERM, then SIGKILL)."""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A port for a server about to start, below the kernel's ephemeral range. A port the kernel hands out for
    bind(0) comes from that range, where every outgoing connection's local port comes from too: in the time the
    server takes to start, a client elsewhere on the machine may take it (`address already in use`)."""
    low = _ephemeral_low()
    for _ in range(64):
        port = random.randrange(10_000, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # all tried were taken: the kernel's pick
        s.bind(("127.0.0.1", 0))
        picked: int = s.getsockname()[1]
        return picked


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32_768  # Linux's default
    return low if low > 11_000 else 32_768


def wait_http(url: str, proc: subprocess.Popen[Any], timeout_s: float = 90.0) -> None:
    """Until `url` answers below 500; RuntimeError if `proc` exits first, TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the process exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status < 500:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f}s")


def stop(proc: subprocess.Popen[Any], grace_s: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
