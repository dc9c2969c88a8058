"""Soak: `tito record` beside a training run for a long time, against the fake engine with its faults (issue 40.5).

The traffic is `bench_production.py`'s training step (the three agent wires, streamed and not, tool loops of 2 to
40 turns whose tool outputs grow the prompt toward 100k tokens, one session in 16 dropped), played without end at
production concurrency (64 sessions at once) by the scripted client (`recorder/scripted/client.py`) in this
process, each new session a new id. The engine is `tito fake-engine --script` with faults: a restart every
`RESTART_EVERY` engine calls (in-flight work dropped, unhealthy for `RESTART_S`), and per scripted variant one
turn whose first attempt fails: a dropped connection, a 503, or an abort mid-generation. The client re-sends after
an error, as agent CLIs do. The recorder is the real `tito record` process (tito's adapter; `--target double`:
the gateway double of `tests/gateway_double.py`) with rotation (`--rotate-sessions`, `--rotate-bytes`), a cap
(`--max-bytes`) and `--metrics`.

Three phases, each its own recorder and run folder:
1. soak (70% of --duration): the recorder's resident memory (its process and the writer's) sampled every 2 s;
   the trend printed as a ratio: the median of the last quarter over the median of the second (the first is
   warm-up), 1.00 is flat, with the least-squares slope over the second half; the same for turns/s (no slowdown).
   Then a graceful stop, and the folder read with tito's reader: every cassette opens and is closed (indexed),
   every session the client saw finish is present exactly once with its samples, no answered turn missing,
   each cassette within its rotation (at most N sessions; sealed at N sessions or SIZE bytes).
2. cap (15%): a small `--max-bytes`: said once on stderr, the bytes on disk at most the cap plus the record
   that crossed it and the indexes, every cassette closed, and the proxy still serving: sessions finish after
   the cap with no client error.
3. kill -9 (15%) at a seeded random moment: first of `tito record` alone (its writer drains the pipe and closes
   every cassette), then of the recorder and its writer at once (the last cassettes cut mid-frame: the reader
   recovers what was fully written). Afterwards every cassette opens; the turns lost (answered to the client,
   missing from the folder) are at most the turns in flight at the kill, counted on the client's side, and every
   session the client saw finish is present.

Every figure is printed with the host steal and load average beside it; a failed check prints `FAILED` and the
exit status is 1. The figures in benchmarks/README.md come from a run of at least 25 minutes:

    nice -n 10 .venv/bin/python benchmarks/bench_soak.py [--duration 240] [--seed 40] [--target tito|double]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_production import CONCURRENCY, CONTEXT, free_port, scenario, wait_for  # noqa: E402
from host_steal import steal_ticks  # noqa: E402

from tito_rl.cassette.reader import CassetteReader, StoredSessions, open_cassette  # noqa: E402
from tito_rl.recorder.scripted.client import SessionRunner  # noqa: E402
from tito_rl.recorder.scripted.script import RETRY_STATUSES, ClientSession, parse_client_script  # noqa: E402
from tito_rl.trajectory.adapters.session import session_digest  # noqa: E402
from tito_rl.trajectory.runtime.allocator import TRIM_ENV  # noqa: E402
from tito_rl.trajectory.runtime.allocator import trim_every_s as trim_period  # noqa: E402

TEMPLATES = 2048  # bench_production's sessions, played in turn with fresh ids
RESTART_EVERY = 1500  # engine calls between restarts
RESTART_S = 1.0
RETRIES, RETRY_DELAY_MS = 12, 400.0  # outlasts a restart
ROTATE_SESSIONS, ROTATE_BYTES = 200, 24 << 20
SOAK_MAX_BYTES = 64 << 30  # never reached in the soak: the cap phase has its own
CAP_BYTES = 12 << 20
SAMPLE_S = 2.0


# ---------------------------------------------------------------------------------------------- the traffic


def engine_script() -> dict[str, Any]:
    """bench_production's engine script with one faulted turn per variant (first attempt only)."""
    spec = scenario(TEMPLATES)
    for variant in spec["sessions"]:
        turns = variant["turns"]
        t, j = len(turns), len(turns) // 2
        kind = t % 4
        if kind == 0:
            turns[j]["faults"], turns[j]["fault_attempts"] = {"drop_connection": True}, 1
        elif kind == 1:
            turns[j]["faults"], turns[j]["fault_attempts"] = {"status": 503}, 1
        elif kind == 2:
            turns[j]["finish"], turns[j]["length"], turns[j]["fault_attempts"] = "abort", 6, 1
    return spec


