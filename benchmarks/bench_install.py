"""tito's lean install against the full one: installed size, install time, time to the first parsed reply.

Both installs are built in this run, in a temp dir, from the same pip cache:
- lean: `make install VENV=<tmp>/lean`, what CI and `make demo` do (sglang and xgrammar with --no-deps, and
  only what their parsers import);
- full: the install before `trajectory/adapters/parsing/sglang_loader.py`: CPU torch 2.13.0, sglang and xgrammar with
  --no-deps, the old list of sglang's import-time needs (triton among them), then tito. Its tito processes
  load sglang's runtime (`import sglang`) where the parsers are first loaded, as tito did then.

Install time: each install is built twice, the first build untimed (it fills pip's cache and the OS file
cache, so neither install pays downloads the other was spared), the second timed; the growth of pip's cache
during the timed build is printed, so a download there shows.
Time to the first parsed reply: from starting `tito serve` (tokenizer, parsers, warm-up) to the first answer
to a Claude Code-style request whose reply is a parsed tool call, served by a `tito fake-engine` started
beforehand. Both installs run the same tito code. Each gets a warm-up round, then ROUNDS timed rounds,
alternating; the figure is the median.
The host's steal (from /proc/stat) and the load average are printed beside each phase: on a shared VM a
timing moves with both. Each figure is given as a ratio against the full install measured in this run.
The run ends with the markdown block for the README (and docs/install.md); `--write` puts it between the
`<!-- install-figures:start -->` and `<!-- install-figures:end -->` lines of both files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from host_steal import steal_watch  # benchmarks/, the script's folder

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5
GIB = 1 << 30
START_MARK, END_MARK = "<!-- install-figures:start -->", "<!-- install-figures:end -->"
FIGURE_FILES = ("README.md", "docs/install.md")
SCRIPT = "fake_engine/examples/claude_tool_loop.yaml"  # turn 1: reasoning, text and a shell tool call
REQUEST = {
    "model": "tito",
    "max_tokens": 512,
    "messages": [{"role": "user", "content": "list the files"}],
    "tools": [
        {
            "name": "Bash",
            "description": "Run a shell command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
        }
    ],
}
# requirements-parsers.txt before the lean install (installed after torch and `--no-deps sglang xgrammar`).
FULL_IMPORT_NEEDS = [
    "triton",
    "numpy",
    "orjson",
    "psutil",
    "pybase64",
    "requests",
    "packaging",
    "pillow",
    "starlette",
    "msgspec",
    "pydantic",
    "pyzmq",
    "tqdm",
    "ipython",
    "aiohttp",
    "openai",
    "partial-json-parser",
    "regex",
    "apache-tvm-ffi",
    "transformers==5.19.0",
    "tokenizers",
]
START_TITO = "import sys; from tito_rl.main import main; sys.exit(main())"
# The full install's tito: sglang/__init__.py (the serving runtime) runs where its parsers are first loaded,
# as `from sglang.srt... import` did before sglang_loader: after the tokenizer, inside the server's start-up.
START_TITO_WITH_RUNTIME = (
    """
import tito_rl.trajectory.adapters.parsing.sglang_loader as loader
bare_package = loader._bare_package
def with_runtime(name):
    import sglang  # noqa: F401
    return bare_package(name)
loader._bare_package = with_runtime
"""
    + START_TITO
)


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
    proc = subprocess.Popen(
        [str(python), "-c", start, "serve", "--engine", engine, "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while proc.poll() is None and time.perf_counter() - t0 < 180:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/messages",
                data=body,
                method="POST",
                headers={"content-type": "application/json"},
            )
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


@dataclass
class Figures:
    """One run's measurements; `lean` and `full` key every dict."""

    size_gib: dict[str, float]
    install_s: dict[str, float]
    reply_s: dict[str, list[float]]
    steal_pct: float  # the most any one CPU was stolen in any phase
    load: float  # the highest 1-minute load average seen at a phase's start
    cores: int

    def reply(self, name: str) -> float:
        return statistics.median(self.reply_s[name])

    def markdown(self) -> str:
        """The lines between the README's install-figures markers."""
        lean_gib, full_gib = self.size_gib["lean"], self.size_gib["full"]
        lean_i, full_i = self.install_s["lean"], self.install_s["full"]
        lean_r, full_r = self.reply("lean"), self.reply("full")
        rounds = len(self.reply_s["lean"])
        text = (
            "Measured against the full install (sglang's runtime, torch and triton) in the same run: "
            f"installed size **{lean_gib:.2f} GiB** vs {full_gib:.2f} GiB ({lean_gib / full_gib:.2f}x); "
            f"install time **{lean_i:.0f} s** vs {full_i:.0f} s ({lean_i / full_i:.2f}x; each built once before, "
            f"untimed); from process start to the first parsed tool-call reply **{lean_r:.2f} s** vs "
            f"{full_r:.2f} s ({lean_r / full_r:.2f}x, {full_r / lean_r:.1f}x sooner; median of {rounds}). "
            f"`benchmarks/bench_install.py`, {self.cores} cores, host steal up to {self.steal_pct:.1f}%, "
            f"load average up to {self.load:.2f}."
        )
        return textwrap.fill(text, width=110, break_long_words=False, break_on_hyphens=False)


