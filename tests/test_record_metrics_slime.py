"""`tito record --metrics` around slime's adapters (issue #40, point 2): /metrics scraped over HTTP while a recording
runs and once more as it ends, with the fake engine's faults (an engine restart, a dropped connection, a 529, an
abort, a cut by the token limit, non-canonical token splits) and a client that walks away mid-generation; every
rule's live count equals `tito audit` of the finished cassette, per rule, under the target's label.

The slime test needs a slime checkout (`TITO_SLIME_PATH=/path/to/slime`, or slime on the path) and is skipped with
that reason elsewhere. The same scenario and the same assertions run in CI around the gateway double
(`tests/gateway_double.py`: like slime, it re-renders the whole history from the messages every turn).

What slime shows here (slime main at 624b824a): its stop token in every text reply, `max_tokens` capped at 4096,
the 529 answered as a bare 500, the chat client's echo realigned away (never trained) and the client's walk-away
as a 499. slime writes a turn only after its reply is flushed and only when the engine answered, so no engine-side
fault makes it train a turn twice: its trained-twice retries need the client to lose a reply slime already sent
and re-send it, a stream cut between client and gateway, which the scripted client cannot do; the second slime test
records that with the real Claude Code CLI (`cassettes/targets/scenarios/slime_retry.yaml`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.process_helpers import ROOT
from tests.target_support import slime_missing
from tests.test_record_metrics import samples
from tests.test_record_run import record_run, tito_cmd
from tito_rl.recorder.metrics import RecordMetrics

SLIME_RETRY = ROOT / "cassettes" / "targets" / "scenarios" / "slime_retry.yaml"
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]
RETRY = {"retries": 10, "retry_delay_ms": 200.0}  # the restart lasts 0.4 s: re-sends outlast it


def _loop(k: int, last: str) -> list[dict[str, Any]]:
    """`k` tool turns, then a text answer."""
    steps: list[dict[str, Any]] = [
        {
            "reasoning": f"Step {i}: read the next part.",
            "text": f"Reading part {i}.",
            "tool_calls": [{"name": "shell", "arguments": {"command": f"cat part_{i}.py", "description": "Read"}}],
        }
        for i in range(k)
    ]
    return [*steps, {"reasoning": "All parts read.", "text": last}]


def faulty_slime_scenario() -> dict[str, Any]:
    """Six sessions on slime's two wires (Anthropic and OpenAI chat, JSON and SSE), each with its fault; the
    engine tells them apart by slime's routing key (the session id)."""
    engine = [
        {"match": {"routing_key": "m-529"}, "turns": _loop(2, "Done after the overload.")},
        {"match": {"routing_key": "m-drift"}, "turns": _loop(2, "Done despite the split tokens.")},
        {"match": {"routing_key": "m-drop"}, "turns": _loop(1, "Done after the dropped connection.")},
        {"match": {"routing_key": "m-restart"}, "turns": _loop(2, "Done after the restart.")},
        {"match": {"routing_key": "m-cut"}, "turns": _loop(2, "Done after the cut.")},
        {"match": {"routing_key": "m-walk"}, "turns": _loop(1, "Done after the walk-away.")},
    ]
    engine[0]["turns"][1]["faults"] = {"status": 529, "message": "Overloaded"}
    engine[0]["turns"][1]["fault_attempts"] = 1
    engine[1]["turns"][0]["faults"] = {"drift": True, "drift_splits": 3}  # slime re-tokenizes: a retokenized break
    engine[1]["turns"][1]["faults"] = {"drift": True, "drift_splits": 2}
    engine[2]["turns"][0]["faults"] = {"drop_connection": True}
    engine[2]["turns"][0]["fault_attempts"] = 1
    engine[3]["turns"][1]["faults"] = {"restart_s": 0.4}
    engine[3]["turns"][1]["fault_attempts"] = 1
    engine[2]["turns"][1].update(finish="abort", length=3)  # the answer aborted by the engine
    engine[4]["turns"][2].update(finish="length", length=4)  # the answer cut by the token limit
    engine[5]["turns"][0]["faults"] = {"token_delay_ms": 40}  # slow enough for the client to walk away from
    engine[5]["turns"][0]["fault_attempts"] = 1

    def session(sid: str, wire: str, stream: bool, **extra: Any) -> dict[str, Any]:
        return {
            "id": sid,
            "wire": wire,
            "stream": stream,
            "system": "You are a coding agent working in /work. Use the tools; be brief.",
            "tools": ["Bash"] if wire == "anthropic" else ["run_shell_command"],
            "results": {"Bash": {"lines": 2}, "run_shell_command": {"lines": 2}},
            "steps": [{"prompt": f"Read the parts ({sid}).", "max_turns": 5}, {"finish": 1.0}],
            **RETRY,
            **extra,
        }

    clients = [
        session("m-529", "anthropic", True),
        session("m-drift", "anthropic", False),
        session("m-drop", "chat", False),
        session("m-restart", "chat", True),
        session("m-cut", "anthropic", True),
        session("m-walk", "chat", True, disconnects=[{"request": 0, "after_ms": 150, "resend_after_ms": 100}]),
    ]
    return {
        "name": "slime_metrics_faults",
        "after_last": "error",
        "sessions": engine,
        "client": {"concurrency": 6, "sessions": clients},
    }


def scrape_url(url: str) -> Scrape:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return samples(resp.read().decode())


