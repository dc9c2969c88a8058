"""The pytest plugin (entry point `tito`): every cassette session is a test, plus fixtures for your tests.

Cassettes under `--cassette-dir` (ini `tito_cassette_dir`, default `cassettes/`) are collected as one item
per session, `cassettes/<file>.tito::<session>`, so `-k` picks sessions and `pytest -n 2` (xdist) replays
a corpus in parallel. An item replays its session as `tito replay` does, always verifying, and checks the
session's section of the golden file; a failure shows the first-difference report, not a traceback.
`--update-goldens` writes the goldens instead; the what-if options (`--chat-template`, `--fork-threshold`,
`--engine-match order`, ...) replay under a candidate change, judged by the goldens. When pytest runs with
no path arguments (its testpaths or the current folder), the cassette folder is added to what it collects.

Fixtures: `tito_fake_engine(scenario) -> url`, `tito_adapter(engine_url, **settings) -> handle` (`.url`,
`.manager`, `.finish(session, reward)`), `tito_replay(path, sessions=None) -> CassetteResult`, and
`tito_vcr`, a vcrpy VCR storing tito cassettes in the mode `--record-mode` names (none, once, new_episodes,
all; default none: replay only).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from replayer import whatif

RECORD_MODES = ("none", "once", "new_episodes", "all")
INI_CASSETTE_DIR = "tito_cassette_dir"
INI_RECORD_MODE = "tito_record_mode"
INI_TARGET = "tito_target"
INI_ENGINE_LISTEN = "tito_engine_listen"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tito", "tito cassettes and goldens")
    group.addoption("--cassette-dir", default=None, metavar="DIR",
                    help=f"cassettes collected as tests, one per session (ini {INI_CASSETTE_DIR}; default cassettes)")
    group.addoption("--update-goldens", action="store_true", default=False,
                    help="write golden files from the replay instead of failing on a difference")
    group.addoption("--record-mode", choices=RECORD_MODES, default=None,
                    help=f"the tito_vcr fixture's vcrpy record mode (ini {INI_RECORD_MODE}; default none)")
    group.addoption("--tito-target", default=None, metavar="TARGET",
                    help=f"replay through this target (tito, a driver's name, module:attribute, http://HOST:PORT; "
                         f"ini {INI_TARGET}; default: each cassette's own)")
    group.addoption("--tito-engine-listen", default=None, metavar="HOST:PORT",
                    help=f"where replay serves the engine leg of a foreign target (ini {INI_ENGINE_LISTEN})")
    whatif.register(group.addoption)
    parser.addini(INI_TARGET, "target to replay cassettes through (default: each cassette's own)", default="")
    parser.addini(INI_ENGINE_LISTEN, "HOST:PORT where replay serves a foreign target's engine leg", default="")
    parser.addini(INI_CASSETTE_DIR, "folder of cassettes collected as tests", default="cassettes")
    parser.addini(INI_RECORD_MODE, "record mode of the tito_vcr fixture", default="none")


def cassette_dir(config: pytest.Config) -> Path:
    folder = Path(config.getoption("cassette_dir") or config.getini(INI_CASSETTE_DIR))
    return (folder if folder.is_absolute() else config.rootpath / folder).resolve()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "tito_cassette: a cassette session replayed by the tito plugin")
    folder = cassette_dir(config)
    if config.args_source == pytest.Config.ArgsSource.ARGS or not folder.is_dir():
        return  # explicit paths: collect just those (a .tito among them is still collected)
    covered = any(_within(folder, Path(a)) for a in config.args)
    if not covered:
        config.args.append(str(folder))


def _within(path: Path, folder: Path) -> bool:
    folder = folder.resolve()
    return path == folder or folder in path.parents


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix == ".tito" and _within(file_path.resolve(), cassette_dir(parent.config)):
        return CassetteFile.from_parent(parent, path=file_path)
    return None


@lru_cache(maxsize=16)
def _loaded(path: str, mtime_ns: int) -> tuple[Any, str | None]:
    """The cassette and its tokenizer folder, read once per process (items of one cassette share it)."""
    from replayer.replay import load_cassette

    return load_cassette(path)


def loaded(path: Path) -> tuple[Any, str | None]:
    return _loaded(str(path), path.stat().st_mtime_ns)


class ReplayFailure(Exception):
    """A session that does not replay as recorded; its message is the whole report."""


class CassetteFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        from replayer.replay import ReplayInputError

        try:
            cassette, _ = loaded(self.path)
        except ReplayInputError as exc:
            yield SessionItem.from_parent(self, name="<unusable>", cassette_session="", error=str(exc))
            return
        for name in cassette.sessions:
            yield SessionItem.from_parent(self, name=name, cassette_session=name)


class SessionItem(pytest.Item):
    def __init__(self, *, cassette_session: str, error: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.session_name = cassette_session
        self.error = error
        self.add_marker("tito_cassette")

    def runtest(self) -> None:
        from replayer import goldens
        from replayer.replay import (
            ReplayInputError,
            ReplayOptions,
            TargetUnavailableError,
            replay_loaded,
            run_sync,
        )
        from replayer.report import session_report
        from trajectory.golden import TokenizerNames
        from trajectory.tokenizer import load_tokenizer

        if self.error:
            raise ReplayFailure(f"tito: {self.error}")
        option = self.config.getoption
        update = bool(option("update_goldens"))
        try:
            adapter, manager = whatif.overrides(option)
        except ValueError as exc:
            raise ReplayFailure(f"tito: {exc}") from None
        strict = not (update or whatif.engine_match_order(option))
        cassette, tokenizer = loaded(self.path)
        target = option("tito_target") or self.config.getini(INI_TARGET) or None
        engine_listen = option("tito_engine_listen") or self.config.getini(INI_ENGINE_LISTEN) or None
        try:
            result = run_sync(replay_loaded(cassette, str(self.path), tokenizer, [self.session_name],
                                            ReplayOptions(strict=strict, adapter=adapter, manager=manager,
                                                          target=target, engine_listen=engine_listen)))
        except TargetUnavailableError as exc:  # e.g. a cassette recorded around slime, where slime is not
            pytest.skip(f"tito: {exc}")
        except ReplayInputError as exc:
            raise ReplayFailure(f"tito: {exc}") from None
        session = result.sessions[0]
        if session.skipped:
            pytest.skip(session.skipped)
        if result.goldens_apply:
            goldens.check(result, result.all_sessions, TokenizerNames(load_tokenizer(tokenizer)), update=update)
        if not session.ok:
            result.path = session.cassette = self._shown_path()
            raise ReplayFailure(session_report(result, session))

    def _shown_path(self) -> str:
        try:
            return str(self.path.relative_to(self.config.rootpath))
        except ValueError:
            return str(self.path)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ReplayFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.path.name}::{self.session_name}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    from replayer.goldens import orphans

    folder = cassette_dir(config)
    if folder.is_dir() and not hasattr(config, "workerinput"):
        for golden in orphans([folder]):
            shown = golden.relative_to(config.rootpath) if golden.is_relative_to(config.rootpath) else golden
            terminalreporter.write_line(f"tito: {shown} has no cassette beside it "
                                        f"({golden.with_suffix('.tito').name} is gone)", yellow=True)


# ---- fixtures for users' own tests ----


@pytest.fixture
def tito_fake_engine() -> Iterator[Any]:
    """`tito_fake_engine(scenario, **EngineOptions) -> url`: a scripted fake engine on loopback."""
    from replayer.fixtures import start_fake_engine

    servers: list[Any] = []

    def start(scenario: Any, **options: Any) -> str:
        servers.append(start_fake_engine(scenario, **options))
        return servers[-1].url

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def tito_adapter() -> Iterator[Any]:
    """`tito_adapter(engine_url, manager=None, tap=None, **AdapterSettings) -> AdapterHandle`."""
    from replayer.fixtures import start_adapter

    handles: list[Any] = []

    def start(engine_url: str, manager: Any = None, tap: Any = None, **settings: Any) -> Any:
        handles.append(start_adapter(engine_url, manager, tap, **settings))
        return handles[-1]

    yield start
    for handle in handles:
        handle.server.stop()


@pytest.fixture
def tito_replay(request: pytest.FixtureRequest) -> Any:
    """`tito_replay(path, sessions=None, goldens=True, **ReplayOptions) -> CassetteResult`, honouring
    `--update-goldens`."""
    from replayer.fixtures import replay

    update = bool(request.config.getoption("update_goldens"))

    def run(path: str | Path, sessions: list[str] | None = None, **options: Any) -> Any:
        options.setdefault("update_goldens", update)
        return replay(path, sessions, **options)

    return run


@pytest.fixture
def tito_vcr(request: pytest.FixtureRequest) -> Any:
    """A vcrpy VCR that records and replays the engine leg as tito cassettes, in `--record-mode`."""
    from recorder.cassette.vcr import configure_vcr

    mode = request.config.getoption("record_mode") or request.config.getini(INI_RECORD_MODE)
    return configure_vcr(record_mode=mode)
