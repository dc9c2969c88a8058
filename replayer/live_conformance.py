"""`make conformance`, live: the scenario corpus recorded *through* every target present, then audited.

A replay through a gateway sends the recorded agent requests, so every turn after the first echoes the replies of
the gateway that was recorded, not the one under test. Here each scenario's real CLI or scripted client talks to the
target itself (`tito simulate --target`), against the same fake engine and scripted policy, so what the client
echoes and what the gateway trains are the gateway's own. Each recording is then read by `tito audit --json`
(docs/audit.md) and the page gets one table, gateways side by side, between its markers; the findings written
by hand around it are kept. The recordings go to a temporary folder: they are evidence for the table, not corpus.

    python -m tito_rl.replayer.live_conformance                       # every target present, the page rewritten
    python -m tito_rl.replayer.live_conformance --targets tito,rllm --print
    python -m tito_rl.replayer.live_conformance --keep /tmp/live      # keep the recordings and their audits
    python -m tito_rl.replayer.live_conformance --keep /tmp/live --reuse   # record only what is not there yet
    python -m tito_rl.replayer.live_conformance --targets nemogym --merge  # one gateway's columns into the page's
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tito_rl.replayer.live_table import SCENARIOS_ROW, LiveTable, TableError, merge, parse, render

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "conformance.md"
MARKER = "live"
# The corpus: tito's scenarios, and the ones written for the other targets (same clients, same policy); a target
# records those whose every session speaks a wire it serves.
SCENARIOS = (ROOT / "cassettes" / "scenarios", ROOT / "cassettes" / "targets" / "scenarios")
WIRE_OF_AGENT = {
    "claude-code": "anthropic",
    "codex": "responses",
    "gemini-cli": "gemini",
    "qwen-code": "chat",
    "opencode": "chat",
    "mini-swe-agent": "chat",
}
UNSTREAMED_AGENTS = {"mini-swe-agent"}  # litellm's `completion`: the CLI an unstreamed gateway can serve


@dataclass(frozen=True)
class Target:
    """A gateway the corpus is recorded through: the wires it serves and the engine API it calls."""

    name: str
    wires: frozenset[str]
    dialect: str
    session_in_url: bool = False  # sessions live in the URL: scripted sessions with a `path_prefix` are for it
    # the URL's session prefix it takes (a scripted `path_prefix` must start with it); "": any
    url_prefix: str = ""
    streams: bool = True  # it serves streamed requests (Agent Lightning 1.0.2 refuses them: every npm CLI streams)
    # it also finds a session by its bearer token: a scripted session with no `path_prefix` (rllm's gateway and
    # miles find sessions only in their URL; a CLI is handed the URL by the launchers, so CLIs run either way)
    bearer: bool = True
    session_cookie: str = ""  # the signed session cookie it keys sessions by (scripted `session_cookie:`)


TARGETS = (
    Target("tito", frozenset({"anthropic", "chat", "responses", "gemini"}), "sglang"),
    Target("slime", frozenset({"anthropic", "chat"}), "sglang"),  # Responses and Gemini answer 404 (finding 7)
    # /sessions/{sid}/v1/chat/completions: a request outside it is traced under no session of tito's
    Target("rllm", frozenset({"chat"}), "vllm-openai", session_in_url=True, bearer=False),
    Target("miles", frozenset({"chat"}), "sglang-openai", session_in_url=True, bearer=False),  # its session server
    # verifiers' train client renders chat only (TrainClient refuses the other dialects); the session is the API key.
    # The fake engine imitates vLLM 0.31.0 for it: its driver says so (`TargetInfo.fake_engine_args`).
    Target("verifiers", frozenset({"chat"}), "vllm-generate"),
    # Agent Lightning's proxy: chat, unstreamed, the rollout in its own URL (its profile creates it)
    Target(
        "agentlightning",
        frozenset({"chat"}),
        "vllm-openai",
        session_in_url=True,
        url_prefix="/proxy/rollout/",
        streams=False,
    ),
    # NeMo Gym's model server: chat (JSON, and SSE it synthesizes), the rollout in its own URL
    # (`/ng-rollout/<id>/training-token-capture`); Responses requests with `include` are refused
    # (or its signed session cookie, `VLLMModel___policy_model`)
    Target(
        "nemogym",
        frozenset({"chat"}),
        "vllm-openai",
        session_in_url=True,
        url_prefix="/ng-rollout/",
        session_cookie="VLLMModel___policy_model",
    ),
)


@dataclass(frozen=True)
class Scenario:
    """What the corpus selection needs of a scenario file: its wires and whether it puts the session in the URL."""

    path: Path
    wires: frozenset[str]
    path_prefix: bool
    prefixes: frozenset[str] = frozenset()  # the scripted sessions' `path_prefix` values
    streams: bool = True  # a session streams (every npm CLI does), or it is not known
    # a real CLI plays every session: its base URL gets the target's session path (TargetInfo.session_path)
    clis_only: bool = False
    cookies: frozenset[str] = frozenset()  # the scripted sessions' `session_cookie` values: a gateway's own

    @property
    def name(self) -> str:
        return self.path.stem


def read_scenario(path: Path) -> Scenario:
    """The wires a scenario's client speaks: a CLI's own, a scripted session's `wire:` (default Anthropic)."""
    client = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("client") or {}
    wires: set[str] = set()
    prefix = False
    prefixes: set[str] = set()
    cookies: set[str] = set()
    streams = False

    def walk(node: Any) -> None:
        nonlocal prefix, streams
        if isinstance(node, dict):
            prefix = prefix or "path_prefix" in node
            if "path_prefix" in node:
                prefixes.add(str(node["path_prefix"]))
            if "session_cookie" in node:
                cookies.add(str(node["session_cookie"]))
            streams = streams or node.get("stream") is True
            if "wire" in node:
                wires.add(str(node["wire"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(client)
    agents = {a for a in _agents(client) if a != "scripted"}
    wires |= {WIRE_OF_AGENT.get(a, a) for a in agents}
    streams = streams or bool(agents - UNSTREAMED_AGENTS) or not client
    clis_only = bool(agents) and "scripted" not in _agents(client) and not _scripted_sessions(client)
    return Scenario(
        path, frozenset(wires or {"anthropic"}), prefix, frozenset(prefixes), streams, clis_only, frozenset(cookies)
    )


def _scripted_sessions(client: dict[str, Any]) -> bool:
    """A session the scripted client plays: one with `steps` (a CLI session has a task or runs)."""
    return any(isinstance(s, dict) and "steps" in s for s in client.get("sessions") or [])


def _agents(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {str(node["agent"])} if "agent" in node else set()
        return found.union(*(_agents(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_agents(v) for v in node))
    return set()


def runs_through(scenario: Scenario, target: Target) -> bool:
    if not scenario.wires <= target.wires or (scenario.streams and not target.streams):
        return False
    if scenario.cookies:  # sessions in a gateway's own signed cookie: only that gateway reads them
        return scenario.cookies == {target.session_cookie}
    if not scenario.path_prefix:
        # a gateway that takes its session from its own URL needs a scripted prefix, or a CLI given its session path;
        # a scripted session with neither reaches only a gateway that also reads the bearer token
        return scenario.clis_only or (not target.url_prefix and target.bearer)
    return target.session_in_url and all(p.startswith(target.url_prefix or "/sessions/") for p in scenario.prefixes)


def present(names: list[str] | None = None) -> tuple[list[Target], dict[str, str]]:
    """The targets installed here (tito always), and why each other one is left out."""
    from tito_rl.recorder.targets.base import TargetError, TargetOptions
    from tito_rl.recorder.targets.registry import create_driver

    chosen, missing = [], {}
    for target in TARGETS:
        if names is not None and target.name not in names:
            continue
        try:
            if target.name != "tito":
                create_driver(target.name, TargetOptions())  # imports the gateway's code; starts nothing
        except TargetError as exc:
            missing[target.name] = str(exc).splitlines()[0]
            continue
        chosen.append(target)
    return chosen, missing


# ---- recording and auditing -------------------------------------------------------------------------------------


@dataclass
class Run:
    """One scenario recorded through one target: the cassette, or why there is none."""

    scenario: str
    target: str
    cassette: Path | None = None
    error: str = ""
    seconds: float = 0.0


def record(scenario: Scenario, target: Target, folder: Path, timeout_s: float, reuse: bool = False) -> Run:
    from tito_rl.recorder.simulate import SimulateError, simulate

    out = folder / f"{scenario.name}.{target.name}.tito"
    if reuse and out.is_file():  # recorded by an earlier run into the same --keep folder
        return Run(scenario.name, target.name, out)
    try:
        done = simulate(
            scenario.path,
            out,
            replace=True,
            golden=False,
            timeout_s=timeout_s,
            target=target.name,
            dialect=target.dialect,
        )
    except (SimulateError, subprocess.TimeoutExpired) as exc:
        return Run(scenario.name, target.name, error=_why(str(exc)))
    return Run(scenario.name, target.name, done.cassette, seconds=done.seconds)


def _why(text: str) -> str:
    """The one line of a failed recording that says why (an API error the client printed, a CLI's exit)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for needle in ("API Error", "FAILED", "answered", "exit "):
        hit = next((line for line in lines if needle in line), None)
        if hit:
            hit = hit[hit.find(needle) :] if needle == "API Error" else hit
            return hit[:160].rstrip('",')
    return (lines[0] if lines else "no cassette")[:160]


def audit(cassettes: list[Path]) -> dict[str, Any]:
    """`tito audit --json` over the recordings, nothing failing it (the table reports every rule)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tito_rl", "audit", *map(str, cassettes), "--json", "--fail-on", ""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"tito audit exited with {proc.returncode}: {proc.stderr.strip()[-500:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


# ---- figures from the audit JSON (schema tito-audit, version 1) --------------------------------------------------

ROWS = (  # (label, rule id, how the cell reads: "count", "kinds")
    ("tokens the engine emitted (agent turns)", "emitted", "figure"),
    ("emitted-token coverage (trained once, engine's logprob)", "coverage", "coverage"),
    ("never trained, by reason", "never-trained", "kinds"),
    ("trained twice", "trained-twice", "kinds"),
    ("trained but not emitted", "trained-not-emitted", "count"),
    ("logprob mismatches", "logprob-mismatch", "count"),
    ("missing logprobs", "missing-logprobs", "kinds"),
    ("prefix breaks, by kind", "prefix-break", "kinds"),
    ("stop-token leaks (replies)", "stop-token-leak", "kinds"),
    ("tool calls lost", "tool-call-lost", "count"),
    ("replies whose text was dropped", "text-dropped", "count"),
    ("sampling overrides (calls), by setting", "sampling-override", "kinds"),
    ("regenerated retries", "regenerated-retry", "count"),
    ("status changes (engine → agent)", "status-changed", "kinds"),
)


@dataclass
class Figures:
    """One target's audit over a set of its recordings, summed."""

    cassettes: int = 0
    sessions: int = 0
    emitted: int = 0
    covered: int = 0
    finished: bool = False  # some recording had a finish, so coverage means something
    totals: Counter[str] = field(default_factory=Counter)
    kinds: dict[str, Counter[str]] = field(default_factory=dict)

    def add(self, cassette: dict[str, Any]) -> None:
        self.cassettes += 1
        self.sessions += int(cassette.get("sessions") or 0)
        self.emitted += int(cassette.get("emitted") or 0)
        self.covered += int(cassette.get("covered") or 0)
        self.finished = self.finished or cassette.get("coverage") is not None
        for rule, found in (cassette.get("rules") or {}).items():
            self.totals[rule] += int(found.get("total") or 0)
            self.kinds.setdefault(rule, Counter()).update({k: int(n) for k, n in (found.get("kinds") or {}).items()})

    def coverage(self) -> str:
        if not self.finished or not self.emitted:
            return "-"
        return f"{self.covered / self.emitted:.3f} ({self.covered}/{self.emitted})"

    def cell(self, rule: str, how: str) -> str:
        if how == "figure":
            return str(self.emitted)
        if how == "coverage":
            return self.coverage()
        total = self.totals.get(rule, 0)
        kinds = self.kinds.get(rule) or Counter()
        if not total or how == "count" or not kinds:
            return str(total)
        return f"{total}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))

    def fired(self) -> str:
        """The rules that fired, for a per-scenario cell: `coverage 0.69; prefix-break 5 (rewritten 2, …); …`."""
        parts = [f"coverage {self.covered / self.emitted:.2f}" if self.finished and self.emitted else "coverage -"]
        for _, rule, how in ROWS[2:]:
            if self.totals.get(rule):
                kinds = self.kinds.get(rule) or Counter()
                shown = (
                    f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if kinds and how == "kinds" else ""
                )
                parts.append(f"{rule} {self.totals[rule]}{shown}")
        return "; ".join(parts)


def figures(report: dict[str, Any], cassettes: list[str] | None = None) -> Figures:
    """The audit's cassettes (or those of `cassettes`, by path) summed."""
    if report.get("schema") != "tito-audit" or report.get("version") != 1:
        raise ValueError(f"not a tito-audit version 1 report: {report.get('schema')!r} {report.get('version')!r}")
    out = Figures()
    wanted = None if cassettes is None else set(cassettes)
    for cassette in report.get("cassettes") or []:
        if wanted is None or cassette["path"] in wanted:
            out.add(cassette)
    return out


# ---- the page ---------------------------------------------------------------------------------------------------


INTRO = (
    "Recorded live with `tito simulate --target` (the scenario's real CLI or scripted client → the target → the fake "
    "engine), audited with `tito audit --json`. "
)


def column(found: Figures) -> dict[str, str]:
    """One target's cells in a summary table, by row label."""
    return {SCENARIOS_ROW: f"{found.cassettes} ({found.sessions})", **{lbl: found.cell(r, h) for lbl, r, h in ROWS}}


def table(runs: list[Run], report: dict[str, Any], targets: list[str], missing: dict[str, str]) -> LiveTable:
    """Gateways side by side over the scenarios all of them recorded, then each over all it recorded, then scenario
    by scenario."""
    by_target = {t: [r for r in runs if r.target == t] for t in targets}
    recorded = {t: {r.scenario: str(r.cassette) for r in rs if r.cassette is not None} for t, rs in by_target.items()}
    compared, apart = shared(recorded)
    common = sorted(set.intersection(*(set(recorded[t]) for t in compared))) if compared else []
    out = LiveTable(
        intro=INTRO,
        targets=list(targets),
        missing=dict(missing),
        common=common,
        apart={t: sorted(recorded[t]) for t in apart},
        labels=[SCENARIOS_ROW, *(label for label, _, _ in ROWS)],
    )
    out.first = {t: column(figures(report, [recorded[t][s] for s in common])) for t in compared}
    out.every = {t: column(figures(report, list(recorded[t].values()))) for t in targets}
    for name in sorted({r.scenario for r in runs}):
        row = out.by_scenario.setdefault(name, {})
        for t in targets:
            run = next((r for r in by_target[t] if r.scenario == name), None)
            if run is None:
                row[t] = "-"
            elif run.cassette is None:
                row[t] = f"not recorded: {run.error}"
            else:
                row[t] = figures(report, [str(run.cassette)]).fired()
    return out


def build(runs: list[Run], report: dict[str, Any], targets: list[str], missing: dict[str, str]) -> str:
    """The markdown between the markers (`table`, written)."""
    return render(table(runs, report, targets, missing))


def merged(page: str, runs: list[Run], report: dict[str, Any], targets: list[str], missing: dict[str, str]) -> str:
    """The page's live table with `targets`' columns from these runs, the other columns as the page has them."""
    start, end = f"<!-- conformance:{MARKER}:start -->", f"<!-- conformance:{MARKER}:end -->"
    if start not in page or end not in page:
        raise TableError(f"the page has no live table to merge into (no {start})")
    old = parse(page.split(start, 1)[1].split(end, 1)[0])
    recorded = {
        t: {r.scenario: str(r.cassette) for r in runs if r.target == t and r.cassette is not None} for t in targets
    }
    files = {p.stem: p for folder in SCENARIOS for p in folder.glob("*.yaml")}
    by_name = {t.name: t for t in TARGETS}

    def goes(scenario: str, target: str) -> bool:
        return scenario in files and target in by_name and runs_through(read_scenario(files[scenario]), by_name[target])

    def column_over(target: str, scenarios: list[str]) -> dict[str, str] | None:
        if not set(scenarios) <= set(recorded[target]):
            return None
        return column(figures(report, [recorded[target][s] for s in scenarios]))

    new = table(runs, report, targets, missing)
    return render(merge(old, new, [t.name for t in TARGETS], goes, column_over))


def shared(recorded: dict[str, dict[str, str]]) -> tuple[list[str], list[str]]:
    """The targets compared on common scenarios, and those set apart: while no scenario is common to all, the one
    that recorded fewest is set apart (Agent Lightning's proxy serves no streamed request and keeps its rollout in
    its own URL, so it records only its own scenario), so one such gateway does not empty the comparison."""
    compared, apart = list(recorded), []
    while len(compared) > 2 and not set.intersection(*(set(recorded[t]) for t in compared)):
        fewest = min(compared, key=lambda t: (len(recorded[t]), t))
        compared.remove(fewest)
        apart.append(fewest)
    return compared, apart


def place(page: str, text: str) -> str:
    from tito_rl.replayer.conformance import place as place_block

    return place_block(page, MARKER, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.replayer.live_conformance", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--targets",
        help="comma-separated (default: every one present: tito, slime, rllm, miles, verifiers, agentlightning, "
        "nemogym)",
    )
    parser.add_argument("--scenarios", nargs="*", metavar="NAME", help="only these scenarios (file stems)")
    parser.add_argument("--jobs", type=int, default=2, help="recordings at once (default 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per recording")
    parser.add_argument("--keep", metavar="DIR", help="record into DIR and keep it (default: a temporary folder)")
    parser.add_argument(
        "--reuse", action="store_true", help="with --keep: take the recordings already in DIR, record only the rest"
    )
    parser.add_argument("--page", default=str(PAGE))
    parser.add_argument("--print", action="store_true", help="print the table, leave the page alone")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --targets: put these targets' columns into the page's table, keeping the others as they are",
    )
    args = parser.parse_args(argv)
    if args.reuse and not args.keep:
        parser.error("--reuse needs --keep DIR")
    if args.merge and not args.targets:
        parser.error("--merge needs --targets (the columns to put in)")
    targets, missing = present(args.targets.split(",") if args.targets else None)
    for name, why in missing.items():
        print(f"live conformance: {name} not run: {why}", file=sys.stderr)
    files = sorted(p for folder in SCENARIOS for p in folder.glob("*.yaml"))
    scenarios = [read_scenario(p) for p in files if not args.scenarios or p.stem in args.scenarios]
    plan = [(s, t) for t in targets for s in scenarios if runs_through(s, t)]
    with tempfile.TemporaryDirectory(prefix="tito-live-") as tmp:
        folder = Path(args.keep or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            runs = list(pool.map(lambda st: record(st[0], st[1], folder, args.timeout, args.reuse), plan))
        for run in runs:
            print(
                f"live conformance: {run.scenario} through {run.target}: "
                f"{run.cassette.name if run.cassette else 'not recorded: ' + run.error}",
                file=sys.stderr,
            )
        done = [r.cassette for r in runs if r.cassette is not None]
        report = audit(done) if done else {"schema": "tito-audit", "version": 1, "cassettes": []}
        if args.keep:
            (folder / "audit.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        page = Path(args.page)
        names = [t.name for t in targets]
        try:
            text = (
                merged(page.read_text(encoding="utf-8"), runs, report, names, missing)
                if args.merge
                else build(runs, report, names, missing)
            )
        except TableError as exc:
            print(f"live conformance: {page}: {exc}", file=sys.stderr)
            return 2
    if args.print:
        print(text)
        return 0
    page.write_text(place(page.read_text(encoding="utf-8"), text), encoding="utf-8")
    print(
        f"{page}: {MARKER}: {len(done)} recording(s) of {len(plan)} through {len(targets)} target(s)", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