def templates(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(s, retries=RETRIES, retry_delay_ms=RETRY_DELAY_MS) for s in spec["client"]["sessions"]]


def session_for(template: dict[str, Any], name: str) -> ClientSession:
    """The template's session under a new id, its task naming it (every prompt its own)."""
    steps = [dict(s) for s in template["steps"]]
    steps[0]["prompt"] = f"Task {name}: read every part of the project and report."
    script = parse_client_script({"sessions": [dict(template, id=name, steps=steps)]})
    return script.sessions[0]


@dataclass
class ClientCounts:
    """What the client saw, per session: the agent-route answers it got (any status), its finish, failures."""

    answered: dict[str, int] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)  # requests sent, no answer yet
    turns_live: int = 0  # model turns begun and not ended (retry waits included)
    finished: dict[str, float] = field(default_factory=dict)  # session -> when its finish was answered
    dropped: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)
    started: int = 0
    began: dict[str, float] = field(default_factory=dict)  # session -> when its first request was sent
    turns_done: int = 0
    stopped: bool = False  # after a kill: what happens later is not counted

    def in_flight(self) -> int:
        return sum(self.pending.values())


class CountingRunner(SessionRunner):
    """The scripted client, counting each answer it reads and each request still waiting for one."""

    counts: ClientCounts

    async def send(self, body: bytes) -> bytes:
        c, sid = self.counts, self.session.id
        url = self.base_url + self.session.prefix + self.wire.path
        for attempt in range(self.session.retries + 1):
            self.result.sent += 1
            c.pending[sid] = c.pending.get(sid, 0) + 1
            c.began.setdefault(sid, time.monotonic())
            try:
                async with self.http.post(url, data=body, headers=self.headers) as resp:
                    raw, status = await resp.read(), resp.status
            finally:
                if not c.stopped:
                    c.pending[sid] -= 1
            if c.stopped:
                raise asyncio.CancelledError
            c.answered[sid] = c.answered.get(sid, 0) + 1
            if status == 200:
                return raw
            if status not in RETRY_STATUSES or attempt == self.session.retries:
                from tito_rl.recorder.scripted.client import ScriptError

                raise ScriptError(f"{self.wire.path} answered {status}: {raw[:300]!r}")
            self.result.retries += 1
            await asyncio.sleep(self.session.retry_delay_ms / 1000)
        raise AssertionError("unreachable")

    async def model_turn(self, conv: Any) -> Any:
        self.counts.turns_live += 1
        try:
            reply = await super().model_turn(conv)
        finally:
            if not self.counts.stopped:
                self.counts.turns_live -= 1
        if not self.counts.stopped:
            self.counts.turns_done += 1
        return reply


async def drive(
    base_url: str, tmpl: list[dict[str, Any]], prefix: str, counts: ClientCounts, stop: asyncio.Event
) -> None:
    """CONCURRENCY workers, each starting a new session when its last ends, until `stop` is set; the sessions
    already begun run to their end (cancel the task to cut them)."""
    import aiohttp

    number = iter(range(10**9))

    async def worker(http: aiohttp.ClientSession) -> None:
        while not stop.is_set():
            n = next(number)
            name = f"{prefix}-{n:06d}"
            runner = CountingRunner(http, base_url, session_for(tmpl[n % len(tmpl)], name))
            runner.counts = counts
            counts.started += 1
            result = await runner.run()
            if counts.stopped:
                return
            if result.error is not None:
                counts.failed[name] = result.error
            elif result.dropped:
                counts.dropped.add(name)
            elif result.samples is not None:
                counts.finished[name] = time.monotonic()

    timeout = aiohttp.ClientTimeout(total=900)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        await asyncio.gather(*(worker(http) for _ in range(CONCURRENCY)))


