"""An audit of cassettes and folders: each cassette streamed once through every rule family, its allowlist
applied, and whether a rule of `--fail-on` fired.

With `-j N` (or a Ray cluster's `dispatch`), each cassette's sessions are cut into work units
(`tito_rl.replayer.units`): a unit reads its sessions' frames in file order and feeds them to the rule families as
the one pass does, noting when that pass would have made each finding (`protocol.TimedFindings`); the parts merge
into the one pass's findings (`protocol.merge_findings`), so the report is the same bytes for any"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tito_rl.cassette.format.errors import CassetteError
from tito_rl.cassette.format.index import SessionIndex
from tito_rl.cassette.format.records import Header
from tito_rl.cassette.reader import CassetteReader, sessions_only
from tito_rl.replayer import workers
from tito_rl.replayer.audit.allowlist import AllowlistError, read_allowlist
from tito_rl.replayer.audit.channels.kept_sets import KeptRules
from tito_rl.replayer.audit.channels.routes import RouteRules
from tito_rl.replayer.audit.channels.versions import VersionRules
from tito_rl.replayer.audit.coverage import Coverage
from tito_rl.replayer.audit.prefix import PrefixBreak
from tito_rl.replayer.audit.protocol import (
    DEFAULT_FAIL_ON,
    RULES,
    Findings,
    TimedFindings,
    merge_findings,
    shown_rules,
)
from tito_rl.replayer.audit.replies import Replies
from tito_rl.replayer.audit.requests import Requests
from tito_rl.replayer.audit.traffic import Feed, RuleFamily, records_of, stream
from tito_rl.replayer.units import Dispatch, FileStamp, WorkUnit, sessions_per_unit, split_cassette

UNIT_MOST = 256  # sessions per unit at most: an audited session takes milliseconds, a unit's start about one


class AuditInputError(Exception):
    """Input the audit cannot use: no such file, a folder without cassettes, a corrupt cassette, a bad
    allowlist. Its message is one line."""


@dataclass(frozen=True)
class AuditOptions:
    """What a rule is told beyond the recording: `max_staleness`, the weight versions a sample's tokens may span
    (`stale-tokens`; None: not checked)."""

    max_staleness: int | None = None


def families(findings: Findings, options: AuditOptions | None = None) -> list[RuleFamily]:
    """Every rule family, in the order they see each record (prefix breaks before coverage reads them)."""
    options = options or AuditOptions()
    return [
        PrefixBreak(findings),
        Coverage(findings),
        Replies(findings),
        Requests(findings),
        RouteRules(findings),
        KeptRules(findings),
        VersionRules(findings, options.max_staleness),
    ]


@dataclass
class CassetteAudit:
    path: str
    target: str  # the system the recording was made around (tito's adapter when the header names none)
    sessions: int
    truncated: bool
    findings: Findings
    allowed: dict[str, str] = field(default_factory=dict)

    @property
    def emitted(self) -> int:
        return sum(f.emitted for f in self.findings.figures.values() if f.finished)

    @property
    def covered(self) -> int:
        return sum(f.covered for f in self.findings.figures.values() if f.finished)

    @property
    def coverage(self) -> float | None:
        return self.covered / self.emitted if self.emitted else None

    def problems(
        self, rules: tuple[str, ...], min_coverage: float | None = None, session: str | None = None
    ) -> list[str]:
        """What breaks a team's pinned expectations (`parse_expectations`), one line each: a rule of `rules` that
        fired (in `session`, when given) and is not allowed beside the cassette, and a coverage below
        `min_coverage`. Empty: the recording meets them."""
        out = []
        for rule in rules:
            result = self.findings.rules[rule]
            count = result.sessions.get(session, 0) if session is not None else result.total
            if count and rule not in self.allowed:
                first = next((e for e in result.examples if session is None or e.session == session), None)
                out.append(f"{rule}: {count}" + (f" (first: {first.session}, {first.detail})" if first else ""))
        if min_coverage is not None:
            figure = self.findings.figures.get(session) if session is not None else None
            covered, emitted = (figure.covered, figure.emitted) if figure is not None else (self.covered, self.emitted)
            if emitted and covered / emitted < min_coverage and "coverage" not in self.allowed:
                out.append(f"coverage {covered}/{emitted} = {covered / emitted:.3f}, below {min_coverage}")
        return out

    def failing(self, fail_on: tuple[str, ...]) -> list[str]:
        """The rules of `fail_on` that fired here and are not allowed."""
        return [r for r in fail_on if self.findings.rules[r].fired and r not in self.allowed]


@dataclass
class AuditReport:
    cassettes: list[CassetteAudit]
    fail_on: tuple[str, ...] = DEFAULT_FAIL_ON

    @property
    def failed(self) -> bool:
        return any(c.failing(self.fail_on) for c in self.cassettes)

    @property
    def rules(self) -> tuple[str, ...]:
        """The rules the report lists (`protocol.shown_rules`): the channel rules once a cassette carries channels."""
        return shown_rules(any(c.findings.channels for c in self.cassettes))


def audit_cassette(
    path: str | Path, progress: Callable[[int], None] | None = None, options: AuditOptions | None = None
) -> CassetteAudit:
    """One cassette, read once (module docstring); `progress(bytes_read)` at each session's end."""
    allowed = read_allowlist_or_fail(path)
    findings = Findings()
    try:
        result = stream(path, families(findings, options), findings, progress)
    except (CassetteError, FileNotFoundError, IsADirectoryError) as exc:
        raise _unusable(Path(path), exc) from None
    for rule, reason in allowed.items():
        findings.rules[rule].allowed = reason
    target = (result.header.target or {}).get("name") or "tito"
    return CassetteAudit(str(path), str(target), result.sessions, result.truncated, findings, allowed)


