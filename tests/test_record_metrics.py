"""`tito record --metrics`: Prometheus metrics scraped while a recording runs (tito's adapter app in front of the
fake engine with faults: drift with splicing off, engine errors the client retries, cut generations), and the live
counts equal `tito audit` of the result, rule by rule, with coverage, tokens, sessions, turns and bytes.

slime's adapters are not installed here (no TITO_SLIME_PATH): the recordings are through tito's own adapter app
and around a gateway of another design (`tests/gateway_double.py`), with the taps, writer and live audit of any
target."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.process_helpers import free_port
from tests.test_record_run import _parts, record_run, run_scenario, sampled, sid, tito_cmd
from tito_rl.cassette.reader import read_cassette


def faulty_scenario() -> dict[str, Any]:
    spec = run_scenario(12)
    two, three = spec["sessions"]
    two["turns"][0]["faults"] = {"drift": True, "drift_splits": 3}  # non-canonical splits: with --no-splice, findings
    three["turns"][1]["faults"] = {"status": 529}  # an engine error, re-sent by the client
    three["turns"][1]["fault_attempts"] = 1
    three["turns"][2]["faults"] = {"finish_length": 4}  # a generation cut by the token limit
    return spec


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return found[(name, tuple(sorted({"target": "tito", **labels}.items())))]


def test_live_counts_scraped_during_a_recording_equal_its_audit(tmp_path: Path) -> None:
    port, scrapes, done = free_port(), [], threading.Event()

    def scrape() -> None:  # a Prometheus server's part, while the recording runs
        while not done.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
                    scrapes.append(resp.read().decode())
            except OSError:
                pass
            done.wait(0.05)

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    seen: list[Any] = []
    try:
        rc, run = asyncio.run(
            record_run(
                tmp_path,
                "--metrics",
                f"127.0.0.1:{port}",
                "--no-splice",
                "--sample-rate",
                "0.7",
                "--rotate-sessions",
                "3",
                scenario_spec=faulty_scenario(),
                seen=seen,
            )
        )
    finally:
        done.set()
        scraper.join(timeout=120)
    assert rc == 0
    assert scrapes, "no scrape answered while the recording ran"
    during = samples(scrapes[-1])
    assert value(during, "tito_record_sessions_seen_total") > 0
    final = samples(generate_latest(seen[0].metrics_recorder.registry).decode())  # what /metrics served last

    code, out, err = tito_cmd("audit", str(run), "--json")
    report = json.loads(out)
    assert code in (0, 1), err
    live = {rule: value(final, "tito_audit_findings_total", rule=rule) for rule in report["rules"]}
    audited = {rule: float(r["total"]) for rule, r in report["rules"].items()}
    assert live == audited
    assert sum(audited.values()) > 0  # the faults made findings: the equality is not of zeros alone
    assert value(final, "tito_audit_emitted_tokens_total") == sum(c["emitted"] for c in report["cassettes"]) > 0
    assert value(final, "tito_audit_covered_tokens_total") == sum(c["covered"] for c in report["cassettes"])
    assert value(final, "tito_audit_covered_tokens_total") < value(final, "tito_audit_emitted_tokens_total")

    recorded = {sid(i) for i in range(12) if sampled(sid(i), 0.7)}
    assert value(final, "tito_record_sessions_seen_total") == 12
    assert value(final, "tito_record_sessions_recorded_total") == len(recorded) < 12
    cassettes = [read_cassette(p) for p in _parts(run)]
    logs = [log for c in cassettes for log in c.sessions.values()]
    assert value(final, "tito_record_turns_recorded_total") == sum(len(log.agent) for log in logs)
    assert value(final, "tito_record_turns_seen_total") > value(final, "tito_record_turns_recorded_total")
    figures = [f for c in report["cassettes"] for f in c["session_figures"]]
    assert len(figures) == len(recorded)  # every session whole in one cassette
    prompt = 0
    for log in logs:
        for e in log.engine:
            if e.path.endswith("/generate") and e.request is not None:
                prompt += len(e.request["input_ids"])
    assert value(final, "tito_record_tokens_total", kind="prompt") == prompt
    assert value(final, "tito_record_written_bytes_total") == sum(p.stat().st_size for p in _parts(run))
    assert value(final, "tito_record_capped") == 0
    assert value(final, "tito_record_tap_seconds_count", leg="agent") > 0


def test_around_a_gateway_of_another_design_the_live_counts_equal_its_audit(tmp_path: Path) -> None:
    """The taps around a foreign target (`tests/gateway_double.py`: its own translation, prefix breaks, sampling
    overrides, engine errors turned into other statuses): the same live audit, labelled with its name."""
    seen: list[Any] = []
    asyncio.run(
        record_run(
            tmp_path,
            "--metrics",
            "127.0.0.1:0",
            "--target",
            "tests.gateway_double:create",
            scenario_spec=faulty_scenario(),
            seen=seen,
        )
    )  # a session the double fails exits 1
    final = samples(generate_latest(seen[0].metrics_recorder.registry).decode())
    code, out, err = tito_cmd("audit", str(tmp_path / "run"), "--json")
    report = json.loads(out)
    assert report["cassettes"][0]["target"] == "gateway-double"

    def live(name: str, **labels: str) -> float:
        return final[(name, tuple(sorted({"target": "gateway-double", **labels}.items())))]

    audited = {rule: float(r["total"]) for rule, r in report["rules"].items()}
    assert {rule: live("tito_audit_findings_total", rule=rule) for rule in audited} == audited
    assert audited["prefix-break"] > 0 and audited["sampling-override"] > 0
    assert live("tito_audit_emitted_tokens_total") == report["cassettes"][0]["emitted"] > 0
    assert live("tito_audit_covered_tokens_total") == report["cassettes"][0]["covered"]
    assert live("tito_record_sessions_recorded_total") == report["cassettes"][0]["sessions"] == 12
