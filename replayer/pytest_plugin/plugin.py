"""The pytest plugin (entry point `tito`): every cassette session is a test, plus fixtures for your tests.

Cassettes under `--tito-cassette-dir` (ini `tito_cassette_dir`, default `cassettes/`) are collected as one item
per session, `cassettes/<file>.tito::<session>` (the id `pytest -v` prints, which runs it again when pasted),
so `-k` picks sessions and `pytest -n 2` (xdist) replays a corpus in parallel. An item replays its session
as `tito replay` does, always verifying, and checks the session's section of the golden file; a failure shows
the first-difference report, not a traceback (`-v`: every difference; `-vv`: golden diffs whole).
`--update-goldens` writes the goldens instead; the what-if options (`--tito-chat-template`,
`--tito-fork-threshold`, `--tito-engine-match order`, ...) replay under a candidate change, judged by the
goldens; `--tito-audit "coverage>=1.0, trained-twice"` also audits each session's recording and fails it
where a pinned rule fired (`tito audit`, the cassette's allowlist applied). A cassette runs nothing it names: a
target only its header names (a profile's command, a `module:attribute`) fails its items in one line until
`--tito-target` gives yours or `--tito-trust-cassette` allows its own (`recorder/targets/profiles/trust.py`).
When pytest runs with no path arguments (its testpaths or the current folder), the cassette folder is added to
what it collects. Every option is prefixed `--tito-` (pytest-recording and others load beside
it) and has an ini key (`tito_rl.replayer.pytest_plugin.settings`).

Unused goldens are items too, so they fail where they are and each is handled once under xdist: a golden
whose cassette is gone (`cassettes/<file>.golden::unused`) and a golden section for a session its cassette no
longer has (`cassettes/<file>.tito::<session>`). `--update-goldens` deletes or trims them;
`--tito-allow-unused-goldens` makes them warnings.

Fixtures: `tito_fake_engine(scenario) -> url`, `tito_adapter(engine_url, **settings) -> handle` (`.url`,
`.manager`, `.finish(session, reward)`), `tito_replay(path, sessions=None) -> CassetteResult`,
`tito_audit(path, expect="") -> CassetteAudit` (a recording audited, `expect` asserted), `tito_vcr`,
a vcrpy VCR storing tito cassettes in the record mode `--tito-record-mode` names, else pytest-recording's
`--record-mode` (none, once, new_episodes, all, rewrite; default none: replay only), and `tito_config`, a dict
to override (as pytest-recording's `vcr_config`) that sets options for those fixtures.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from tito_rl.replayer.pytest_plugin import settings
from tito_rl.replayer.replay import whatif


class UnusedGoldenWarning(pytest.PytestWarning):
    """An unused golden, allowed by --tito-allow-unused-goldens."""


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.register(parser)


def cassette_dir(config: pytest.Config) -> Path:
    folder = Path(settings.value(config, "cassette_dir"))
    return (folder if folder.is_absolute() else config.rootpath / folder).resolve()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tito_cassette: a cassette session replayed by the tito plugin")
    if not config.pluginmanager.hasplugin("xdist"):  # the sessions' group mark (`gateway_group`) is xdist's
        config.addinivalue_line("markers", "xdist_group(name): pytest-xdist's group (--dist loadgroup)")
    for setting in settings.SETTINGS:
        settings.value(config, setting.name)  # a bad ini value stops the run here, in one line
    folder = cassette_dir(config)
    if folder.is_dir() and not getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from tito_rl.trajectory.adapters.parsing import parser_process

        parser_process.start()  # one pytest process replays: the parsers load meanwhile (SessionItem settles it)
    if config.args_source == pytest.Config.ArgsSource.ARGS or not folder.is_dir():
        return  # explicit paths: collect just those (a .tito among them is still collected)
    covered = any(_within(folder, Path(a)) for a in config.args)
    if not covered:
        config.args.append(str(folder))


def pytest_unconfigure(config: pytest.Config) -> None:
    from tito_rl.trajectory.adapters.parsing import parser_process

    gateways.close()
    parser_process.stop()


class Gateways:
    """The gateways this pytest process started for sessions replayed through a driver (verifiers' server, Agent
    Lightning's proxy): kept started between items and cassettes, and cleared between them, as `tito replay` keeps
    them for a run (`tito_rl.recorder.targets.gateway_pool`); stopped when pytest ends. They live on one event loop
    of the process's own, which the items that use them run on."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.pool: Any = None

    def replay(self, replaying: Any) -> Any:
        from tito_rl.recorder.targets import gateway_pool
        from tito_rl.trajectory.runtime.server_process import new_event_loop

        if self.runner is None:
            import asyncio

            self.runner = asyncio.Runner(loop_factory=new_event_loop)
            self.pool = gateway_pool.GatewayPool()

        box: list[Any] = []

        async def borrowing() -> None:  # the result in a box: see `cassette_replay.run_sync`
            async with gateway_pool.pooled(self.pool):
                box.append(await replaying)

        self.runner.run(borrowing())
        return box[0]

    def cassette_done(self) -> None:
        """A cassette's items are done here: a gateway that serves that cassette only is stopped (an in-process
        gateway's thread, rllm's, must not outlive its items into the tests that follow)."""
        if self.runner is not None:
            self.runner.run(self.pool.stop_unshared())

    def close(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            try:
                runner.run(self.pool.close())
            finally:
                runner.close()


gateways = Gateways()


def _within(path: Path, folder: Path) -> bool:
    folder = folder.resolve()
    return path == folder or folder in path.parents


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    from tito_rl.replayer.goldens.files import CASSETTE_SUFFIX, GOLDEN_SUFFIX

    if file_path.suffix not in (CASSETTE_SUFFIX, GOLDEN_SUFFIX):
        return None
    if not _within(file_path.resolve(), cassette_dir(parent.config)):
        return None
    if file_path.suffix == CASSETTE_SUFFIX:
        return CassetteFile.from_parent(parent, path=file_path)
    if not file_path.with_suffix(CASSETTE_SUFFIX).exists():
        return OrphanGoldenFile.from_parent(parent, path=file_path)
    return None


@lru_cache(maxsize=16)
def _loaded(path: str, mtime_ns: int) -> tuple[Any, str | None]:
    """The cassette and its tokenizer folder, read once per process (items of one cassette share it)."""
    from tito_rl.replayer.replay.loading import load_cassette

    return load_cassette(path)


@lru_cache(maxsize=4)
def _audited(path: str, mtime_ns: int) -> Any:
    from tito_rl.replayer.audit.runner import audit_cassette

    return audit_cassette(path)


def audited(path: Path) -> Any:
    """A cassette's audit, made once for all its sessions' items (and again when the file changes)."""
    return _audited(str(path), path.stat().st_mtime_ns)


def loaded(path: Path) -> tuple[Any, str | None]:
    return _loaded(str(path), path.stat().st_mtime_ns)


class FailureReport:
    """A failure's report as pytest shows it: coloured where pytest's terminal has markup (it honours NO_COLOR
    and --color), plain otherwise and wherever a report is turned into text (xdist, junitxml)."""

    def __init__(self, plain: str, colored: str | None = None) -> None:
        self.plain = plain
        self.colored = colored or plain

    def __str__(self) -> str:
        return self.plain

    def toterminal(self, tw: Any) -> None:
        for line in (self.colored if tw.hasmarkup else self.plain).splitlines():
            tw.line(line)


class ReplayFailure(Exception):
    """A session that does not replay as recorded (or an unused golden); `report` is the whole report."""

    def __init__(self, plain: str, colored: str | None = None) -> None:
        super().__init__(plain)
        self.report = FailureReport(plain, colored)


class TitoItem(pytest.Item):
    """An item whose failure is its report (`ReplayFailure`), not a traceback."""

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ReplayFailure):
            return excinfo.value.report
        return super().repr_failure(excinfo, style)


class CassetteFile(pytest.File):
    def teardown(self) -> None:
        gateways.cassette_done()

    def collect(self) -> Iterator[pytest.Item]:
        from tito_rl.replayer.goldens import files as goldens
        from tito_rl.replayer.replay.loading import ReplayInputError

        try:
            cassette, _ = loaded(self.path)
        except ReplayInputError as exc:
            yield SessionItem.from_parent(self, name="<unusable>", cassette_session="", error=str(exc))
            return
        group = gateway_group(self.config, cassette.header, self.path)
        for name in cassette.sessions:
            item = SessionItem.from_parent(self, name=item_name(name), cassette_session=name)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
            yield item
        golden = goldens.golden_path(self.path)
        for name in goldens.unused_sections(golden, list(cassette.sessions)):
            yield UnusedGoldenItem.from_parent(self, name=item_name(name), unused=goldens.Unused(golden, name))


def gateway_group(config: pytest.Config, header: Any, path: Path) -> str | None:
    """The xdist group of the sessions replayed through a driver's gateway (`tito-gateway-<target>`): under
    `pytest -n N --dist loadgroup` they run in one worker, where the gateway is started once for all of them
    (`gateways`); xdist starts the biggest groups first. None for tito's adapter and a running gateway."""
    from tito_rl.replayer.replay.loading import ReplayInputError, replay_target

    try:
        spec = replay_target(
            header, settings.value(config, "target") or None, str(path), settings.value(config, "trust_cassette")
        )
    except ReplayInputError:
        return None
    if spec.kind != "driver" or settings.value(config, "engine_listen"):
        return None
    return "tito-gateway-" + re.sub(r"[^A-Za-z0-9_.-]", "_", spec.text)


def item_name(session: str) -> str:
    """The session's name as its test id's last part: as it is, unless pytest would read it as more than one
    part (a `::`, from an untrusted cassette); then `%` and `:` are percent-encoded, so the id pasted back runs
    this item and no two sessions share an id."""
    if "::" not in session and "%" not in session:
        return session
    return session.replace("%", "%25").replace(":", "%3A")


class OrphanGoldenFile(pytest.File):
    """A golden whose cassette is gone: one item, `<file>.golden::unused`."""

    def collect(self) -> Iterator[pytest.Item]:
        from tito_rl.replayer.goldens.files import Unused

        yield UnusedGoldenItem.from_parent(self, name="unused", unused=Unused(self.path))


class SessionItem(TitoItem):
    def __init__(self, *, cassette_session: str, error: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.session_name = cassette_session
        self.error = error
        self.add_marker("tito_cassette")

    def runtest(self) -> None:
        from tito_rl.replayer.goldens import files as goldens
        from tito_rl.replayer.goldens.diff_view import DiffStyle
        from tito_rl.replayer.replay.cassette_replay import replay_loaded, run_sync
        from tito_rl.replayer.replay.loading import ReplayInputError, TargetUnavailableError
        from tito_rl.replayer.replay.options import ReplayOptions
        from tito_rl.replayer.reporting.terminal import session_report
        from tito_rl.trajectory.golden import TokenizerNames
        from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

        if self.error:
            raise ReplayFailure(f"tito: {self.error}")

        def option(name: str) -> Any:
            return settings.value(self.config, name)

        update = bool(self.config.getoption("update_goldens"))
        try:
            adapter, manager = whatif.overrides(option, settings.PREFIX)
        except ValueError as exc:
            raise ReplayFailure(f"tito: {exc}") from None
        strict = not (update or whatif.engine_match_order(option))
        cassette, tokenizer = loaded(self.path)
        options = ReplayOptions(
            strict=strict,
            adapter=adapter,
            manager=manager,
            target=option("target") or None,
            trust_cassette=bool(option("trust_cassette")),
            engine_listen=option("engine_listen") or None,
        )
        replaying = replay_loaded(cassette, str(self.path), tokenizer, [self.session_name], options)
        try:
            result = gateways.replay(replaying) if self.through_driver(options) else run_sync(replaying)
        except TargetUnavailableError as exc:  # e.g. a cassette recorded around slime, where slime is not
            pytest.skip(f"tito: {exc}")
        except ReplayInputError as exc:  # a target only the cassette names among them: a failure, never a skip
            raise ReplayFailure(f"tito: {_pytest_flags(str(exc))}") from None
        session = result.sessions[0]
        if session.skipped:
            pytest.skip(session.skipped)
        if result.goldens_apply:
            goldens.check(result, result.all_sessions, TokenizerNames(load_tokenizer(tokenizer)), update=update)
        if not session.ok:
            result.path = session.cassette = _shown(self.config, self.path)
            verbosity = self.config.get_verbosity()
            full = verbosity >= 2
            plain, colored = (DiffStyle(color=c, full=full, more="-vv shows it whole") for c in (False, True))
            raise ReplayFailure(
                session_report(result, session, verbosity, plain), session_report(result, session, verbosity, colored)
            )
        if option("audit"):
            self._audit(option("audit"))

    def through_driver(self, options: Any) -> bool:
        """Whether this session replays through a gateway a driver starts (verifiers, Agent Lightning, ...): then
        it borrows the process's started one (`gateways`), rather than starting it for one session."""
        from tito_rl.replayer.replay.loading import ReplayInputError, replay_target

        header = loaded(self.path)[0].header
        try:
            return replay_target(header, options.target, str(self.path), options.trust_cassette).kind == "driver"
        except ReplayInputError:
            return False

    def _audit(self, expected: str) -> None:
        """The session's audit against the pinned rules (`--tito-audit`): the cassette is audited once."""
        from tito_rl.replayer.audit.runner import AuditInputError, parse_expectations

        try:
            rules, least = parse_expectations(expected)
            problems = audited(self.path).problems(rules, least, self.session_name)
        except AuditInputError as exc:
            raise ReplayFailure(f"tito audit: {exc}") from None
        if problems:
            raise ReplayFailure(
                f"tito audit: {_shown(self.config, self.path)} session {self.session_name}: " + "; ".join(problems)
            )

    def reportinfo(self) -> tuple[Path, int | None, str]:
        # Not a suffix of the node id: `pytest -v` then prints the id itself, which runs this item when pasted
        # (a suffix is rewritten, dots to `::`, as if it were a Python name).
        return self.path, None, f"{self.path.name}: session {self.session_name}"


class UnusedGoldenItem(TitoItem):
    """A golden (or a section of one) that no cassette session checks: lost coverage, so it fails; with
    --update-goldens it is deleted (trimmed), with --tito-allow-unused-goldens it warns. An item of its own,
    each is run by exactly one worker under xdist: no two processes delete or trim the same thing."""

    def __init__(self, *, unused: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unused = unused
        self.add_marker("tito_cassette")

    def runtest(self) -> None:
        from tito_rl.replayer.goldens.files import fix_unused

        what = self.unused.describe(_shown(self.config, self.unused.golden))
        if self.config.getoption("update_goldens"):
            self.unused.remove()
        elif settings.value(self.config, "allow_unused_goldens"):
            warnings.warn(UnusedGoldenWarning(f"tito: {what} (--update-goldens removes it)"), stacklevel=1)
        else:
            raise ReplayFailure(f"tito: {what} ({fix_unused('--tito-allow-unused-goldens')})")

    def reportinfo(self) -> tuple[Path, int | None, str]:
        what = "unused golden" if self.unused.section is None else f"unused golden section {self.unused.section}"
        return self.path, None, f"{self.path.name}: {what}"


def _pytest_flags(text: str) -> str:
    """A replay's one-line error with tito's flags as this plugin spells them (`--tito-target`)."""
    return re.sub(r"(?<![\w-])--(target|trust-cassette)\b", r"--tito-\1", text)


def _shown(config: pytest.Config, path: Path) -> str:
    try:
        return str(path.relative_to(config.rootpath))
    except ValueError:
        return str(path)


# ---- fixtures for users' own tests ----


@pytest.fixture
def tito_fake_engine() -> Iterator[Any]:
    """`tito_fake_engine(scenario, **EngineOptions) -> url`: a scripted fake engine on loopback."""
    from tito_rl.replayer.pytest_plugin.fixtures import ThreadedServer, start_fake_engine

    servers: list[ThreadedServer] = []

    def start(scenario: Any, **options: Any) -> str:
        servers.append(start_fake_engine(scenario, **options))
        return servers[-1].url

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def tito_adapter() -> Iterator[Any]:
    """`tito_adapter(engine_url, manager=None, tap=None, **AdapterSettings) -> AdapterHandle`."""
    from tito_rl.replayer.pytest_plugin.fixtures import start_adapter

    handles: list[Any] = []

    def start(engine_url: str, manager: Any = None, tap: Any = None, **settings: Any) -> Any:
        handles.append(start_adapter(engine_url, manager, tap, **settings))
        return handles[-1]

    yield start
    for handle in handles:
        handle.server.stop()


@pytest.fixture
def tito_audit() -> Any:
    """`tito_audit(path, expect="") -> CassetteAudit`: a recording audited as `tito audit` does (`.findings`,
    `.coverage`, `.problems(rules, min_coverage, session)`); `expect` ("coverage>=1.0, trained-twice") fails the
    test with what broke it, so a team pins its own recordings' training data."""
    from tito_rl.replayer.pytest_plugin.fixtures import audit

    return audit


@pytest.fixture
def tito_config() -> dict[str, Any]:
    """Options for tito's fixtures, as pytest-recording's `vcr_config`: override it in a conftest.py, a module
    or a class to return e.g. `{"record_mode": "once", "vcr": {...vcr.VCR kwargs}}` (tito_vcr) or
    `{"fork_threshold": 0, "engine_match": "order"}` (tito_replay). The command line wins over it, and it over
    the ini keys."""
    return {}


@pytest.fixture
def tito_replay(request: pytest.FixtureRequest, tito_config: dict[str, Any]) -> Any:
    """`tito_replay(path, sessions=None, goldens=True, **ReplayOptions) -> CassetteResult`, honouring
    `--update-goldens` and the what-if settings (command line, tito_config, ini)."""
    from tito_rl.replayer.pytest_plugin.fixtures import replay

    fixture = settings.checked_fixture_config(tito_config)
    update = bool(request.config.getoption("update_goldens"))

    def option(name: str) -> Any:
        return settings.value(request.config, name, fixture)

    adapter, manager = whatif.overrides(option, settings.PREFIX)
    order = whatif.engine_match_order(option)

    def run(path: str | Path, sessions: list[str] | None = None, **options: Any) -> Any:
        options.setdefault("update_goldens", update)
        options.setdefault("strict", not (options["update_goldens"] or order))
        options["adapter"] = {**adapter, **options.get("adapter", {})}
        options["manager"] = {**manager, **options.get("manager", {})}
        return replay(path, sessions, **options)

    return run


@pytest.fixture
def tito_vcr(request: pytest.FixtureRequest, tito_config: dict[str, Any]) -> Any:
    """A vcrpy VCR that records and replays the engine leg as tito cassettes. Its record mode: `--tito-record-mode`,
    else pytest-recording's `--record-mode` (when that plugin is loaded and it is given), else tito_config's
    `record_mode`, else ini `tito_record_mode`, else none."""
    from tito_rl.replayer.pytest_plugin.vcr import configure_vcr

    fixture = settings.checked_fixture_config(tito_config)
    mode = request.config.getoption(settings.dest("record_mode"))
    if mode is None:
        mode = request.config.getoption("record_mode", default=None)  # pytest-recording's, when loaded
    if mode is None:
        mode = settings.value(request.config, "record_mode", fixture)
    return configure_vcr(record_mode=mode, **fixture.get("vcr", {}))