def record_scraped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str, spec: dict[str, Any] | None = None
) -> tuple[list[Scrape], Scrape, Path]:
    """The faulty scenario (or `spec`) recorded with `--metrics`: the scrapes taken over HTTP while it ran, the one
    taken once the cassette was closed (just before the metrics server stops), and the recording."""
    from tests.process_helpers import free_port

    port, during, done = free_port(), [], threading.Event()
    url = f"http://127.0.0.1:{port}/metrics"
    after: list[Scrape] = []
    stop = RecordMetrics.stop

    def scrape_then_stop(self: RecordMetrics) -> None:  # the recording is over, its cassette closed
        if self._server is not None:
            after.append(scrape_url(url))
        stop(self)

    monkeypatch.setattr(RecordMetrics, "stop", scrape_then_stop)

    def scrape() -> None:  # a Prometheus server's part, while the recording runs
        while not done.is_set():
            with contextlib.suppress(OSError):
                during.append(scrape_url(url))
            done.wait(0.05)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        _, run = asyncio.run(
            record_run(
                tmp_path, "--metrics", f"127.0.0.1:{port}", *flags, scenario_spec=spec or faulty_slime_scenario()
            )
        )
    finally:
        done.set()
        scraper.join(timeout=120)
    assert len(after) == 1, "no scrape answered once the recording ended"
    return during, after[0], run


def assert_live_equals_audit(
    during: list[Scrape], after: Scrape, run: Path, target: str, sessions: int = 6
) -> dict[str, float]:
    """Each rule's count under `target`, scraped at the end, equals `tito audit --json` of the recording; the
    counts never went down while it ran; returns the audit's counts."""
    code, out, err = tito_cmd("audit", str(run), "--json", "--fail-on", "")
    assert code == 0, err
    report = json.loads(out)
    assert {c["target"] for c in report["cassettes"]} == {target}

    def at(scrape: Scrape, name: str, **labels: str) -> float:
        return scrape.get((name, tuple(sorted({"target": target, **labels}.items()))), 0.0)

    audited = {rule: float(found["total"]) for rule, found in report["rules"].items()}
    live = {rule: at(after, "tito_audit_findings_total", rule=rule) for rule in audited}
    assert live == audited
    labelled = {dict(labels)["target"] for (name, labels) in after if name == "tito_audit_findings_total"}
    assert labelled == {target}  # one target label, the recording's
    for rule in audited:  # counters: each scrape during the run at most the next, at most the end
        seen = [at(s, "tito_audit_findings_total", rule=rule) for s in during] + [live[rule]]
        assert seen == sorted(seen), rule
    assert at(after, "tito_audit_emitted_tokens_total") == sum(c["emitted"] for c in report["cassettes"]) > 0
    assert at(after, "tito_audit_covered_tokens_total") == sum(c["covered"] for c in report["cassettes"])
    assert (
        at(after, "tito_record_sessions_recorded_total") == sum(c["sessions"] for c in report["cassettes"]) == sessions
    )
    assert any(at(s, "tito_record_sessions_seen_total") > 0 for s in during), "no scrape during the recording"
    return audited


@pytest.mark.skipif(slime_missing() is not None, reason=f"needs slime: {slime_missing()}")
def test_around_slime_with_faults_the_scraped_counts_equal_its_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    during, after, run = record_scraped(tmp_path, monkeypatch, "--target", "slime")
    audited = assert_live_equals_audit(during, after, run, "slime")
    # slime's own findings (docs/conformance.md, findings for slime's maintainers), counted live
    assert audited["stop-token-leak"] > 0  # <|im_end|> kept in the reply text (4)
    assert audited["sampling-override"] > 0  # max_tokens 32000 -> 4096 (8)
    assert audited["status-changed"] > 0  # the 529 as a bare 500 (6), the walk-away as 499
    assert audited["never-trained"] > 0  # the chat echo without reasoning, realigned away (3)
    assert audited["prefix-break"] > 0


@pytest.mark.skipif(slime_missing() is not None, reason=f"needs slime: {slime_missing()}")
def test_around_slime_a_reply_cut_after_its_flush_is_trained_twice_and_counted_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """slime's trained-twice retry, live: Claude Code's second reply stream is cut after slime flushed and recorded
    it (`slime_retry.yaml`: a network fault between client and gateway); Claude Code re-sends the identical body
    and slime generates and trains the turn again."""
    from tito_rl.recorder.agents.install import ensure_installed
    from tito_rl.recorder.agents.pins import pin_for

    ensure_installed(pin_for("claude-code"))  # as `tito simulate` does; a cached install is a stat
    spec = yaml.safe_load(SLIME_RETRY.read_text(encoding="utf-8"))
    flags = ("--agent", "claude-code", *spec["client"]["record_args"])  # --target slime --reward 1
    during, after, run = record_scraped(tmp_path, monkeypatch, *flags, spec=spec)
    audited = assert_live_equals_audit(during, after, run, "slime", sessions=1)
    assert audited["trained-twice"] > 0 and audited["regenerated-retry"] == 1
    assert audited["stop-token-leak"] > 0


def test_around_the_gateway_double_with_the_same_faults_the_scraped_counts_equal_its_audit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI's run of the slime test's scenario and assertions, where slime is absent."""
    during, after, run = record_scraped(tmp_path, monkeypatch, "--target", "tests.gateway_double:create")
    audited = assert_live_equals_audit(during, after, run, "gateway-double")
    assert audited["prefix-break"] > 0 and audited["sampling-override"] > 0