def read_allowlist_or_fail(path: str | Path) -> dict[str, str]:
    try:
        return read_allowlist(path)
    except AllowlistError as exc:
        raise AuditInputError(str(exc)) from None


def cassette_paths(inputs: list[str]) -> list[Path]:
    """The cassettes named, a folder standing for the `*.tito` files in it (as `tito replay` reads one)."""
    out: list[Path] = []
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = sorted(path.glob("*.tito"))
            if not found:
                raise AuditInputError(f"{path}: no cassettes (*.tito) in this folder")
            out += found
        elif path.exists():
            out.append(path)
        else:
            raise AuditInputError(f"{path}: no such file or folder")
    return out


def parse_rules(text: str) -> tuple[str, ...]:
    """A comma-separated list of rule ids (`--fail-on`); empty means none."""
    rules = tuple(r.strip() for r in text.split(",") if r.strip())
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        raise AuditInputError(f"unknown rule(s) {', '.join(unknown)} (rules: {', '.join(RULES)})")
    return rules


def parse_expectations(text: str) -> tuple[tuple[str, ...], float | None]:
    """`"coverage>=0.95, trained-twice, logprob-mismatch"` -> (rules that must not fire, the least coverage)."""
    rules, least = [], None
    for part in (p.strip() for p in text.split(",")):
        if part.replace(" ", "").startswith("coverage>="):
            try:
                least = float(part.split(">=", 1)[1])
            except ValueError:
                raise AuditInputError(f"{part!r}: expected coverage>=NUMBER") from None
        elif part:
            rules.append(part)
    return parse_rules(",".join(rules)), least


def audit(
    inputs: list[str],
    fail_on: tuple[str, ...] = DEFAULT_FAIL_ON,
    progress: Callable[[int], None] | None = None,
    jobs: int = 1,
    ray: str | None = None,
    dispatch: Dispatch | None = None,
    unit_most: int | None = None,
    options: AuditOptions | None = None,
) -> AuditReport:
    """Every cassette of `inputs`, in order; `progress(n)` hears n more bytes read (a bar over their sizes).
    `jobs` > 1: each cassette's sessions are cut into work units (module docstring), run by that many worker processes;
    `ray`: as tasks on that Ray cluster (an address, or `auto`; `replayer/workers.py`); `dispatch`: run by it
    instead; `unit_most`: sessions per unit at most; `options`: the rules' (`AuditOptions`). The report is the
    one `jobs=1` makes, byte for byte; `WorkersError` where the workers cannot run."""
    paths = cassette_paths(inputs)
    if dispatch is not None:
        return AuditReport(_audit_in_units(paths, dispatch, jobs, progress, unit_most, options), fail_on)
    if jobs > 1 or ray is not None:
        with workers.running(workers.Backend(jobs, ray)) as (dispatching, slots):
            return AuditReport(_audit_in_units(paths, dispatching, slots, progress, unit_most, options), fail_on)
    audits = []
    for path in paths:
        done = 0

        def step(bytes_read: int) -> None:
            nonlocal done
            if progress is not None and bytes_read > done:
                progress(bytes_read - done)
                done = bytes_read

        audits.append(audit_cassette(path, step, options))
    return AuditReport(audits, fail_on)


@dataclass
class UnitFailure:
    """A unit stopped by a damaged frame: the frame's offset (the first one in the file is what one pass meets)."""

    offset: int
    message: str


@dataclass
class AuditPart:
    """One unit's findings, with their moments; what a worker sends back."""

    number: int
    cassette: int
    sessions: int
    findings: TimedFindings | None = None
    failure: UnitFailure | None = None


@dataclass
class AuditJob:
    """`tito audit`'s work on a unit (`UnitJob`): its sessions fed to every rule family, as one pass feeds them."""

    options: AuditOptions = field(default_factory=AuditOptions)

    def reads(self, unit: WorkUnit) -> list[str]:
        return [unit.path]  # its allowlist is read by the parent

    def run(self, unit: WorkUnit) -> AuditPart:
        findings = TimedFindings()
        reader: CassetteReader | None = None
        try:
            with unit.reader() as reader:
                feed = Feed(reader.header, families(findings, self.options), findings)
                for offset, record in records_of(reader, unit.sessions):
                    findings.at(0, offset)
                    feed.feed(record)
                firsts = {s.session: s.frames[0] for s in unit.sessions}
                feed.end(lambda state: findings.at(1, firsts[state.name]))
        except (CassetteError, OSError) as exc:
            failure = UnitFailure(reader.reading_at if reader is not None else 0, str(exc).splitlines()[0])
            return AuditPart(unit.number, unit.cassette, len(unit.sessions), failure=failure)
        return AuditPart(unit.number, unit.cassette, len(feed.states), findings)


