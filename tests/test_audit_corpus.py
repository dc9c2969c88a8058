"""`tito audit` on real traffic: the recording around slime's adapters names the findings of the conformance
page that its traffic shows, with counts checked by hand against the cassette (the raw reading below, and
`docs/audit.md`); tito's own corpus audits clean but for what its goldens name, allowed beside each cassette."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tito_rl.cassette.reader import read_cassette
from tito_rl.main import main
from tito_rl.replayer.audit.runner import audit_cassette

ROOT = Path(__file__).resolve().parent.parent
SLIME = ROOT / "cassettes" / "targets" / "slime_mixed.tito"
CHAT_JSON, ANTHROPIC_SSE = "sid-5346e1448571e0ae", "sid-1fd23b8ccaa7578b"
ANTHROPIC_JSON, CHAT_SSE = "sid-2cf8b929beef4a8d", "sid-3b744b5fbd16904e"


def test_hand_counts_from_the_raw_records() -> None:
    """The figures the audit must give, read off the records with no audit code: what the numbers below rest on."""
    cassette = read_cassette(SLIME)
    capped = leaks = errors = emitted = trained = 0
    for log in cassette.sessions.values():
        for call in log.engine:
            capped += call.request["sampling_params"].get("max_new_tokens") == 4096
            emitted += len(call.response["output_ids"]) if call.status == 200 else 0
        for exchange in log.agent:
            raw = (exchange.reply_body or b"").decode() + "".join(exchange.reply_events or [])
            leaks += "<|im_end|>" in raw
            errors += exchange.status == 500
        trained += sum(sum(s["loss_mask"]) for s in log.samples)
    assert (capped, leaks, errors, emitted, trained) == (17, 5, 2, 642, 442)
    chat_sse = cassette.sessions[CHAT_SSE]
    assert chat_sse.engine[0].response["text"].count("<tool_call>") == 2
    events = chat_sse.agent[0].reply_events
    assert events is not None and "".join(events).count('"name": "read_file"') == 1
    # the chat sessions' earlier turns: emitted, in no sample's trained tokens (slime realigned them)
    assert [len(e.response["output_ids"]) for e in cassette.sessions[CHAT_JSON].engine if e.status == 200] == [
        46,
        49,
        36,
    ]
    assert [len(e.response["output_ids"]) for e in chat_sse.engine] == [60, 45, 21]
    assert [sum(s["loss_mask"]) for s in cassette.sessions[CHAT_JSON].samples] == [36]
    assert [sum(s["loss_mask"]) for s in chat_sse.samples] == [21]


def test_slime_recording_names_the_conformance_findings() -> None:
    audit = audit_cassette(SLIME)
    rules = audit.findings.rules
    # coverage lost to realigns: the chat sessions' earlier turns (46 + 49 and 60 + 45 tokens)
    assert (audit.covered, audit.emitted) == (442, 642)
    assert rules["coverage"].sessions == {CHAT_JSON: 95, CHAT_SSE: 105}
    assert rules["never-trained"].kinds == {"realign": 200}
    assert audit.findings.figures[ANTHROPIC_SSE].coverage == 1.0
    # the stop token the agent reads: every final answer
    assert rules["stop-token-leak"].total == 5 and rules["stop-token-leak"].kinds == {"<|im_end|>": 5}
    assert rules["stop-token-leak"].sessions == {CHAT_JSON: 1, ANTHROPIC_SSE: 2, ANTHROPIC_JSON: 1, CHAT_SSE: 1}
    # the chat wire's lost second call, and the text before the calls
    assert rules["tool-call-lost"].sessions == {CHAT_SSE: 1}
    assert rules["text-dropped"].sessions == {CHAT_JSON: 1, CHAT_SSE: 1}
    # max_new_tokens capped at 4096 where the client asked 32000, on every generation
    assert rules["sampling-override"].total == 17 and rules["sampling-override"].kinds == {"max_tokens": 17}
    assert rules["sampling-override"].examples[0].detail == "max_tokens 32000 → 4096"
    # the engine's 529 reaches the agent as a 500
    assert rules["status-changed"].kinds == {"529 → 500": 2}
    # reasoning dropped from the prompt (conformance findings 2 and 3): the first differing tokens
    breaks = {(e.session, e.exchange): (e.token, e.detail.split(":")[0]) for e in rules["prefix-break"].examples}
    assert rules["prefix-break"].total == 5 and rules["prefix-break"].sessions == {
        CHAT_JSON: 2,
        CHAT_SSE: 2,
        ANTHROPIC_SSE: 1,
    }
    assert breaks[(CHAT_SSE, 2)] == (303, "reasoning-dropped")
    # the retries re-send a request the engine answered with 529: nothing was generated, so nothing is generated
    # again or trained twice (slime_retry below is the traffic that does)
    assert not rules["regenerated-retry"].fired and not rules["trained-twice"].fired
    assert not rules["trained-not-emitted"].fired and not rules["logprob-mismatch"].fired


def test_slime_recording_exits_1_on_its_findings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(SLIME), "--fail-on", "stop-token-leak,tool-call-lost,never-trained"]) == 1
    text = capsys.readouterr().out
    assert "FAIL stop-token-leak: 5 reply(ies) in 4 session(s)" in text
    assert "FAIL tool-call-lost: 1 tool call(s) in 1 session(s)" in text
    assert main(["audit", str(SLIME)]) == 0  # the default --fail-on: none of its rules fires here


def test_titos_corpus_is_clean_but_for_what_its_goldens_name(capsys: pytest.CaptureFixture[str]) -> None:
    from tito_rl.replayer.audit.protocol import RULES

    assert main(["audit", str(ROOT / "cassettes"), "--json", "--fail-on", ",".join(RULES)]) == 0
    out = json.loads(capsys.readouterr().out)
    for cassette in out["cassettes"]:
        fired = {r for r, res in cassette["rules"].items() if res["total"]}
        assert fired <= set(cassette["allowed"]), (cassette["path"], fired)
    by_name = {Path(c["path"]).stem: c for c in out["cassettes"]}
    drift = by_name["drift_realign"]
    assert (drift["covered"], drift["emitted"]) == (21, 64)  # its golden: trained 21, emitted 64, coverage 0.328
    assert drift["rules"]["never-trained"]["kinds"] == {"realign": 43}
    assert all(c["coverage"] in (1.0, None) for n, c in by_name.items() if n != "drift_realign")


RETRY = ROOT / "cassettes" / "targets" / "slime_retry.tito"


def test_retry_hand_counts_from_the_raw_records() -> None:
    """slime_retry read with no audit code: Claude Code's re-send of exchange 1 (its reply stream cut after slime
    flushed it) generated again with the same 44 tokens, and both generations are trained, one per sample."""
    log = next(iter(read_cassette(RETRY).sessions.values()))
    outputs = [call.response["output_ids"] for call in log.engine]
    assert [len(o) for o in outputs] == [62, 44, 44, 18] and outputs[1] == outputs[2]
    assert [call.request["input_ids"] for call in log.engine][1] == log.engine[2].request["input_ids"]
    assert [e.retry_of for e in log.agent] == [None, None, 1, None]
    assert [e.status for e in log.agent] == [200, 200, 200, 200]
    assert [sum(s["loss_mask"]) for s in log.samples] == [124, 44]  # 62 + 44 + 18, and the retried turn again
    second = log.samples[1]
    response = second["tokens"][len(second["tokens"]) - second["response_length"] :]
    assert [t for t, m in zip(response, second["loss_mask"], strict=True) if m] == outputs[1]
    assert sum(call.request["sampling_params"]["max_new_tokens"] == 4096 for call in log.engine) == 4
    assert "<|im_end|>" in "".join(log.agent[3].reply_events or [])


def test_slime_retry_names_the_retry_trained_twice() -> None:
    audit = audit_cassette(RETRY)
    rules = audit.findings.rules
    (session,) = audit.findings.figures
    # each generation is trained once: the fake engine's re-generation has the same ids, traced to its own sample
    assert (audit.covered, audit.emitted) == (168, 168)
    assert rules["trained-twice"].total == 44 and rules["trained-twice"].kinds == {"retry": 44}
    example = rules["trained-twice"].examples[0]
    assert (example.exchange, example.seq) == (2, 5)
    assert rules["regenerated-retry"].total == 1 and rules["regenerated-retry"].sessions == {session: 1}
    assert rules["regenerated-retry"].examples[0].seq == 6  # the re-send's agent record
    assert rules["stop-token-leak"].kinds == {"<|im_end|>": 1}
    assert rules["sampling-override"].kinds == {"max_tokens": 4}
    assert not rules["never-trained"].fired and not rules["trained-not-emitted"].fired
    assert not rules["logprob-mismatch"].fired and not rules["prefix-break"].fired


def test_slime_retry_exits_1_and_so_does_the_targets_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", str(RETRY)]) == 1
    assert "FAIL trained-twice: 44 token(s) in 1 session(s): retry 44" in capsys.readouterr().out
    assert main(["audit", str(ROOT / "cassettes" / "targets"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    by_name = {Path(c["path"]).stem: c for c in out["cassettes"]}
    assert by_name["slime_retry"]["failing"] == ["trained-twice"] and by_name["slime_mixed"]["failing"] == []
    mixed = by_name["slime_mixed"]["rules"]
    assert mixed["stop-token-leak"]["total"] == 5 and mixed["tool-call-lost"]["total"] == 1
    assert mixed["never-trained"]["kinds"] == {"realign": 200}
    assert by_name["slime_moe"]["rules"]["stop-token-leak"]["total"] == 1  # slime's chat reply around the MoE engine
    assert out["rules"]["trained-twice"]["total"] == 44 and out["rules"]["stop-token-leak"]["total"] == 7


def test_the_slime_scenario_recorded_through_tito_audits_clean(tmp_path: Path) -> None:
    """The same clients, policy and faults as `slime_mixed.tito` (its scenario), recorded live through tito's
    adapter instead: every emitted token trained once with its logprob, no leak, no lost call, no override, the
    529s passed on as 529: exit 0, and no rule fires at all."""
    from tito_rl.recorder.simulate import simulate

    out = tmp_path / "slime_mixed_through_tito.tito"
    simulate(ROOT / "cassettes" / "targets" / "scenarios" / "slime_mixed.yaml", out, target="tito", golden=False)
    result = audit_cassette(out)
    assert result.sessions == 4
    assert (result.covered, result.emitted) == (result.emitted, result.emitted) and result.emitted > 0
    assert [rule for rule, found in result.findings.rules.items() if found.fired] == []
    assert main(["audit", str(out)]) == 0
