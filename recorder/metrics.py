"""`tito record --metrics HOST:PORT`: the recording's live figures for Prometheus (`prometheus_client`), one
registry of its own served on its own thread, so a scrape never waits on the proxy's event loop.

The metrics, their labels (`target`; `rule`, `kind`, `leg`) and a dashboard's queries: docs/recording.md#live-metrics.

The findings, coverage and token counts come from the writer process, where `tito audit`'s rules see each record
as it is written (the command names them: `tito_rl.commands`, `tito_rl.replayer.audit.live`); the rest is counted
here, on the proxy's side of the writer's pipe.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from tito_rl.recorder.taps.sampling import sampled
from tito_rl.trajectory.adapters.tap import AgentExchange, EngineExchange, TrafficTap, tell_engine_event

# Tap calls take tens of microseconds (a msgpack pack and a pipe write); the upper buckets catch a writer behind.
TAP_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.1, 1.0)


class RecordMetrics:
    def __init__(self, target: str) -> None:
        self.target = target
        self.registry = CollectorRegistry(auto_describe=True)
        r, t = self.registry, ("target",)
        self.sessions_seen = Counter("tito_record_sessions_seen", "Sessions that reached the proxy", t, registry=r)
        self.sessions_recorded = Counter(
            "tito_record_sessions_recorded", "Sessions recorded (sampled, not past --max-bytes)", t, registry=r
        )
        self.turns_seen = Counter("tito_record_turns_seen", "Agent exchanges answered", t, registry=r)
        self.turns_recorded = Counter(
            "tito_record_turns_recorded", "Agent exchanges of recorded sessions", t, registry=r
        )
        self.tokens = Counter(
            "tito_record_tokens", "Engine tokens recorded, as tito audit reads them", ("target", "kind"), registry=r
        )
        self.findings = Counter(
            "tito_audit_findings", "tito audit findings, counted as sessions finish", ("target", "rule"), registry=r
        )
        self.emitted = Counter("tito_audit_emitted_tokens", "Emitted tokens of finished sessions", t, registry=r)
        self.covered = Counter(
            "tito_audit_covered_tokens", "Emitted tokens trained exactly once with the engine's logprob", t, registry=r
        )
        self.stale_tokens = Counter(
            "tito_audit_stale_tokens",
            "Tokens of finished sessions' samples more weight versions behind the sample's newest than "
            '--max-staleness allows (the samples: tito_audit_findings{rule="stale-tokens"})',
            t,
            registry=r,
        )
        self.engine_events = Counter(
            "tito_record_engine_events",
            "Engine calls of no session recorded (a trainer's weight updates, pauses, aborts)",
            t,
            registry=r,
        )
        self.tap_seconds = Histogram(
            "tito_record_tap_seconds",
            "Time a tap call takes on the proxy's event loop",
            ("target", "leg"),
            buckets=TAP_BUCKETS,
            registry=r,
        )
        self.written = Counter("tito_record_written_bytes", "Cassette bytes written", t, registry=r)
        self.capped = Gauge("tito_record_capped", "1 once --max-bytes stopped the recording", t, registry=r)
        for kind in ("prompt", "output"):
            self.tokens.labels(target, kind)
        for counter in (
            self.sessions_seen,
            self.sessions_recorded,
            self.turns_seen,
            self.turns_recorded,
            self.emitted,
            self.covered,
            self.stale_tokens,
            self.engine_events,
            self.written,
        ):
            counter.labels(target)
        self.capped.labels(target).set(0)
        self._bytes = 0
        self._server: Any = None

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on HOST:PORT (port 0: a free one); returns the port."""
        self._server, _ = start_http_server(port, host, registry=self.registry)
        return int(self._server.server_port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def writer_event(self, event: dict[str, Any]) -> None:
        """A report of the writer process (`tito_rl.cassette.writer_process`), in the thread that reads them."""
        kind, target = event.get("event"), self.target
        if "bytes" in event and int(event["bytes"]) > self._bytes:
            self.written.labels(target).inc(int(event["bytes"]) - self._bytes)
            self._bytes = int(event["bytes"])
        if kind == "capped":
            self.capped.labels(target).set(1)
        elif kind == "rules":
            for rule in event.get("rules", ()):
                self.findings.labels(target, rule)
        elif kind == "audit":
            for key, added in event.get("added", {}).items():
                if key == "emitted":
                    self.emitted.labels(target).inc(added)
                elif key == "covered":
                    self.covered.labels(target).inc(added)
                elif key == "stale_tokens":
                    self.stale_tokens.labels(target).inc(added)
                elif key in ("prompt_tokens", "output_tokens"):
                    self.tokens.labels(target, key.removesuffix("_tokens")).inc(added)
                else:
                    self.findings.labels(target, key).inc(added)


class MetricsTap:
    """Counts sessions and turns seen and recorded, and times what the rest of the chain (`inner`: sampling, the
    writer's pipe) takes on the event loop. `capped()`: whether the writer stopped at `--max-bytes`."""

    def __init__(
        self, inner: TrafficTap, metrics: RecordMetrics, sample_rate: float, capped: Callable[[], bool]
    ) -> None:
        self.inner, self.metrics, self.rate, self.capped = inner, metrics, sample_rate, capped
        self._live: set[str] = set()  # sessions seen and not yet finished or dropped
        t = metrics.target
        self._seen, self._recorded = metrics.sessions_seen.labels(t), metrics.sessions_recorded.labels(t)
        self._turns, self._turns_recorded = metrics.turns_seen.labels(t), metrics.turns_recorded.labels(t)
        self._legs = {leg: metrics.tap_seconds.labels(t, leg) for leg in ("agent", "engine", "finish")}

    def _recording(self, session: str) -> bool:
        return sampled(session, self.rate) and not self.capped()

    def _see(self, session: str) -> None:
        if session not in self._live:
            self._live.add(session)
            self._seen.inc()
            if self._recording(session):
                self._recorded.inc()

    def _timed(self, leg: str, call: Callable[..., None], *args: Any) -> None:
        started = time.perf_counter()
        call(*args)
        self._legs[leg].observe(time.perf_counter() - started)

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        self._see(session)
        self._timed("agent", self.inner.agent_request, session, source, headers)

    def agent_exchange(self, session: str, source: str, exchange: AgentExchange) -> None:
        self._see(session)
        self._turns.inc()
        if self._recording(session):
            self._turns_recorded.inc()
        self._timed("agent", self.inner.agent_exchange, session, source, exchange)

    def engine_exchange(self, session: str, source: str, exchange: EngineExchange) -> None:
        self._see(session)
        self._timed("engine", self.inner.engine_exchange, session, source, exchange)

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        self._live.discard(session)
        self._timed("finish", self.inner.session_finished, session, source, reward, samples)

    def session_dropped(self, session: str, source: str) -> None:
        self._live.discard(session)
        self._timed("finish", self.inner.session_dropped, session, source)

    def engine_event(self, exchange: EngineExchange) -> None:
        self.metrics.engine_events.labels(self.metrics.target).inc()
        self._timed("engine", tell_engine_event, self.inner, exchange)

    def flush(self) -> None:
        flush = getattr(self.inner, "flush", None)
        if flush is not None:
            flush()
