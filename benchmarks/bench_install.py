"""tito's lean install against the full one: installed size, install time, time to the first parsed reply.

Both installs are built in this run, in a temp dir, from the same pip cache:
- lean: `make install VENV=<tmp>/lean`, what CI and `make demo` do (sglang and xgrammar with --no-deps, and
  only what their parsers import);
- full: the install before `trajectory/sglang_loader.py`: CPU torch 2.13.0, sglang and xgrammar with
  --no-deps, the old list of sglang's import-time needs (triton among them), then tito. Its tito processes
  load sglang's runtime (`import sglang`) where the parsers are first loaded, as tito did then.

Time to the first parsed reply: from starting `tito serve` (tokenizer, parsers, warm-up) to the first answer
to a Claude Code-style request whose reply is a parsed tool call, served by a `tito fake-engine` started
beforehand. Each install gets a warm-up round, then ROUNDS timed rounds, alternating; the figure is the median.
The host's steal (from /proc/stat) is printed beside each phase, and the load average before the run: on a
shared 2-core VM a timing moves with both.
Install times are with a warm pip cache; the growth of pip's cache during each install is printed, so a
download in one and not the other shows. Last line: the three ratios, full over lean.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5
GIB = 1 << 30
SCRIPT = "fake_engine/examples/claude_tool_loop.yaml"  # turn 1: reasoning, text and a shell tool call
REQUEST = {"model": "tito", "max_tokens": 512, "messages": [{"role": "user", "content": "list the files"}],
           "tools": [{"name": "Bash", "description": "Run a shell command", "input_schema": {
               "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]}
# requirements-parsers.txt before the lean install (installed after torch and `--no-deps sglang xgrammar`).
FULL_IMPORT_NEEDS = ["triton", "numpy", "orjson", "psutil", "pybase64", "requests", "packaging", "pillow",
                     "starlette", "msgspec", "pydantic", "pyzmq", "tqdm", "ipython", "aiohttp", "openai",
                     "partial-json-parser", "regex", "apache-tvm-ffi", "transformers==5.19.0", "tokenizers"]
START_TITO = "import sys; from tito_cli import main; sys.exit(main())"
# The full install's tito: sglang/__init__.py (the serving runtime) runs where its parsers are first loaded,
# as `from sglang.srt... import` did before sglang_loader: after the tokenizer, inside the server's start-up.
START_TITO_WITH_RUNTIME = """
import trajectory.sglang_loader as loader
bare_package = loader._bare_package
def with_runtime(name):
    import sglang  # noqa: F401
    return bare_package(name)