@dataclass
class CassettePlan:
    """What the parent knows of a cassette before its units run: its header, whether it ends in a cut record,
    its sessions in file order (of their first frames)."""

    path: Path
    header: Header
    truncated: bool
    sessions: list[SessionIndex] = field(default_factory=list)
    events: SessionIndex | None = None  # the engine-wide events' frames (format version 7): read by every unit


def plan_cassette(path: Path) -> CassettePlan:
    """The cassette's sessions, from its index (`CassetteReader.session_index`). `CassetteError`/`OSError` for a
    file that cannot be read."""
    with CassetteReader(path) as reader:
        index, events = sessions_only(reader.session_index())
        entries = sorted((e for e in index.values() if len(e.frames)), key=lambda e: e.frames[0])
        return CassettePlan(path, reader.header, reader.truncated, entries, events)


def units_of(plans: Sequence[CassettePlan | None], workers: int, most: int = UNIT_MOST) -> list[WorkUnit]:
    """Every cassette's sessions cut into units, numbered in cassette and session order (None: a cassette that
    could not be planned, which has none)."""
    total = sum(len(p.sessions) for p in plans if p is not None)
    size = sessions_per_unit(total, workers, most)
    units: list[WorkUnit] = []
    for number, plan in enumerate(plans):
        if plan is not None:
            made = split_cassette(str(plan.path), plan.sessions, size, len(units), number, FileStamp.of(plan.path))
            if plan.events is not None:  # each unit reads the events among its sessions' frames, as one pass does
                made = [dataclasses.replace(u, sessions=(*u.sessions, plan.events)) for u in made]
            units += made
    return units


def _audit_in_units(
    paths: list[Path],
    dispatch: Dispatch,
    workers: int,
    progress: Callable[[int], None] | None,
    unit_most: int | None,
    options: AuditOptions | None = None,
) -> list[CassetteAudit]:
    """Every cassette planned here (its index read, its allowlist), its units run by `dispatch`, each cassette's
    parts merged once they are all in; an unusable cassette raises when its turn comes, as in one process."""
    plans: list[CassettePlan | AuditInputError] = []
    allowed: list[dict[str, str]] = []
    for path in paths:
        try:
            allowed.append(read_allowlist_or_fail(path))
            plans.append(plan_cassette(path))
        except AuditInputError as exc:
            allowed.append({})
            plans.append(exc)
        except (CassetteError, OSError) as exc:
            plans.append(_unusable(path, exc))
    planned = [p if isinstance(p, CassettePlan) else None for p in plans]
    units = units_of(planned, workers, unit_most or UNIT_MOST)
    left = [sum(1 for u in units if u.cassette == i) for i in range(len(plans))]
    parts: list[list[AuditPart]] = [[] for _ in plans]
    audits: list[CassetteAudit] = []

    def merge_ready() -> None:
        while len(audits) < len(plans) and left[len(audits)] == 0:
            i = len(audits)
            plan = plans[i]
            if isinstance(plan, AuditInputError):
                raise plan
            audits.append(_merged(plan, parts[i], allowed[i]))
            parts[i] = []

    merge_ready()
    for unit, part in zip(units, dispatch(units, AuditJob(options or AuditOptions())), strict=True):
        parts[unit.cassette].append(part)
        left[unit.cassette] -= 1
        plan = planned[unit.cassette]
        if progress is not None and plan is not None:
            ran = sum(1 for s in unit.sessions if s is not plan.events)
            progress(round(plan.path.stat().st_size * ran / len(plan.sessions)))
        merge_ready()
    return audits


def _merged(plan: CassettePlan, parts: list[AuditPart], allowed: dict[str, str]) -> CassetteAudit:
    failures = [p.failure for p in parts if p.failure is not None]
    if failures:  # the damaged frame one pass meets first
        raise AuditInputError(f"{plan.path}: {min(failures, key=lambda f: f.offset).message}")
    findings = merge_findings([p.findings for p in parts if p.findings is not None])
    sessions = sum(p.sessions for p in parts)
    for rule, reason in allowed.items():
        findings.rules[rule].allowed = reason
    target = (plan.header.target or {}).get("name") or "tito"
    return CassetteAudit(str(plan.path), str(target), sessions, plan.truncated, findings, allowed)


def _unusable(path: Path, exc: Exception) -> AuditInputError:
    if isinstance(exc, FileNotFoundError):
        return AuditInputError(f"{path}: no such file")
    if isinstance(exc, IsADirectoryError):
        return AuditInputError(f"{path}: a folder, not a cassette")
    return AuditInputError(f"{path}: {str(exc).splitlines()[0]}")
