"""The recording proxy: the adapter app in front of an upstream engine, with a cassette writer on both legs.

Agents talk to it exactly as to `tito serve`; every completed exchange is appended to the cassette as it
happens (so a crash loses at most the exchange in flight), and a graceful stop finalizes the sessions
still open (their samples are written with reward 0) before closing the file.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from aiohttp import web

from recorder.cassette_format import Header
from recorder.cassette_writer import CassetteWriter
from recorder.progress import ProgressTap
from recorder.redaction import Redactor
from trajectory.adapters.app import ADAPTER_KEY, AdapterSettings, create_app
from trajectory.adapters.tap import AgentExchange, EngineExchange, TrafficTap
from trajectory.tokenizer import fingerprint

CASSETTE_SUFFIX = ".tito"
SECRET_SETTINGS = ("client_session_factory", "rid_factory", "clock")


async def fetch_engine_info(engine_url: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """The engine's /model_info (or the pre-0.5.6 /get_model_info) for the header; None if unreachable."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for path in ("/model_info", "/get_model_info"):
            try:
                async with http.get(engine_url.rstrip("/") + path) as resp:
                    if resp.status == 200:
                        return await resp.json(content_type=None)
            except ValueError:  # not JSON: try the older route
                continue
            except (aiohttp.ClientError, TimeoutError):
                return None  # unreachable: the other route would be too
    return None


def adapter_settings_dict(settings: AdapterSettings) -> dict[str, Any]:
    data = {k: v for k, v in asdict(settings).items() if k not in SECRET_SETTINGS}
    return json.loads(json.dumps(data, default=str))


def build_header(settings: AdapterSettings, engine: dict[str, Any] | None, agent: dict[str, Any] | None = None,
                 created: str | None = None) -> Header:
    header = Header(
        tokenizer_fingerprint=fingerprint(settings.tokenizer_dir),
        parsers={"reasoning": settings.reasoning_parser, "tool_call": settings.tool_parser},
        adapter=adapter_settings_dict(settings),
        agent=agent,
        engine=engine,
    )
    if created is not None:
        header.created = created
    return header


class PerSessionTap:
    """One cassette per session, in a folder: `<session name>.tito`, named as the cassette names it."""

    def __init__(self, folder: Path, header: Header, redactor: Redactor | None = None) -> None:
        self.folder = folder
        self.header = header
        self.redactor = redactor or Redactor()
        self.writers: dict[str, CassetteWriter] = {}
        folder.mkdir(parents=True, exist_ok=True)

    def _writer(self, session: str, source: str) -> CassetteWriter:
        writer = self.writers.get(session)
        if writer is None:
            name = self.redactor.session_name(session, source)
            writer = self.writers[session] = CassetteWriter(self.folder / f"{name}{CASSETTE_SUFFIX}", self.header,
                                                            self.redactor)
        return writer

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self._writer(session, source).agent_request(session, source, headers)

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        self._writer(session, source).agent_exchange(session, source, exchange)

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        self._writer(session, source).engine_exchange(session, source, exchange)

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self._writer(session, source).session_finished(session, source, reward, samples)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


def open_tap(out: Path, header: Header, per_session: bool) -> CassetteWriter | PerSessionTap:
    return PerSessionTap(out, header) if per_session else CassetteWriter(out, header)


def create_recording_app(settings: AdapterSettings, tap: CassetteWriter | PerSessionTap,
                         progress: TextIO | None = None, manager: Any = None) -> web.Application:
    """The adapter app with `tap` on both legs; closing the app finalizes open sessions and the cassette."""
    counted: TrafficTap = ProgressTap(tap, progress) if progress is not None else tap
    app = create_app(settings, manager=manager, tap=counted)

    async def finalize(app: web.Application) -> None:
        adapter = app[ADAPTER_KEY]
        for sid in list(adapter.manager.sessions()):
            samples = [s.to_dict() for s in adapter.manager.finish(sid, 0.0)]
            counted.session_finished(sid, "api", 0.0, samples)
        tap.close()

    app.on_shutdown.append(finalize)
    return app