# ---------------------------------------------------------------------------------------------- processes


def tito_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tito_rl", *args]


def children(pid: int) -> list[int]:
    try:
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    except OSError:
        return []


def rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Recorder:
    """A `tito record` process (the proxy) and its writer child; stderr kept, read on a thread."""

    def __init__(self, engine: str, out: Path, target: str, max_bytes: int, env: dict[str, str] | None = None) -> None:
        self.port, self.metrics_port = free_port(), free_port()
        args = [
            "record",
            "--engine",
            engine,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--out",
            str(out),
            "--rotate-sessions",
            str(ROTATE_SESSIONS),
            "--rotate-bytes",
            str(ROTATE_BYTES),
            "--max-bytes",
            str(max_bytes),
            "--metrics",
            f"127.0.0.1:{self.metrics_port}",
            "--context-length",
            str(CONTEXT),
            "--quiet",
        ]
        if target == "double":
            args += ["--target", "tests.gateway_double:create"]
        cmd = tito_cmd(*args)
        if os.environ.get("SOAK_WRAP"):  # a diagnostic wrapper in place of `-m tito_rl`
            cmd[1:3] = [os.environ["SOAK_WRAP"]]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        wait_for(f"http://127.0.0.1:{self.port}/health")
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip()))

    def writer(self) -> int | None:
        kids = children(self.proc.pid)
        return kids[0] if kids else None

    def memory(self) -> tuple[int, int]:
        w = self.writer()
        return rss(self.proc.pid), rss(w) if w else 0

    def metrics(self) -> dict[str, float]:
        """The scrape's unlabelled-by-kind totals, summed over labels."""
        out: dict[str, float] = {}
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("#") or not line.strip():
                    continue
                name, _, value = line.rpartition(" ")
                base = name.split("{", 1)[0]
                out[base] = out.get(base, 0.0) + float(value)
        return out

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=10)
        return code


