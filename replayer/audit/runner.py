"""An audit of cassettes and folders: each cassette streamed once through every rule family, its allowlist
applied, and whether a rule of `--fail-on` fired."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tito_rl.cassette.format.errors import CassetteError
from tito_rl.replayer import workers
from tito_rl.replayer.audit.allowlist import AllowlistError, allowlist_path, read_allowlist
from tito_rl.replayer.audit.coverage import Coverage
from tito_rl.replayer.audit.prefix import PrefixBreak
from tito_rl.replayer.audit.protocol import DEFAULT_FAIL_ON, RULES, Findings
from tito_rl.replayer.audit.replies import Replies
from tito_rl.replayer.audit.requests import Requests
from tito_rl.replayer.audit.traffic import RuleFamily, stream


class AuditInputError(Exception):
    """Input the audit cannot use: no such file, a folder without cassettes, a corrupt cassette, a bad
    allowlist. Its message is one line."""


def families(findings: Findings) -> list[RuleFamily]:
    """Every rule family, in the order they see each record (prefix breaks before coverage reads them)."""
    return [PrefixBreak(findings), Coverage(findings), Replies(findings), Requests(findings)]


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


def audit_cassette(path: str | Path, progress: Callable[[int], None] | None = None) -> CassetteAudit:
    """One cassette, read once (module docstring); `progress(bytes_read)` at each session's end."""
    allowed = read_allowlist_or_fail(path)
    findings = Findings()
    try:
        result = stream(path, families(findings), findings, progress)
    except FileNotFoundError:
        raise AuditInputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AuditInputError(f"{path}: a folder, not a cassette") from None
    except CassetteError as exc:
        raise AuditInputError(f"{path}: {str(exc).splitlines()[0]}") from None
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
) -> AuditReport:
    """Every cassette of `inputs`, in order; `progress(n)` hears n more bytes read (a bar over their sizes).
    `jobs` > 1: the cassettes are audited in that many worker processes, a cassette each at a time (a run's
    folder of rotated cassettes, `tito record --rotate-sessions`); `ray`: as tasks on that Ray cluster (an address,
    or `auto`; `replayer/workers.py`). The report is the one `jobs=1` makes; `WorkersError` where the workers
    cannot run."""
    paths = cassette_paths(inputs)
    if ray is not None or (jobs > 1 and len(paths) > 1):
        return AuditReport(_audit_in_workers(paths, workers.Backend(jobs, ray), progress), fail_on)
    audits = []
    for path in paths:
        done = 0

        def step(bytes_read: int) -> None:
            nonlocal done
            if progress is not None and bytes_read > done:
                progress(bytes_read - done)
                done = bytes_read

        audits.append(audit_cassette(path, step))
    return AuditReport(audits, fail_on)


def _audit_in_workers(
    paths: list[Path], backend: workers.Backend, progress: Callable[[int], None] | None
) -> list[CassetteAudit]:
    """Each cassette audited by a worker (`replayer/workers.py`), its result sent back whole; results in cassette
    order, an unusable one raising here as it would in one process."""
    pool = workers.start(backend)
    try:
        audits = []
        for path, result in zip(paths, pool.map(audit_unit, None, paths, unit_reads), strict=True):
            audits.append(result)
            if progress is not None:
                progress(path.stat().st_size)
        return audits
    finally:
        pool.close()


def audit_unit(_: None, path: Path) -> CassetteAudit:
    """A worker's unit: one cassette."""
    return audit_cassette(path)


def unit_reads(path: Path) -> list[str]:
    """What a unit reads: the cassette, and its allowlist where there is one."""
    allowlist = allowlist_path(path)
    return [str(path), *([str(allowlist)] if allowlist.is_file() else [])]
