"""`replay_cassette`: a cassette's sessions through the real adapter app and manager, verified as they go.

In-process and offline: the adapter app is built with the settings, parsers and tokenizer the cassette's
header names (another tokenizer is refused), serves on a private Unix socket, and its engine leg is the
cassette (`engine_leg`). Each session's agent exchanges are re-sent in the order the live run answered
them (`plan`), its session-API finishes and drops at their places. Verification is not optional: engine
requests, replies, samples at every finish, each against the recording; a session stops at its first
difference. `strict=False` (for `--update-goldens`) keeps going past differences and only notes them.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterable
from typing import Any, TypeVar

from tito_rl.cassette.reader import Cassette, exchange_count
from tito_rl.recorder.targets.base import TargetError, TargetUnavailable
from tito_rl.recorder.targets.registry import TITO, TargetSpec
from tito_rl.replayer.replay.harness import Harness
from tito_rl.replayer.replay.loading import (
    ReplayInputError,
    TargetUnavailableError,
    load_cassette,
    read_session,
    recorded_target,
    replay_target,
    select_sessions,
)
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.replayer.replay.plan import plan_session
from tito_rl.replayer.replay.results import CassetteResult, SessionResult
from tito_rl.trajectory.adapters.parsing import parser_process

T = TypeVar("T")


async def replay_cassette_async(
    path: str | os.PathLike[str],
    sessions: Iterable[str] | None = None,
    options: ReplayOptions | None = None,
    missing_ok: bool = False,
) -> CassetteResult:
    options = options or ReplayOptions()
    cassette, tokenizer = load_cassette(path, options.tokenizer)
    return await replay_loaded(cassette, str(path), tokenizer, sessions, options, missing_ok)


async def replay_loaded(
    cassette: Cassette,
    path: str,
    tokenizer: str | None,
    sessions: Iterable[str] | None,
    options: ReplayOptions,
    missing_ok: bool = False,
) -> CassetteResult:
    """Replay a cassette already read by `load_cassette` (which checked its tokenizer)."""
    names = select_sessions(cassette, path, sessions, missing_ok)
    if parser_process.active() is not None:  # a short run keeps parsing through the helper
        parser_process.settle(sum(exchange_count(cassette, n) for n in names))
    spec = replay_target(cassette.header, options.target, path, options.trust_cassette)
    done = CassetteResult(
        path,
        cassette.header,
        [],
        cassette.truncated,
        all_sessions=list(cassette.sessions),
        tokenizer_dir=tokenizer,
        target=spec.text,
        recorded_target=recorded_target(cassette.header),
    )
    done.sessions = [result async for result in replay_each(cassette, path, tokenizer, names, options, spec)]
    return done


def harness_for(cassette: Cassette, path: str, tokenizer: str | None, options: ReplayOptions, spec: TargetSpec) -> Any:
    """What replays the cassette's sessions: tito's own adapter in-process, or the harness around a foreign
    target (`target_harness`). An async context manager with `replay_session(plan)` and `forget(name)` (drop
    what it kept of a session once its result is taken)."""
    if spec.kind == TITO:
        return Harness(cassette, path, tokenizer, options)
    from tito_rl.replayer.replay.target_harness import TargetHarness
    from tito_rl.trajectory.adapters.serve import parse_listen

    if spec.kind == "http" and not options.engine_listen:
        raise ReplayInputError(
            f"{path}: replaying through {spec.text} needs --engine-listen HOST:PORT, the engine "
            "URL that gateway was started with (replay serves the engine leg there)"
        )
    listen = parse_listen(options.engine_listen) if options.engine_listen else None
    return _GuardedTarget(TargetHarness(cassette, path, tokenizer, options, spec, listen))


class _GuardedTarget:
    """A target that cannot be found or started is unusable input (exit 2), said in one line."""

    def __init__(self, harness: Any) -> None:
        self.harness = harness

    async def __aenter__(self) -> Any:
        try:
            return await self.harness.__aenter__()
        except TargetUnavailable as exc:
            raise TargetUnavailableError(f"{self.harness.path}: {exc}") from None
        except TargetError as exc:
            raise ReplayInputError(f"{self.harness.path}: {exc}") from None
        except OSError as exc:  # the engine leg's port is taken
            raise ReplayInputError(f"{self.harness.path}: cannot serve the engine leg: {exc}") from None

    async def __aexit__(self, *exc: object) -> None:
        await self.harness.__aexit__(*exc)


async def replay_each(
    cassette: Cassette,
    path: str,
    tokenizer: str | None,
    names: list[str],
    options: ReplayOptions,
    spec: TargetSpec | None = None,
) -> AsyncIterator[SessionResult]:
    """The named sessions replayed, `options.jobs` at once, each yielded in the order named as soon as it and
    those before it are done. A session's records are read from the file when its replay starts and forgotten
    once it is yielded: memory holds the sessions in flight, however many the cassette has."""
    if not names:
        return
    if options.on_total is not None:
        options.on_total(sum(exchange_count(cassette, n) for n in names))
    spec = spec or replay_target(cassette.header, options.target, path, options.trust_cassette)
    async with harness_for(cassette, path, tokenizer, options, spec) as harness:
        waiting = iter(names)
        running: deque[asyncio.Task[SessionResult]] = deque()

        def start_next() -> None:
            name = next(waiting, None)
            if name is not None:
                plan = plan_session(read_session(cassette, path, name))
                if options.on_plan is not None:
                    options.on_plan(plan)
                running.append(asyncio.ensure_future(harness.replay_session(plan)))

        for _ in range(max(1, options.jobs)):
            start_next()
        try:
            while running:
                result = await running.popleft()
                harness.forget(result.session)
                start_next()
                yield result
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)


def replay_cassette(
    path: str | os.PathLike[str], sessions: Iterable[str] | None = None, options: ReplayOptions | None = None
) -> CassetteResult:
    """Replay and verify; sessions in cassette order (or as named). Raises `ReplayInputError`."""
    return run_sync(replay_cassette_async(path, sessions, options))


def run_sync(replaying: Awaitable[T]) -> T:
    """`asyncio.run`, without handing it the result: on its way out, CPython 3.11's runner asks for the
    SIGINT handler, whose repr holds the main task and so the repr of its result. For a long session's
    result (150k-token samples) that cost a third of a second."""
    from tito_rl.trajectory.runtime.server_process import new_event_loop

    box: list[T] = []

    async def main() -> None:
        box.append(await replaying)

    with asyncio.Runner(loop_factory=new_event_loop) as runner:  # uvloop, as tito's servers run on
        runner.run(main())
    return box[0]