loader._bare_package = with_runtime
""" + START_TITO


def _run(cmd: list[str], log: Path) -> None:
    with log.open("ab") as out:
        done = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{tail}")


def build_lean(venv: Path, log: Path) -> None:
    _run(["make", "install", f"VENV={venv}"], log)


def build_full(venv: Path, log: Path) -> None:
    pip = str(venv / "bin" / "pip")
    _run([sys.executable, "-m", "venv", str(venv)], log)
    _run([pip, "install", "-q", "torch==2.13.0"], log)
    _run([pip, "install", "-q", "--no-deps", "sglang==0.5.23", "xgrammar==0.2.7"], log)
    _run([pip, "install", "-q", *FULL_IMPORT_NEEDS], log)
    _run([pip, "install", "-q", "-e", ".[dev]"], log)


def disk_usage(path: Path) -> int:
    """Bytes on disk under `path`, folders included, as `du -s` counts them (hard links once)."""
    seen: set[tuple[int, int]] = set()
    total = os.lstat(path).st_blocks * 512
    for folder, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            st = os.lstat(os.path.join(folder, name))
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _pip_cache() -> Path:
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    return Path(out.stdout.strip() or Path.home() / ".cache" / "pip")


def _steal_ticks() -> dict[str, int]:
    """Clock ticks each (virtual) CPU waited for its hypervisor (Linux); empty where unknown."""
    try:
        return {f[0]: int(f[8]) for f in (line.split() for line in Path("/proc/stat").read_text().splitlines())
                if f[0].startswith("cpu") and f[0] != "cpu" and len(f) > 8}
    except (OSError, ValueError):
        return {}


@contextmanager
def steal_watch(out: list[float]) -> Iterator[None]:
    """Appends the most any one CPU was stolen during the block, as a percentage of its wall time."""
    before, start = _steal_ticks(), time.monotonic()
    yield
    after, wall = _steal_ticks(), time.monotonic() - start
    ticks = max((after[c] - before.get(c, after[c]) for c in after), default=0)
    out.append(100 * ticks / os.sysconf("SC_CLK_TCK") / wall)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s")


def first_parsed_reply(python: Path, start: str, engine: str) -> float:
    """Seconds from starting `tito serve` with `python` to the first parsed tool-call reply it sends."""
    port = free_port()
    body = json.dumps(REQUEST).encode()
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(python), "-c", start, "serve", "--engine", engine, "--listen", f"127.0.0.1:{port}"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and time.perf_counter() - t0 < 180:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/messages", data=body, method="POST",
                                         headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    reply = json.loads(resp.read())
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.01)  # not listening yet
                continue
            elapsed = time.perf_counter() - t0
            if not any(block.get("type") == "tool_use" for block in reply["content"]):
                raise RuntimeError(f"no parsed tool call in the reply: {reply}")
            return elapsed
        raise RuntimeError(f"tito serve ({python}) exited or never answered")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="tito-bench-install-"))
    venvs = {"lean": tmp / "lean", "full": tmp / "full"}
    builders = {"lean": build_lean, "full": build_full}
    size: dict[str, float] = {}
    install_s: dict[str, float] = {}
    reply_s: dict[str, list[float]] = {"lean": [], "full": []}
    cache = _pip_cache()
    # Other processes share the 2 cores too; steal does not show them, the load average before the run does.
    print(f"load average before the run: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores", flush=True)
    try:
        for name in ("lean", "full"):
            steal: list[float] = []
            cache_before = disk_usage(cache) if cache.is_dir() else 0
            with steal_watch(steal):
                t0 = time.perf_counter()
                builders[name](venvs[name], tmp / f"{name}.log")
                install_s[name] = time.perf_counter() - t0
            size[name] = disk_usage(venvs[name]) / GIB
            cache_growth = ((disk_usage(cache) if cache.is_dir() else 0) - cache_before) / (1 << 20)
            print(f"{name}: installed {size[name]:.2f} GiB in {install_s[name]:.0f} s "
                  f"(pip cache grew {cache_growth:.0f} MiB; host steal up to {steal[0]:.1f}%)", flush=True)
        engine_port = free_port()
        engine = f"http://127.0.0.1:{engine_port}"
        fake = subprocess.Popen([sys.executable, "-m", "tito_cli", "fake-engine", "--script", SCRIPT,
                                 "--port", str(engine_port)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            _wait_http(engine + "/health")
            starts = {"lean": START_TITO, "full": START_TITO_WITH_RUNTIME}
            for name in ("lean", "full"):  # warm-up: the OS file cache holds each install from here on
                first_parsed_reply(venvs[name] / "bin" / "python", starts[name], engine)
            steal = []
            with steal_watch(steal):
                for _ in range(ROUNDS):
                    for name in ("lean", "full"):
                        reply_s[name].append(first_parsed_reply(venvs[name] / "bin" / "python", starts[name], engine))
        finally:
            fake.send_signal(signal.SIGTERM)
            fake.wait(timeout=30)
        for name in ("lean", "full"):
            runs = ", ".join(f"{s:.2f}" for s in reply_s[name])
            print(f"{name}: first parsed reply median {statistics.median(reply_s[name]):.2f} s (runs {runs})")
        print(f"first-reply rounds: host steal up to {steal[0]:.1f}%")
        lean_reply, full_reply = statistics.median(reply_s["lean"]), statistics.median(reply_s["full"])
        print(f"install: lean {size['lean']:.2f} GiB, {install_s['lean']:.0f} s, first parsed reply "
              f"{lean_reply:.2f} s; full: {size['full']:.2f} GiB, {install_s['full']:.0f} s, {full_reply:.2f} s; "
              f"ratio (full/lean): size {size['full'] / size['lean']:.2f}, install time "
              f"{install_s['full'] / install_s['lean']:.2f}, first parsed reply {full_reply / lean_reply:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