def start_engine(script: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        tito_cmd(
            "fake-engine",
            "--script",
            str(script),
            "--listen",
            f"127.0.0.1:{port}",
            "--context-length",
            str(CONTEXT),
            "--fault-restart-s",
            str(RESTART_S),
            "--fault-every",
            str(RESTART_EVERY),
        ),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(url + "/health")
    return proc, url


# ---------------------------------------------------------------------------------------------- the folder


@dataclass
class Part:
    path: Path
    size: int
    indexed: bool  # closed cleanly: its index stored at the end
    truncated: bool  # cut mid-frame (read up to the last whole frame)
    sessions: dict[str, tuple[int, int]]  # session -> (agent exchanges, samples)
    error: str | None = None


def read_folder(folder: Path) -> list[Part]:
    parts = []
    for path in sorted(folder.glob("part-*.tito")):
        try:
            with CassetteReader(path) as reader:
                indexed = reader.stored_index() is not None
            cassette = open_cassette(path, verify=True)
            assert isinstance(cassette.sessions, StoredSessions)
            sessions = {n: (e.agent, e.samples) for n, e in cassette.sessions.index.items()}
            parts.append(Part(path, path.stat().st_size, indexed, cassette.truncated, sessions))
        except Exception as exc:  # noqa: BLE001 - a cassette that does not open is the finding
            parts.append(Part(path, path.stat().st_size, False, False, {}, f"{type(exc).__name__}: {exc}"))
    return parts


@dataclass
class Checks:
    failures: list[str] = field(default_factory=list)

    def check(self, ok: bool, what: str) -> None:
        print(f"  {'ok' if ok else 'FAILED'}: {what}")
        if not ok:
            self.failures.append(what)


def where(parts: list[Part]) -> dict[str, list[Part]]:
    found: dict[str, list[Part]] = {}
    for part in parts:
        for name in part.sessions:
            found.setdefault(name, []).append(part)
    return found


def check_sessions(checks: Checks, parts: list[Part], counts: ClientCounts, finished: set[str]) -> int:
    """Every session in `finished` present exactly once with samples; returns the answered turns missing."""
    found = where(parts)  # the cassette names a session by its bearer token's digest
    missing = [n for n in finished if not any(p.sessions[d][1] for d in [session_digest(n)] for p in found.get(d, []))]
    twice = [n for n, ps in found.items() if len(ps) > 1]
    checks.check(
        not missing,
        f"every session the client saw finish is present with its samples ({len(finished)} sessions"
        + (f"; missing: {sorted(missing)[:5]}" if missing else "")
        + ")",
    )
    checks.check(not twice, f"no session in two cassettes ({len(twice)} found: {sorted(twice)[:5]})")
    lost = 0
    for name, answered in counts.answered.items():
        digest = session_digest(name)
        recorded = sum(p.sessions[digest][0] for p in found.get(digest, []))
        lost += max(0, answered - recorded)
    return lost


# ---------------------------------------------------------------------------------------------- phases


@dataclass
class Host:
    """Steal and load over a phase."""

    ticks: dict[str, int] = field(default_factory=steal_ticks)
    t0: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        after, wall = steal_ticks(), time.monotonic() - self.t0
        ticks = max((after[c] - self.ticks.get(c, after[c]) for c in after), default=0)
        steal = 100 * ticks / os.sysconf("SC_CLK_TCK") / max(wall, 1e-9)
        return f"host steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}"


def run_client(
    url: str, tmpl: list[dict[str, Any]], prefix: str, counts: ClientCounts, seconds: float, tick: Callable[[], None]
) -> None:
    """Drive for `seconds`, calling `tick` every SAMPLE_S; then let the sessions begun end."""

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(drive(url, tmpl, prefix, counts, stop))
        end = time.monotonic() + seconds
        while time.monotonic() < end and not task.done():
            tick()
            await asyncio.sleep(SAMPLE_S)
        stop.set()
        while not task.done():  # the sessions begun run to their end, still sampled
            tick()
            await asyncio.wait({task}, timeout=SAMPLE_S)
        task.result()

    asyncio.run(main())


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (y per unit x)."""
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    den = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / den if den else 0.0


def quarter_ratio(samples: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Median of the last quarter, of the second, and their ratio."""
    n = len(samples)
    q2 = [v for _, v in samples[n // 4 : n // 2]] or [samples[0][1]]
    q4 = [v for _, v in samples[3 * n // 4 :]] or [samples[-1][1]]
    a, b = statistics.median(q2), statistics.median(q4)
    return a, b, (b / a if a else float("nan"))


def phase_soak(engine: str, work: Path, tmpl: list[dict[str, Any]], seconds: float, target: str) -> Checks:
    checks, host = Checks(), Host()
    folder = work / "soak"
    rec = Recorder(engine, folder, target, SOAK_MAX_BYTES)
    counts = ClientCounts()
    t0 = time.monotonic()
    mem: list[tuple[float, int, int]] = []
    rate: list[tuple[float, int]] = []

    def tick() -> None:
        proxy, writer = rec.memory()
        now = time.monotonic() - t0
        mem.append((now, proxy, writer))
        rate.append((now, counts.turns_done))

    run_client(rec.url, tmpl, "soak", counts, seconds, tick)
    scraped = rec.metrics()
    code = rec.stop()
    wall = time.monotonic() - t0
    print(
        f"soak: {wall:.0f} s, {counts.started} sessions ({len(counts.finished)} finished, {len(counts.dropped)} "
        f"dropped, {len(counts.failed)} failed), {counts.turns_done} turns, {sum(counts.answered.values())} agent "
        f"answers; {host.line()}"
    )
    for label, col in (("proxy", 1), ("writer", 2)):
        series = [(t, float(m[col])) for m in mem for t in (m[0],)]
        a, b, ratio = quarter_ratio(series)
        half = series[len(series) // 2 :]
        per_h = slope(half) * 3600 / 2**20
        print(
            f"  {label} RSS: {series[0][1] / 2**20:.0f} MiB at start, median {a / 2**20:.0f} MiB in the second "
            f"quarter, {b / 2**20:.0f} MiB in the last: ratio {ratio:.3f} (1.00: flat); slope over the second half "
            f"{per_h:+.1f} MiB/h; peak {max(v for _, v in series) / 2**20:.0f} MiB"
        )
    turns_q = [
        (rate[i][0], (rate[i][1] - rate[i - 1][1]) / max(rate[i][0] - rate[i - 1][0], 1e-9))
        for i in range(1, len(rate))
    ]
    # only while the workers were still starting sessions (the tail is the drain)
    turns_q = [p for p in turns_q if p[0] <= seconds]
    if len(turns_q) >= 4:
        a, b, ratio = quarter_ratio(turns_q)
        print(f"  turns/s: median {a:.1f} in the second quarter, {b:.1f} in the last: ratio {ratio:.2f}")
    print(
        f"  metrics at the end: sessions seen {scraped.get('tito_record_sessions_seen_total', 0):.0f}, recorded "
        f"{scraped.get('tito_record_sessions_recorded_total', 0):.0f}, turns seen "
        f"{scraped.get('tito_record_turns_seen_total', 0):.0f}, bytes written "
        f"{scraped.get('tito_record_written_bytes_total', 0) / 2**20:.0f} MiB"
    )
    checks.check(code == 0, f"tito record stopped by SIGINT exits 0 (got {code})")
    checks.check(not counts.failed, f"no client session failed ({sorted(counts.failed.items())[:3]})")
    parts = read_folder(folder)
    bad = [p for p in parts if p.error or not p.indexed or p.truncated]
    checks.check(
        not bad,
        f"all {len(parts)} cassettes open, closed with their index ({[(p.path.name, p.error) for p in bad][:3]})",
    )
    lost = check_sessions(checks, parts, counts, set(counts.finished))
    checks.check(lost == 0, f"every agent answer the client got is recorded ({lost} missing)")
    over = [p.path.name for p in parts if len(p.sessions) > ROTATE_SESSIONS]
    checks.check(not over, f"at most {ROTATE_SESSIONS} sessions a cassette ({over[:3]})")
    sealed = parts[:-5] if len(parts) > 5 else []
    early = [p.path.name for p in sealed if len(p.sessions) < ROTATE_SESSIONS and p.size < ROTATE_BYTES]
    checks.check(
        not early, f"each sealed cassette reached {ROTATE_SESSIONS} sessions or {ROTATE_BYTES >> 20} MiB ({early[:3]})"
    )
    if parts:
        print(
            f"  {len(parts)} cassettes, {sum(p.size for p in parts) / 2**20:.0f} MiB; sessions a cassette "
            f"{min(len(p.sessions) for p in parts)}-{max(len(p.sessions) for p in parts)}, largest "
            f"{max(p.size for p in parts) / 2**20:.1f} MiB ({max(p.size for p in parts) / ROTATE_BYTES:.2f}x "
            "--rotate-bytes)"
        )
    return checks


def phase_rounds(
    engine: str, work: Path, tmpl: list[dict[str, Any]], rounds: int, seconds: float, target: str
) -> Checks:
    """What the proxy keeps once its sessions have ended: `rounds` rounds of `seconds` of traffic, each drained
    (every session begun runs to its end), then a pause past the trim period, and the proxy's resident memory
    taken; once with malloc's free memory trimmed (`trajectory/runtime/allocator.py`, the default) and once with
    `TITO_MALLOC_TRIM_S=0` in the same run, the baseline."""
    checks, host = Checks(), Host()
    settle = trim_period() + 5.0
    after: dict[str, list[int]] = {}
    for label, env in (("not trimmed", {TRIM_ENV: "0"}), ("trimmed", {})):
        rec = Recorder(engine, work / f"rounds-{label.replace(' ', '-')}", target, SOAK_MAX_BYTES, env)
        start = rec.memory()[0]
        series = after[label] = []
        for r in range(rounds):
            counts = ClientCounts()
            run_client(rec.url, tmpl, f"round{r}-{label[:3]}", counts, seconds, lambda: None)
            checks.check(not counts.failed, f"{label}, round {r + 1}: no client session failed")
            time.sleep(settle)
            series.append(rec.memory()[0])
        rec.stop()
        shown = ", ".join(f"{v / 2**20:.0f}" for v in series)
        print(
            f"rounds, {label}: proxy RSS {start / 2**20:.0f} MiB at start; after each of {rounds} drained rounds of "
            f"{seconds:.0f} s ({settle:.0f} s after the drain): {shown} MiB; last / first "
            f"{series[-1] / series[0]:.2f}; {host.line()}"
        )
    trimmed, kept = after["trimmed"], after["not trimmed"]
    print(
        f"  after the last round, trimmed / not trimmed: {trimmed[-1] / kept[-1]:.2f}; growth from the first round "
        f"to the last: {(trimmed[-1] - trimmed[0]) / 2**20:+.0f} MiB trimmed, {(kept[-1] - kept[0]) / 2**20:+.0f} "
        "MiB not"
    )
    checks.check(trimmed[-1] < kept[-1], "a trimmed proxy holds less after its sessions end than one not trimmed")
    return checks


def phase_cap(engine: str, work: Path, tmpl: list[dict[str, Any]], seconds: float, target: str) -> Checks:
    checks, host = Checks(), Host()
    folder = work / "cap"
    rec = Recorder(engine, folder, target, CAP_BYTES)
    counts = ClientCounts()
    run_client(rec.url, tmpl, "cap", counts, seconds, lambda: None)
    scraped = rec.metrics()
    code = rec.stop()
    said = [(t, line) for t, line in rec.lines if "--max-bytes" in line and "reached" in line]
    print(
        f"cap: {counts.started} sessions ({len(counts.finished)} finished, {len(counts.failed)} failed), cap "
        f"{CAP_BYTES >> 20} MiB; {host.line()}"
    )
    checks.check(len(said) == 1, f"the cap is said once on stderr ({len(said)} times)")
    after = [n for n, t in counts.finished.items() if said and t > said[0][0]]
    checks.check(bool(after), f"the proxy keeps serving past the cap: {len(after)} sessions finished after it")
    checks.check(not counts.failed, f"no client session failed ({sorted(counts.failed.items())[:3]})")
    checks.check(code == 0, f"tito record stopped by SIGINT exits 0 (got {code})")
    checks.check(scraped.get("tito_record_capped", 0) == 1, "tito_record_capped is 1")
    parts = read_folder(folder)
    bad = [p for p in parts if p.error or not p.indexed]
    checks.check(
        not bad,
        f"all {len(parts)} cassettes open, closed with their index ({[(p.path.name, p.error) for p in bad][:3]})",
    )
    total = sum(p.size for p in parts)
    recorded = set(where(parts))
    print(
        f"  {total} bytes on disk in {len(parts)} cassettes ({total / CAP_BYTES:.3f}x the cap); "
        f"{len(recorded)} sessions recorded of {counts.started} served"
    )
    # past the cap: at most one record and each open cassette's index; a record here is under 2 MiB
    checks.check(total <= CAP_BYTES + (2 << 20), f"bytes on disk within the cap and one record ({total})")
    cap_at = said[0][0] if said else float("inf")
    with_samples = {n for p in parts for n, (_, samples) in p.sessions.items() if samples}
    late_finish = [n for n, t in counts.finished.items() if t > cap_at and session_digest(n) in with_samples]
    checks.check(not late_finish, f"no session finished after the cap has its finish recorded ({late_finish[:3]})")
    late_begin = [n for n, t in counts.began.items() if t > cap_at]
    late_found = [n for n in late_begin if session_digest(n) in recorded]
    checks.check(
        bool(late_begin) and not late_found,
        f"sessions begun after the cap are served and not recorded ({len(late_begin)} begun, {len(late_found)} found)",
    )
    twice = [n for n, ps in where(parts).items() if len(ps) > 1]
    checks.check(not twice, f"no session in two cassettes ({twice[:3]})")
    return checks


def phase_kill(
    engine: str, work: Path, tmpl: list[dict[str, Any]], seconds: float, target: str, rng: random.Random, both: bool
) -> Checks:
    checks, host = Checks(), Host()
    name = "kill-both" if both else "kill"
    folder = work / name
    rec = Recorder(engine, folder, target, SOAK_MAX_BYTES)
    counts = ClientCounts()
    at = rng.uniform(0.3, 0.9) * seconds
    snapshot: dict[str, Any] = {}

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(drive(rec.url, tmpl, name, counts, stop))
        await asyncio.sleep(at)
        writer = rec.writer()
        # the client's view at the kill, taken with nothing else running on this loop
        counts.stopped = True
        snapshot.update(
            in_flight=counts.in_flight(),
            turns_live=counts.turns_live,
            answered=dict(counts.answered),
            finished=set(counts.finished),
            writer=writer,
        )
        if both and writer:
            os.kill(writer, signal.SIGKILL)
        os.kill(rec.proc.pid, signal.SIGKILL)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):  # the client's sessions end with the proxy
            await task

    asyncio.run(main())
    rec.proc.wait()
    writer = snapshot["writer"]
    deadline = time.monotonic() + 120
    while writer and alive(writer) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = bool(writer and alive(writer))
    if left:
        os.kill(writer, signal.SIGKILL)
    counts.answered = snapshot["answered"]
    what = "tito record and its writer" if both else "tito record"
    print(
        f"{name}: kill -9 of {what} at {at:.1f} s (seeded), {len(snapshot['answered'])} sessions begun, "
        f"{len(snapshot['finished'])} finished; in flight at the kill: {snapshot['in_flight']} requests "
        f"({snapshot['turns_live']} model turns begun); {host.line()}"
    )
    checks.check(not left, "the writer exits by itself after the kill")
    parts = read_folder(folder)
    bad = [p for p in parts if p.error]
    checks.check(not bad, f"all {len(parts)} cassettes open ({[(p.path.name, p.error) for p in bad][:3]})")
    if not both:
        open_ = [p.path.name for p in parts if not p.indexed]
        checks.check(not open_, f"the writer closed every cassette with its index ({open_[:3]})")
    else:
        print(
            f"  {sum(not p.indexed for p in parts)} cassettes left without an index, "
            f"{sum(p.truncated for p in parts)} cut mid-frame: read up to their last whole frame"
        )
    lost = check_sessions(checks, parts, counts, snapshot["finished"])
    print(f"  agent answers lost: {lost}, requests in flight at the kill: {snapshot['in_flight']}")
    checks.check(lost <= snapshot["in_flight"], "the turns lost are at most the turns in flight")
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=240.0, help="seconds in all (default 240)")
    parser.add_argument("--seed", type=int, default=40, help="picks the kill moments")
    parser.add_argument("--target", choices=("tito", "double"), default="tito")
    parser.add_argument("--keep", type=Path, help="write the run folders here (default: a temp folder, removed)")
    parser.add_argument("--rounds", type=int, default=0, help="drained rounds, trimmed and not (default 0: none)")
    parser.add_argument("--round-s", type=float, default=60.0, help="seconds of traffic in a round (default 60)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    spec = engine_script()
    tmpl = templates(spec)
    with tempfile.TemporaryDirectory(prefix="tito-soak-") as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        script = work / "scenario.json"
        script.write_text(json.dumps({k: v for k, v in spec.items() if k != "client"}))
        engine, url = start_engine(script)
        print(
            f"soak: {args.duration:.0f} s, {CONCURRENCY} sessions at once, target {args.target}, rotation every "
            f"{ROTATE_SESSIONS} sessions or {ROTATE_BYTES >> 20} MiB, engine restart every {RESTART_EVERY} calls; "
            f"load average {os.getloadavg()[0]:.2f} at start"
        )
        failures: list[str] = []
        try:
            d = args.duration
            if args.rounds:
                failures += phase_rounds(url, work, tmpl, args.rounds, args.round_s, args.target).failures
            failures += phase_soak(url, work, tmpl, 0.7 * d, args.target).failures
            failures += phase_cap(url, work, tmpl, max(30.0, 0.15 * d), args.target).failures
            kill_s = max(30.0, 0.075 * d)
            failures += phase_kill(url, work, tmpl, kill_s, args.target, rng, both=False).failures
            failures += phase_kill(url, work, tmpl, kill_s, args.target, rng, both=True).failures
            print(f"fake engine RSS at the end: {rss(engine.pid) / 2**20:.0f} MiB")
        finally:
            engine.terminate()
            engine.wait()
    print(f"soak: {len(failures)} check(s) failed" + (": " + "; ".join(failures) if failures else ""))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
