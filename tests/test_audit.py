"""`tito audit`'s rules, each on a small recording that fires it and one that does not (tests/audit_support.py),
and the command's exits, JSON schema, allowlist and HTML page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.audit_support import (
    FIRST,
    SYSTEM,
    USER,
    Recording,
    ids,
    logprobs,
    sample,
    text_reply,
    two_turns,
)
from tito_rl.main import main
from tito_rl.replayer.audit.protocol import CHANNEL_RULES, RULES
from tito_rl.replayer.audit.runner import CassetteAudit, audit_cassette


def fired(audit: CassetteAudit) -> dict[str, int]:
    return {r: res.total for r, res in audit.findings.rules.items() if res.fired}


def test_a_clean_session_fires_nothing_and_is_fully_covered(tmp_path: Path) -> None:
    audit = audit_cassette(two_turns(tmp_path / "clean.tito"))
    assert fired(audit) == {}
    assert audit.emitted == len(ids(FIRST)) + len(ids("Done.<|im_end|>")) and audit.coverage == 1.0


def test_never_trained_and_coverage_name_the_masked_turn(tmp_path: Path) -> None:
    path = two_turns(
        tmp_path / "masked.tito",
        samples=lambda p0, o0, ctx, o1: [sample(p0, [(o0, 0, None), (ctx, 0, None), (o1, 1, logprobs(o1))])],
    )
    audit = audit_cassette(path)
    n = len(ids(FIRST))
    assert fired(audit) == {"coverage": n, "never-trained": n}
    assert audit.findings.rules["never-trained"].kinds == {"masked": n}
    example = audit.findings.rules["never-trained"].examples[0]
    assert (example.session, example.exchange, example.token) == ("sid-test", 0, 0)
    assert example.sides[0].text.startswith("<think>")


def test_trained_twice_fires_when_two_samples_train_one_output(tmp_path: Path) -> None:
    path = two_turns(
        tmp_path / "twice.tito",
        samples=lambda p0, o0, ctx, o1: [
            sample(p0, [(o0, 1, logprobs(o0)), (ctx, 0, None), (o1, 1, logprobs(o1))]),
            sample(p0, [(o0, 1, logprobs(o0))]),
        ],
    )
    audit = audit_cassette(path)
    assert fired(audit) == {"trained-twice": len(ids(FIRST)), "coverage": len(ids(FIRST))}
    assert audit.failing(("trained-twice",)) == ["trained-twice"]


def test_trained_not_emitted_fires_on_trained_context(tmp_path: Path) -> None:
    path = two_turns(
        tmp_path / "context.tito",
        samples=lambda p0, o0, ctx, o1: [sample(p0, [(o0, 1, logprobs(o0)), (ctx, 1, None), (o1, 1, logprobs(o1))])],
    )
    audit = audit_cassette(path)
    assert fired(audit) == {"trained-not-emitted": len(ids(USER))}
    example = audit.findings.rules["trained-not-emitted"].examples[0]
    assert example.token == len(ids(SYSTEM)) + len(ids(FIRST)) and "Thanks" in example.sides[0].text


def test_logprob_mismatch_fires_on_a_padded_logprob(tmp_path: Path) -> None:
    def padded(p0: list[int], o0: list[int], ctx: list[int], o1: list[int]) -> list[dict]:
        wrong = logprobs(o0)
        wrong[3] = 0.0
        return [sample(p0, [(o0, 1, wrong), (ctx, 0, None), (o1, 1, logprobs(o1))])]

    audit = audit_cassette(two_turns(tmp_path / "lp.tito", samples=padded))
    assert fired(audit) == {"logprob-mismatch": 1, "coverage": 1}
    assert audit.findings.rules["logprob-mismatch"].examples[0].token == 3


def test_missing_logprobs_fires_on_a_generation_without_them(tmp_path: Path) -> None:
    p0, o0 = ids(SYSTEM), ids(FIRST)
    with Recording(tmp_path / "nolp.tito") as rec:
        rec.engine(p0, o0, lps=None)
        rec.agent(text_reply("Hello there."))
        rec.finish([sample(p0, [(o0, 1, logprobs(o0))])])
    audit = audit_cassette(tmp_path / "nolp.tito")
    assert audit.findings.rules["missing-logprobs"].total == len(o0)
    assert audit.findings.rules["missing-logprobs"].kinds == {"engine": len(o0)}


@pytest.mark.parametrize(
    ("kind", "prompt"),
    [
        ("stop-token", lambda p0, o0, ctx: p0 + o0[:-1] + ctx),
        ("reasoning-dropped", lambda p0, o0, ctx: p0 + ids("Hello there.<|im_end|>") + ctx),
        ("separator", lambda p0, o0, ctx: p0 + ids("<think>\nRead it.\n</think>\nHello there.<|im_end|>") + ctx),
        (
            "retokenized",
            lambda p0, o0, ctx: (
                p0 + ids("<think>\nRead it.\n</think>\n\n") + ids("Hel") + ids("lo") + ids(" there.<|im_end|>") + ctx
            ),
        ),
        ("rewritten", lambda p0, o0, ctx: p0 + ids("Something else entirely.<|im_end|>") + ctx),
    ],
)
def test_prefix_break_kinds(tmp_path: Path, kind: str, prompt) -> None:  # noqa: ANN001
    p0, o0, ctx = ids(SYSTEM), ids(FIRST), ids(USER)
    audit = audit_cassette(two_turns(tmp_path / f"{kind}.tito", second_prompt=prompt(p0, o0, ctx)))
    result = audit.findings.rules["prefix-break"]
    assert result.total == 1 and result.kinds == {kind: 1}
    first_diff = next(i for i, (a, b) in enumerate(zip(p0 + o0, prompt(p0, o0, ctx), strict=False)) if a != b)
    assert result.examples[0].token == first_diff and result.examples[0].exchange == 1
    # the first turn's output is in no sample where the gateway trains the re-rendered one: a realign
    if kind != "retokenized":
        return
    realigned = two_turns(
        tmp_path / "realigned.tito",
        second_prompt=prompt(p0, o0, ctx),
        samples=lambda p0_, o0_, ctx_, o1: [sample(prompt(p0, o0, ctx), [(o1, 1, logprobs(o1))])],
    )
    assert audit_cassette(realigned).findings.rules["never-trained"].kinds == {"realign": len(o0)}


def test_a_prompt_differing_in_the_system_message_is_another_chain_not_a_break(tmp_path: Path) -> None:
    other = ids(
        "<|im_start|>system\nYou are a sub-agent.<|im_end|>\n<|im_start|>user\nGo<|im_end|>\n<|im_start|>assistant\n"
    )
    audit = audit_cassette(
        two_turns(
            tmp_path / "sub.tito",
            second_prompt=other,
            samples=lambda p0, o0, ctx, o1: [
                sample(p0, [(o0, 1, logprobs(o0))]),
                sample(other, [(o1, 1, logprobs(o1))]),
            ],
        )
    )
    assert fired(audit) == {}


def test_stop_token_leak(tmp_path: Path) -> None:
    leak = audit_cassette(two_turns(tmp_path / "leak.tito", reply0=text_reply("Hello there.<|im_end|>")))
    assert fired(leak) == {"stop-token-leak": 1}
    example = leak.findings.rules["stop-token-leak"].examples[0]
    assert example.token == len(ids(FIRST)) - 1 and example.sides[1].text.endswith("<|im_end|>")


CALLS = (
    '<tool_call>\n{"name": "read", "arguments": {"path": "a"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "read", "arguments": {"path": "b"}}\n</tool_call><|im_end|>'
)


def test_tool_call_lost_and_text_dropped(tmp_path: Path) -> None:
    first = "<think>\nRead both.\n</think>\n\nReading both files.\n" + CALLS
    lost = audit_cassette(
        two_turns(tmp_path / "lost.tito", first=first, reply0=text_reply("", [("read", {"path": "a"})]))
    )
    assert fired(lost) == {"tool-call-lost": 1, "text-dropped": 1}
    kept = audit_cassette(
        two_turns(
            tmp_path / "kept.tito",
            first=first,
            reply0=text_reply("Reading both files.", [("read", {"path": "a"}), ("read", {"path": "b"})]),
        )
    )
    assert fired(kept) == {}


def test_a_reply_cut_inside_its_reasoning_drops_no_text(tmp_path: Path) -> None:
    assert (
        fired(
            audit_cassette(
                two_turns(tmp_path / "cut.tito", first="<think>\nStill thinking about", reply0=text_reply(""))
            )
        )
        == {}
    )


def test_sampling_override_and_the_context_cap(tmp_path: Path) -> None:
    p0, o0 = ids(SYSTEM), ids(FIRST)

    def one(name: str, engine_max: int, **header: object) -> CassetteAudit:
        with Recording(tmp_path / name, **header) as rec:
            rec.engine(p0, o0, max_new_tokens=engine_max)
            rec.agent(text_reply("Hello there."), body={"max_tokens": 1000, "temperature": 0.7, "messages": []})
            rec.finish([sample(p0, [(o0, 1, logprobs(o0))])])
        return audit_cassette(tmp_path / name)

    capped = one("capped.tito", 500)
    assert capped.findings.rules["sampling-override"].kinds == {"max_tokens": 1, "temperature": 1}
    assert capped.findings.rules["sampling-override"].examples[0].detail == "max_tokens 1000 → 500"
    # lowered to the context the prompt leaves: the engine would stop there anyway (the temperature still counts)
    fits = one("fits.tito", 500, adapter={"context_length": len(p0) + 500})
    assert fits.findings.rules["sampling-override"].kinds == {"temperature": 1}


def test_status_changed(tmp_path: Path) -> None:
    def failing(name: str, agent_status: int) -> CassetteAudit:
        with Recording(tmp_path / name) as rec:
            rec.engine(ids(SYSTEM), [], status=529)
            rec.agent("500 Internal Server Error", status=agent_status)
        return audit_cassette(tmp_path / name)

    changed = failing("changed.tito", 500)
    assert fired(changed) == {"status-changed": 1}
    assert changed.findings.rules["status-changed"].kinds == {"529 → 500": 1}
    assert fired(failing("kept.tito", 529)) == {}


def test_regenerated_retry_and_the_retry_trained_twice(tmp_path: Path) -> None:
    p0, o0 = ids(SYSTEM), ids(FIRST)
    again = ids("<think>\nRead it again.\n</think>\n\nHi.<|im_end|>")

    def retried(name: str, regenerate: bool, train_both: bool) -> CassetteAudit:
        with Recording(tmp_path / name) as rec:
            rec.engine(p0, o0)
            rec.agent(text_reply("Hello there."))
            if regenerate:
                rec.engine(p0, again)
            rec.agent(text_reply("Hi." if regenerate else "Hello there."), retry_of=0)
            samples = [sample(p0, [(o0, 1, logprobs(o0))])]
            if train_both:
                samples.append(sample(p0, [(again, 1, logprobs(again))]))
            rec.finish(samples)
        return audit_cassette(tmp_path / name)

    assert fired(retried("cached.tito", regenerate=False, train_both=False)) == {}
    once = retried("once.tito", regenerate=True, train_both=False)
    assert fired(once)["regenerated-retry"] == 1 and "trained-twice" not in fired(once)
    assert once.findings.rules["never-trained"].kinds == {"retried": len(again)}
    both = retried("both.tito", regenerate=True, train_both=True)
    assert both.findings.rules["trained-twice"].kinds == {"retry": len(again)}


def test_a_retry_after_an_engine_error_is_not_regenerated(tmp_path: Path) -> None:
    p0, o0 = ids(SYSTEM), ids(FIRST)
    with Recording(tmp_path / "r.tito") as rec:
        rec.engine(p0, [], status=529)
        rec.agent("overloaded", status=529)
        rec.engine(p0, o0)
        rec.agent(text_reply("Hello there."), retry_of=0)
        rec.finish([sample(p0, [(o0, 1, logprobs(o0))])])
    assert fired(audit_cassette(tmp_path / "r.tito")) == {}


def test_side_requests_and_dropped_sessions_are_set_aside(tmp_path: Path) -> None:
    p0, o0 = ids(SYSTEM), ids(FIRST)
    with Recording(tmp_path / "side.tito") as rec:
        rec.engine(p0, o0)
        rec.agent(text_reply("Hello there."), side=True)
        rec.engine(p0, o0, session="other")
        rec.agent(text_reply("Hello there."), session="other")
        rec.writer.session_dropped("other", "named")
        rec.finish([])
    audit = audit_cassette(tmp_path / "side.tito")
    assert fired(audit) == {}
    figures = audit.findings.figures
    assert figures["sid-test"].side_tokens == len(o0) and figures["other"].dropped_tokens == len(o0)


# the command


def test_exit_codes_json_schema_and_allowlist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = two_turns(
        tmp_path / "twice.tito",
        samples=lambda p0, o0, ctx, o1: [
            sample(p0, [(o0, 1, logprobs(o0)), (ctx, 0, None), (o1, 1, logprobs(o1))]),
            sample(p0, [(o0, 1, None)]),
        ],
    )
    assert main(["audit", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert (out["schema"], out["version"], out["failed"]) == ("tito-audit", 1, True)
    # the per-token channel rules are listed once a cassette of the report carries channels (test_audit_channels)
    assert list(out["rules"]) == [r for r in RULES if r not in CHANNEL_RULES]
    cassette = out["cassettes"][0]
    assert cassette["failing"] == ["trained-twice", "logprob-mismatch"]
    assert cassette["rules"]["trained-twice"]["sessions"] == {"sid-test": len(ids(FIRST))}
    assert set(cassette["rules"]["trained-twice"]["examples"][0]) == {
        "session",
        "exchange",
        "seq",
        "token",
        "detail",
        "sides",
    }
    assert cassette["session_figures"][0]["rules"]["trained-twice"] == len(ids(FIRST))
    assert main(["audit", str(path), "--fail-on", "stop-token-leak"]) == 0
    assert main(["audit", str(path), "--fail-on", ""]) == 0
    capsys.readouterr()
    (tmp_path / "twice.audit.toml").write_text(
        '[allow]\ntrained-twice = "pinned on purpose"\nlogprob-mismatch = "the second sample has zeros"\n'
    )
    assert main(["audit", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "allowed: pinned on purpose" in text and "FAIL" not in text


def test_the_summary_says_what_each_count_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two cassettes, one firing trained-twice and coverage: the summary gives each rule's count in its unit, and
    the sessions and cassettes it fired in, never a bare number whose unit the reader must guess."""
    n = len(ids(FIRST))
    two_turns(
        tmp_path / "a.tito",
        samples=lambda p0, o0, ctx, o1: [
            sample(p0, [(o0, 1, logprobs(o0)), (ctx, 0, None), (o1, 1, logprobs(o1))]),
            sample(p0, [(o0, 1, logprobs(o0))]),
        ],
    )
    two_turns(tmp_path / "b.tito")
    assert main(["audit", str(tmp_path)]) == 1
    text = capsys.readouterr().out
    summary = text[text.index("audited ") :].splitlines()
    assert summary[0] == "audited 2 cassette(s), 2 session(s); rules fired:"
    assert f"  trained-twice: {n} token(s) in 1 session(s) of 1 cassette(s)" in summary
    assert f"  FAIL trained-twice: {n} token(s) in 1 session(s)" in text  # the cassette's own line, with its unit


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "no such file or folder"),
        (lambda d: (d / "x.tito").write_bytes(b"nope, not one"), "not a tito cassette"),
        (lambda d: (d / "x.audit.toml").write_text('[allow]\nno-such-rule = "x"\n'), "unknown rule 'no-such-rule'"),
        (lambda d: (d / "x.audit.toml").write_text('[allow]\ncoverage = ""\n'), "without a reason"),
    ],
)
def test_unusable_input_exits_2_with_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    setup,  # noqa: ANN001
    message: str,
) -> None:
    setup(tmp_path)
    target = tmp_path / "x.tito"
    if not target.exists() and "rule" in message or "reason" in message:
        two_turns(target)
    assert main(["audit", str(target)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("tito audit: ")


def test_an_unknown_fail_on_rule_and_an_empty_folder_are_unusable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", str(tmp_path)]) == 2
    assert "no cassettes" in capsys.readouterr().err
    assert main(["audit", str(two_turns(tmp_path / "a.tito")), "--fail-on", "nope"]) == 2
    assert "unknown rule(s) nope" in capsys.readouterr().err


def test_html_page_is_self_contained_and_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = two_turns(tmp_path / "leak.tito", reply0=text_reply("Hello there.<|im_end|>"))
    page = tmp_path / "audit.html"
    assert main(["audit", str(path), "--html", str(page)]) == 0
    html = page.read_text()
    assert "stop-token-leak" in html and "&lt;|im_end|&gt;" in html and "<|im_end|>" not in html
    assert "<script src" not in html and "http" not in html.split("<body", 1)[1].split("tito audit", 1)[0]


def test_a_long_audit_draws_a_bar_over_the_bytes_read_on_a_terminal_only() -> None:
    """The production cassette takes half a minute: a terminal sees the bar fill to the cassettes' sizes; a pipe
    (CI logs, --json into jq) gets nothing but the report."""
    import io

    from tito_rl.replayer.audit.cli import progress_bar
    from tito_rl.replayer.audit.runner import audit

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    root = Path(__file__).resolve().parent.parent
    paths = [str(root / "cassettes" / "tool_loop.tito"), str(root / "cassettes" / "mixed_concurrent.tito")]
    terminal = Terminal()
    bar = progress_bar(paths, terminal, delay_s=0)
    audit(paths, progress=bar.update)
    assert bar.n == bar.total == sum(Path(p).stat().st_size for p in paths)
    bar.close()
    assert terminal.getvalue().startswith("\raudit:")  # drawn on the terminal (and cleared: leave=False)
    assert progress_bar(paths, io.StringIO()) is None


def test_jobs_audit_a_folder_in_workers_with_the_report_of_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    corpus = str(Path(__file__).resolve().parent.parent / "cassettes")
    outputs = []
    for argv in (["--json"], ["--json", "-j", "2"], [], ["-j", "3"]):
        code = main(["audit", corpus, *argv])
        outputs.append((code, capsys.readouterr().out))
    assert outputs[0] == outputs[1] and outputs[2] == outputs[3]  # the same bytes, the same exit code
    report = json.loads(outputs[1][1])
    assert len(report["cassettes"]) > 20 and sum(r["total"] for r in report["rules"].values()) > 0


def test_jobs_say_an_unusable_cassette_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    two_turns(tmp_path / "a.tito")
    (tmp_path / "b.tito").write_bytes(b"not a cassette at all")
    assert main(["audit", str(tmp_path), "-j", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tito audit: {tmp_path / 'b.tito'}: ") and err.count("\n") == 1
    assert main(["audit", str(tmp_path), "-j", "0"]) == 2
    assert capsys.readouterr().err == "tito audit: --jobs must be >= 1\n"