def write_figures(block: str) -> None:
    """Replace the lines between the markers in each of FIGURE_FILES that holds them."""
    for name in FIGURE_FILES:
        path = ROOT / name
        text = path.read_text() if path.is_file() else ""
        if START_MARK not in text or END_MARK not in text:
            print(f"{name}: no {START_MARK} ... {END_MARK} lines, not written")
            continue
        head, rest = text.split(START_MARK, 1)
        _, tail = rest.split(END_MARK, 1)
        path.write_text(f"{head}{START_MARK}\n{block}\n{END_MARK}{tail}")
        print(f"{name}: figures written")


def _load() -> float:
    return os.getloadavg()[0]


def measure(tmp: Path) -> Figures:
    venvs = {"lean": tmp / "lean", "full": tmp / "full"}
    builders = {"lean": build_lean, "full": build_full}
    size: dict[str, float] = {}
    install_s: dict[str, float] = {}
    reply_s: dict[str, list[float]] = {"lean": [], "full": []}
    steal: list[float] = []
    loads = [_load()]
    cache = _pip_cache()
    print(f"load average before the run: {loads[0]:.2f} (1 min), {os.cpu_count()} cores", flush=True)
    for name in ("lean", "full"):
        builders[name](venvs[name], tmp / f"{name}-warm-up.log")  # fills pip's cache and the OS file cache
        shutil.rmtree(venvs[name])
        print(f"{name}: warm-up install done", flush=True)
    for name in ("lean", "full"):
        loads.append(_load())
        cache_before = disk_usage(cache) if cache.is_dir() else 0
        with steal_watch(steal):
            t0 = time.perf_counter()
            builders[name](venvs[name], tmp / f"{name}.log")
            install_s[name] = time.perf_counter() - t0
        size[name] = disk_usage(venvs[name]) / GIB
        cache_growth = ((disk_usage(cache) if cache.is_dir() else 0) - cache_before) / (1 << 20)
        print(
            f"{name}: installed {size[name]:.2f} GiB in {install_s[name]:.0f} s (pip cache grew "
            f"{cache_growth:.0f} MiB; host steal up to {steal[-1]:.1f}%, load average {loads[-1]:.2f})",
            flush=True,
        )
    engine_port = free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    fake = subprocess.Popen(
        [sys.executable, "-m", "tito_rl", "fake-engine", "--script", SCRIPT, "--port", str(engine_port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_http(engine + "/health")
        starts = {"lean": START_TITO, "full": START_TITO_WITH_RUNTIME}
        for name in ("lean", "full"):  # warm-up: the OS file cache holds each install from here on
            first_parsed_reply(venvs[name] / "bin" / "python", starts[name], engine)
        loads.append(_load())
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
    print(f"first-reply rounds: host steal up to {steal[-1]:.1f}%, load average {loads[-1]:.2f} at their start")
    return Figures(size, install_s, reply_s, max(steal), max(loads), os.cpu_count() or 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help=f"write the figures between the markers in {' and '.join(FIGURE_FILES)}"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tito-bench-install-"))
    try:
        figures = measure(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lean_r, full_r = figures.reply("lean"), figures.reply("full")
    print(
        f"lean / full: size {figures.size_gib['lean'] / figures.size_gib['full']:.2f}, install time "
        f"{figures.install_s['lean'] / figures.install_s['full']:.2f}, first parsed reply {lean_r / full_r:.2f}"
    )
    block = figures.markdown()
    print(f"{START_MARK}\n{block}\n{END_MARK}")
    if args.write:
        write_figures(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
