"""Production-size cassettes: a training step's traffic, recorded through `tito record`, then replayed.

The cassette is generated once and cached outside git (`$TITO_BENCH_CACHE`, default `~/.cache/tito-bench`),
keyed by its scenario's digest: 2,048 sessions, 64 at a time, on the three agent wires (Anthropic Messages,
Chat Completions, Responses; streamed or not), each a tool loop of 2 to 40 model turns (most of them short, as
agent episodes are) whose generated tool outputs (different per session and call) grow the prompt toward 100k
tokens; one session in 16 is dropped instead of finished. `tito fake-engine --script` plays the model and
`tito record --agent scripted` the client (`client.concurrency: 64`). Its golden is written once by
`tito replay -j 2 --update-goldens`.

Then each figure against its baseline, measured in this run, with the host steal beside it:
- `tito replay` of the whole cassette with `-j 1` (sessions/s, peak memory), and with `-j 2`: the ratio is the
  scaling on this machine's 2 cores;
- memory against size: the first 512 and 1,024 sessions cut into cassettes of their own (goldens sliced from the
  whole one's) and replayed with `-j 1`: peak memory per cassette size, as a ratio to the smallest;
- `tito cassette info` and `tito inspect --session` (the cassette's longest session, and its median one) on the
  whole cassette, against the same commands on a cassette holding only that session: the ratio says what finding
  it costs; the floor (Python start and the `tokenizers` load) is printed beside them (`--lookups-only`: these alone).
  They run with the parser helper on (`TITO_PARSER_HELPER=1`), as a quiet host's load average starts it.
Peak memory is the PSS of the process and its workers (shared pages counted once), sampled every 50 ms.

    .venv/bin/python benchmarks/bench_production.py [--sessions 2048] [--generate-only | --lookups-only]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_steal import parallel_capacity, steal_watch  # noqa: E402

WIRES = ("anthropic", "chat", "responses")
CONTEXT = 262_144
# Lines of generated output per tool call: PROMPT_GOAL / (TOKENS_A_LINE * turns). The lines take about 16 tokens,
# not 14, so the longest session's last prompt is 109k tokens; kept as they are, since they key the cached cassette.
TOKENS_A_LINE = 14
PROMPT_GOAL = 95_000
CONCURRENCY = 64


def scenario(sessions: int, seed: int = 23) -> dict[str, Any]:
    """Both sides: the engine's turns per variant (turn count), and the client's sessions."""
    rng = random.Random(seed)
    turns_of = [2 + int(38 * rng.random() ** 2) for _ in range(sessions)]
    variants = sorted(set(turns_of))
    engine = [
        {
            "match": {"prompt_contains": f"Variant T={t:02d}."},
            "turns": [
                {
                    "reasoning": f"Step {k}: part {k} is next; I read it before going on.",
                    "text": f"Reading part {k}.",
                    "tool_calls": [
                        {
                            "name": "shell",
                            "arguments": {"command": f"cat src/part_{k}.py", "description": f"Read part {k}"},
                        }
                    ],
                }
                for k in range(t - 1)
            ]
            + [{"reasoning": "Every part is read.", "text": f"All {t - 1} parts read; done."}],
        }
        for t in variants
    ]
    clients = []
    for i, t in enumerate(turns_of):
        lines = min(200, PROMPT_GOAL // (TOKENS_A_LINE * t))
        end = {"drop": True} if i % 16 == 15 else {"finish": 1.0}
        clients.append(
            {
                "id": f"prod-{i:04d}",
                "wire": WIRES[i % 3],
                "stream": i % 2 == 0,
                "system": f"You are a coding agent working in /work. Variant T={t:02d}.",
                "tools": ["Bash", "Read"],
                "results": {"Bash": {"lines": lines}},
                "steps": [{"prompt": f"Task {i}: read every part of the project and report.", "max_turns": 40}, end],
            }
        )
    return {
        "name": "production_step",
        "after_last": "error",
        "sessions": engine,
        "client": {"concurrency": CONCURRENCY, "sessions": clients},
    }


def cache_dir(spec: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(os.environ.get("TITO_BENCH_CACHE", Path.home() / ".cache" / "tito-bench"))
    folder = root / f"production-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def tito(*args: str, **kwargs: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tito_rl", *args], cwd=ROOT, **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout_s: float = 120.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(url)


def record(folder: Path, spec: dict[str, Any], engine_args: tuple[str, ...] = ()) -> Path:
    """The cassette, recorded unless cached; its golden, written unless cached. `engine_args`: the fake engine's
    extra flags (`--enable-return-routed-experts` for a spec with `moe:`; part of the cache key through the spec)."""
    cassette, script = folder / "production.tito", folder / "scenario.json"
    if not cassette.is_file():
        script.write_text(json.dumps(spec))
        partial = folder / "recording.tito"
        partial.unlink(missing_ok=True)
        port = free_port()
        engine = tito(
            "fake-engine",
            "--script",
            str(script),
            "--listen",
            f"127.0.0.1:{port}",
            "--context-length",
            str(CONTEXT),
            *engine_args,
            stdout=subprocess.DEVNULL,
        )
        try:
            wait_for(f"http://127.0.0.1:{port}/health")
            started = time.monotonic()
            done = tito(
                "record",
                "--engine",
                f"http://127.0.0.1:{port}",
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--out",
                str(partial),
                "--agent",
                "scripted",
                "--scenario",
                str(script),
                "--quiet",
                "--context-length",
                str(CONTEXT),
                "--agent-timeout",
                "600",
                stderr=subprocess.PIPE,
            ).communicate()[1]
            failed = [line for line in done.decode().splitlines() if "FAILED" in line]
            assert not failed, failed[:5]
            print(f"recorded {len(spec['client']['sessions'])} sessions in {time.monotonic() - started:.0f} s")
        finally:
            engine.terminate()
            engine.wait()
        partial.rename(cassette)
    if not cassette.with_suffix(".golden").is_file():
        run = subprocess.run(
            [sys.executable, "-m", "tito_rl", "replay", str(cassette), "-j", "2", "--update-goldens"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return cassette


def cut_with_golden(cassette: Path, out: Path, sessions: list[str]) -> Path:
    """The named sessions in a cassette of their own, their golden sections sliced from the whole one's."""
    from tito_rl.replayer.cassette_tools.cut_merge import cut
    from tito_rl.replayer.goldens import files as goldens

    if not out.is_file():
        cut(cassette, out, sessions)
        _, sections = goldens.parse(goldens.golden_path(cassette).read_text(encoding="utf-8"))
        goldens.golden_path(out).write_text(goldens.compose(out, sections, sorted(sessions)), encoding="utf-8")
    return out


