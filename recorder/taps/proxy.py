"""The recording proxy: the adapter app in front of an upstream engine, with a cassette writer on both legs.

Agents talk to it exactly as to `tito serve`; every completed exchange is appended to the cassette as it
happens (so a crash loses at most the exchange in flight), and a graceful stop finalizes the sessions
still open (their samples are written with reward 0) before closing the file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from tito_rl.cassette.format.records import Header
from tito_rl.cassette.writer import CassetteWriter, PerSessionTap
from tito_rl.cassette.writer_process import Layout, WriterProcessTap
from tito_rl.recorder.taps.progress import ProgressTap
from tito_rl.recorder.taps.sampling import SamplingTap
from tito_rl.recorder.taps.trainer_tap import TRAINER_TAP_KEY, TrainerTap
from tito_rl.trajectory.adapters.app import ADAPTER_KEY, AdapterSettings, create_app
from tito_rl.trajectory.adapters.engine.routes_layout import fetch_server_info
from tito_rl.trajectory.adapters.tap import TrafficTap
from tito_rl.trajectory.tokens.tokenizer import fingerprint

SECRET_SETTINGS = ("client_session_factory", "rid_factory", "clock")


async def fetch_engine_info(engine_url: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The engine's /model_info (or the pre-0.5.6 /get_model_info) for the header; None if unreachable."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for path in ("/model_info", "/get_model_info"):
            try:
                async with http.get(engine_url.rstrip("/") + path) as resp:
                    if resp.status == 200:
                        info = await resp.json(content_type=None)
                        return info if isinstance(info, dict) else None
            except ValueError:  # not JSON: try the older route
                continue
            except (aiohttp.ClientError, TimeoutError):
                return None  # unreachable: the other route would be too
    return None


# The engine's start arguments a recording keeps (`Header.extra["engine_server_info"]`): the audit's
# `routes-never-asked` reads whether the engine served expert routes that a gateway never asked for.
KEPT_SERVER_ARGS = ("enable_return_routed_experts",)


async def fetch_server_args(engine_url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The `KEPT_SERVER_ARGS` an SGLang engine's `/server_info` (or `/get_server_info`) sets true; {} where it sets
    none or does not answer, so a recording's header changes only for an engine started with them."""
    info = await fetch_server_info(engine_url, timeout_s) or {}
    return {key: True for key in KEPT_SERVER_ARGS if info.get(key) is True}


def adapter_settings_dict(settings: AdapterSettings) -> dict[str, Any]:
    data = {k: v for k, v in asdict(settings).items() if k not in SECRET_SETTINGS}
    plain: dict[str, Any] = json.loads(json.dumps(data, default=str))
    return plain


def build_header(
    settings: AdapterSettings,
    engine: dict[str, Any] | None,
    agent: dict[str, Any] | None = None,
    created: str | None = None,
    manager: Any = None,
) -> Header:
    """`manager`: the TrajectoryManager the proxy feeds (its settings go in `adapter.manager`); None: defaults."""
    if manager is None:
        from tito_rl.trajectory.manager import TrajectoryManager

        manager = TrajectoryManager()
    header = Header(
        tokenizer_fingerprint=fingerprint(settings.tokenizer_dir),
        parsers={"reasoning": settings.reasoning_parser, "tool_call": settings.tool_parser},
        adapter={**adapter_settings_dict(settings), "manager": manager.settings()},
        agent=agent,
        engine=engine,
    )
    if created is not None:
        header.created = created
    return header


def open_tap(
    out: Path, header: Header, layout: Layout, on_event: Callable[[dict[str, Any]], None] | None = None
) -> WriterProcessTap:
    """The recording proxy's tap: a writer process, so recording is off the event loop (`writer_process`)."""
    return WriterProcessTap(out, header, layout=layout, on_event=on_event)


def recorded_tap(
    tap: TrafficTap,
    progress: TextIO | None = None,
    sample_rate: float = 1.0,
    wrap: Callable[[TrafficTap], TrafficTap] | None = None,
) -> TrafficTap:
    """What the proxy's traffic goes through: `wrap` (the metrics), the progress line (every session), then the
    sampling (`--sample-rate`), then the writer."""
    sampled: TrafficTap = SamplingTap(tap, sample_rate) if sample_rate < 1.0 else tap
    counted = ProgressTap(sampled, progress) if progress is not None else sampled
    return wrap(counted) if wrap is not None else counted


def create_recording_app(
    settings: AdapterSettings,
    tap: CassetteWriter | PerSessionTap | WriterProcessTap,
    progress: TextIO | None = None,
    manager: Any = None,
    sample_rate: float = 1.0,
    wrap: Callable[[TrafficTap], TrafficTap] | None = None,
) -> web.Application:
    """The adapter app with `tap` on both legs; closing the app finalizes open sessions and the cassette. Its
    `TRAINER_TAP_KEY` holds the trainer's engine URL's tap (`trainer_tap`), whose app the caller serves."""
    counted = recorded_tap(tap, progress, sample_rate, wrap)
    app = create_app(settings, manager=manager, tap=counted)
    # the trainer's engine URL (its app served beside this one): its updates are placed among the adapter's calls
    trainer = TrainerTap(counted, settings.engine_url, settings.engine_dialect)
    app[ADAPTER_KEY].engine.order = trainer.next_order
    app[TRAINER_TAP_KEY] = trainer

    @web.middleware
    async def refuse_once_recording_failed(request: web.Request, handler: Handler) -> web.StreamResponse:
        # Traffic that is not recorded is worse than none: agents and /health get the reason instead.
        failure = getattr(tap, "failure", None)
        if failure:
            return web.json_response(
                {"type": "error", "error": {"type": "recording_failed", "message": failure}}, status=503
            )
        return await handler(request)

    app.middlewares.append(refuse_once_recording_failed)

    async def finalize(app: web.Application) -> None:
        adapter = app[ADAPTER_KEY]
        for sid in list(adapter.manager.sessions()):
            samples = [s.to_dict(arrays=True) for s in adapter.manager.finish(sid, 0.0)]
            counted.session_finished(sid, "api", 0.0, samples)
        flush = getattr(counted, "flush", None)
        if flush is not None:  # the progress line's last counts
            flush()
        tap.close()

    app.on_shutdown.append(finalize)
    return app