class PeakRss:
    """Samples the memory of a process and its children every 50 ms: the peak of their summed PSS (pages shared by
    forked workers counted once) and the largest RSS of one of them."""

    def __init__(self, pid: int) -> None:
        self.pid, self.total, self.largest = pid, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            pids = [self.pid, *_children(self.pid)]
            self.total = max(self.total, sum(_memory(p, "Pss:", "smaps_rollup") for p in pids))
            self.largest = max(self.largest, *(_memory(p, "VmRSS:", "status") for p in pids))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    except OSError:
        return []


def _memory(pid: int, key: str, file: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def timed(*args: str) -> tuple[float, PeakRss, str]:
    """Wall seconds, peak memory and stdout of a `tito` command (exit 0 expected)."""
    started = time.perf_counter()
    proc = tito(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = PeakRss(proc.pid)
    out, err = proc.communicate()
    elapsed = time.perf_counter() - started
    peak.stop()
    assert proc.returncode == 0, (args, out.decode()[-2000:], err.decode()[-2000:])
    return elapsed, peak, out.decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2048)
    parser.add_argument(
        "--generate-only",
        action="store_true",
        help="record the cassette and write its golden into the cache, measure nothing",
    )
    parser.add_argument(
        "--lookups-only",
        action="store_true",
        help="measure `cassette info` and `inspect --session` alone (no whole-cassette replays)",
    )
    args = parser.parse_args()
    spec = scenario(args.sessions)
    folder = cache_dir(spec)
    cassette = record(folder, spec)
    if args.generate_only:
        print(cassette)
        return

    from tito_rl.cassette.reader import StoredSessions, open_cassette

    sessions = open_cassette(cassette, verify=False).sessions
    assert isinstance(sessions, StoredSessions)  # an indexed cassette's, read lazily
    index = sessions.index
    names = list(index)
    by_length = sorted(names, key=lambda n: (index[n].agent, n))
    longest, median = by_length[-1], by_length[len(by_length) // 2]
    exchanges = sum(e.agent for e in index.values())
    mib = cassette.stat().st_size / 2**20
    print(f"cassette: {len(names)} sessions, {exchanges} agent exchanges, {mib:.0f} MiB ({cassette})")
    steal: list[float] = []
    if not args.lookups_only:
        replays(cassette, folder, names, exchanges, steal)
    lookups(cassette, folder, {"longest": longest, "median": median}, index, steal)


def replays(cassette: Path, folder: Path, names: list[str], exchanges: int, steal: list[float]) -> None:
    cuts = {n: cut_with_golden(cassette, folder / f"first-{n}.tito", names[:n]) for n in (512, 1024) if n < len(names)}
    with steal_watch(steal):
        one, one_rss, _ = timed("replay", str(cassette), "-j", "1")
    with steal_watch(steal):
        two, two_rss, _ = timed("replay", str(cassette), "-j", "2")
    print(
        f"replay -j 1: {one:.1f} s, {len(names) / one:.1f} sessions/s, {exchanges / one:.0f} exchanges/s, "
        f"peak memory {one_rss.total / 2**20:.0f} MiB; host steal up to {steal[0]:.1f}%"
    )
    print(
        f"replay -j 2: {two:.1f} s, {len(names) / two:.1f} sessions/s, peak memory {two_rss.total / 2**20:.0f} MiB "
        f"(largest process {two_rss.largest / 2**20:.0f} MiB); host steal up to {steal[1]:.1f}%; "
        f"scaling -j 2 / -j 1: {one / two:.2f}x"
    )

    rows = []
    for n, path in cuts.items():
        with steal_watch(steal):
            _, rss, _ = timed("replay", str(path), "-j", "1")
        rows.append((n, path.stat().st_size, rss.total, steal[-1]))
    rows.append((len(names), cassette.stat().st_size, one_rss.total, steal[0]))
    base_size, base_rss = rows[0][1], rows[0][2]
    for n, size, peak, stolen in rows:
        print(
            f"  {n:5d} sessions: cassette {size / 2**20:6.0f} MiB ({size / base_size:4.2f}x), peak memory "
            f"{peak / 2**20:4.0f} MiB ({peak / base_rss:4.2f}x); host steal up to {stolen:.1f}%"
        )


def lookups(cassette: Path, folder: Path, chosen: dict[str, str], index: Any, steal: list[float]) -> None:
    """`cassette info` and `inspect --session` on the whole cassette against the same on a cassette of that session
    alone (best of 3): what finding it costs. The floor (Python start plus the `tokenizers` load) beside them."""
    # The parser helper starts where the load average leaves a core idle; these back-to-back runs keep the load near
    # 1 or more, where a quiet host's is near 0: measure what the quiet host gets (as bench_corpus.py does).
    os.environ["TITO_PARSER_HELPER"] = "1"
    print(f"floor (Python start and the tokenizers load): {floor_s():.2f} s")
    alone = {kind: cut_with_golden(cassette, folder / f"{kind}-alone.tito", [name]) for kind, name in chosen.items()}
    runs: list[tuple[str, Callable[[Path, str], tuple[str, ...]], str]] = [
        ("info", lambda p, _: ("cassette", "info", str(p)), "longest")
    ]
    runs += [
        (
            f"inspect --session ({kind}: {index[name].agent} exchanges)",
            lambda p, n: ("inspect", str(p), "--session", n),
            kind,
        )
        for kind, name in chosen.items()
    ]
    for label, args_of, kind in runs:
        name = chosen[kind]
        with steal_watch(steal):  # wall time alone: sampling a process's memory takes its page-table lock
            big = min(lookup_s(*args_of(cassette, name)) for _ in range(3))
            small = min(lookup_s(*args_of(alone[kind], name)) for _ in range(3))
        print(
            f"{label}: {big:.2f} s on the whole cassette, {small:.2f} s on its session alone, "
            f"ratio {big / small:.2f}; host steal up to {steal[-1]:.1f}%"
        )
    # inspect runs on both cores (the parser helper, the batch encodes): what the host gives of the second moves it
    print(
        f"two processes at once got {parallel_capacity(sys.executable):.2f}x the work of one done (2.00: two whole "
        "cores)"
    )


def lookup_s(*args: str) -> float:
    from bench_corpus import wall

    return wall([sys.executable, "-m", "tito_rl", *args], ROOT)


def floor_s() -> float:
    """The floor as `bench_corpus.py` defines it, best of 3."""
    from bench_corpus import FLOOR, wall

    return min(wall([sys.executable, "-c", FLOOR], ROOT) for _ in range(3))


if __name__ == "__main__":
    main()
