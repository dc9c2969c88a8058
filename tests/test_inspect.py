"""`tito inspect`: the text view (tree, exchanges table, decisions, exit 2 on unusable input), the HTML page's
escaping and size, and the page as a real headless Chromium renders it: the tree's nodes, the coloured token
strips, a token's tooltip, and each decision marked right before the token it landed on.

The browser test drives Debian's `/usr/bin/chromium` through Playwright (never a browser of its own); it is
skipped, with the reason, where either is missing. `.ci/run` installs chromium where apt is available.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.process_helpers import ROOT
from tito_rl.cassette.format.records import Header
from tito_rl.replayer.inspection.gather import Inspection, SessionView, inspect_cassette, place_events, plan_rows
from tito_rl.replayer.inspection.html_page import FOLD_RUN, render_html
from tito_rl.replayer.inspection.text import render_text
from tito_rl.replayer.replay.plan import plan_session
from tito_rl.replayer.replay.results import FinishResult
from tito_rl.trajectory.events import Event, SessionStats
from tito_rl.trajectory.golden import render_tree
from tito_rl.trajectory.linearize import Span
from tito_rl.trajectory.manager import Linearization
from tito_rl.trajectory.records import Sample

# One worker runs this module (tests/xdist_groups.py): its module-scoped fixture is made once.
pytestmark = pytest.mark.xdist_group("inspect")

CASSETTES = ROOT / "cassettes"
BROWSER_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_inspections: dict[str, Inspection] = {}


def inspected(name: str) -> Inspection:
    """One replay per committed cassette for the whole module."""
    if name not in _inspections:
        _inspections[name] = inspect_cassette(CASSETTES / f"{name}.tito")
    return _inspections[name]


def tito_inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", "inspect", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def golden_section(name: str, heading: str) -> list[str]:
    """The lines under `heading:` in a committed golden (its first finish), to compare the text view with."""
    lines = (CASSETTES / f"{name}.golden").read_text(encoding="utf-8").splitlines()
    start = lines.index(f"{heading}:") + 1
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("  "))
    return [line[2:] for line in lines[start:end]]


# --- text ----------------------------------------------------------------------------------------------------


def test_text_shows_the_tree_the_exchanges_and_every_decision_with_its_token() -> None:
    done = tito_inspect(str(CASSETTES / "drift_realign.tito"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for line in golden_section("drift_realign", "tree"):  # the same tree the golden pins
        assert "    " + line in out.splitlines()
    rows = [line.split() for line in out.splitlines() if re.match(r"^  \d+ ", line)]
    # exchange, turn, status, prompt tokens, output tokens, finish, started_s, agent_s, engine_s (the cassette's)
    assert rows == [
        ["0", "0", "200", "203", "43", "stop", "0.000", "0.512", "0.503"],
        ["1", "1", "200", "262", "21", "stop", "0.514", "0.005", "0.002"],
    ]
    assert (
        "    realign(divergence inside the response of turn 0) turn=1 at=205 leaf=5 tokens=43  "
        "-> sample 0, token 205 'Count'"
    ) in out
    assert "realigns 1, realigned tokens 43" in out
    assert "    sample 0: 283 tokens, prompt 203, trained 21, masked 59, turns 0,1, leaf n5" in out
    assert tito_inspect(str(CASSETTES / "drift_realign.tito")).stdout == out  # deterministic


def test_text_marks_side_aborted_and_retried_exchanges() -> None:
    out = render_text(inspected("client_abort"))
    table = [line for line in out.splitlines() if re.match(r"^  \d+ ", line)]
    assert table[1].split()[:6] == ["1", "-", "499", "294", "10", "abort"]
    assert table[1].endswith("side, aborted, abort_request")
    assert table[2].endswith("retry of #1")
    assert "    side(kept out of the tree) tokens=10  -> no sample's tokens" in out


def test_text_places_a_fork_on_the_sample_it_starts() -> None:
    out = render_text(inspected("reasoning_drop_fork"))
    assert "    fork(earlier-response) turn=2 at=271 leaf=9  -> sample 1, token 271 '<tool_call>'" in out
    for line in golden_section("reasoning_drop_fork", "decisions"):
        assert line in out


def test_session_option_and_unusable_input_exit_2_with_one_line(tmp_path: Path) -> None:
    both = render_text(inspected("openai_wires"))
    assert both.count("== session ") == 2 and "dropped through the session API: 1 time(s)" in both
    one = inspect_cassette(CASSETTES / "openai_wires.tito", ["sid-586b562b0514fe28"])
    assert [s.name for s in one.sessions] == ["sid-586b562b0514fe28"]
    bad = tmp_path / "bad.tito"
    bad.write_bytes(b"not a cassette at all")
    for args in (
        [str(CASSETTES / "client_abort.tito"), "--session", "nope"],
        [str(tmp_path / "missing.tito")],
        [str(bad)],
        [str(CASSETTES / "client_abort.tito"), "--html", str(tmp_path / "no" / "such.html")],
    ):
        done = tito_inspect(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stderr.startswith("tito inspect: ")
    assert "no session 'nope'" in tito_inspect(str(CASSETTES / "client_abort.tito"), "--session", "nope").stderr


def test_a_named_session_is_read_once_and_inspected_with_collection_paused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inspect --session`: the session's records are read from the file once (the replay's plan gives the rows)
    and automatic collection is off meanwhile; the rows, from prompts read packed, are those a plain read of the
    records gives. A whole cassette keeps collection on (its garbage grows with the sessions)."""
    from tito_rl.cassette.reader import StoredSessions, read_cassette
    from tito_rl.main import main
    from tito_rl.replayer.inspection import gather as inspect_data

    path, name = CASSETTES / "openai_wires.tito", "sid-586b562b0514fe28"
    reads: list[str] = []
    read = StoredSessions.__getitem__

    def counted(self: StoredSessions, session: str) -> Any:
        reads.append(session)
        return read(self, session)

    collecting: list[bool] = []
    made: list[Inspection] = []
    inspect = inspect_data.inspect_cassette

    def watched(*args: Any) -> Inspection:
        collecting.append(gc.isenabled())
        made.append(inspect(*args))
        return made[-1]

    monkeypatch.setattr(StoredSessions, "__getitem__", counted)
    monkeypatch.setattr(inspect_data, "inspect_cassette", watched)
    assert main(["inspect", str(path), "--session", name]) == 0
    assert reads == [name] and collecting == [False] and gc.isenabled()
    plain = plan_rows(plan_session(read_cassette(path).sessions[name]))
    assert (made[0].sessions[0].exchanges, made[0].sessions[0].unanswered_engine_calls) == plain
    assert any(row.prompt_tokens for row in plain[0])
    assert main(["inspect", str(path)]) == 0
    assert collecting == [False, True]
    capsys.readouterr()


# --- HTML, without a browser ---------------------------------------------------------------------------------


class Parsed(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.titles: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.titles += [v for k, v in attrs if k == "title" and v is not None]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


EVIL = {
    1: "<|im_start|>",
    2: "a&b",
    3: "\"q'",
    4: "<b>bold</b>",
    5: "</span><script>x()</script>",
    6: "&amp;",
    7: "<i>",
}


def synthetic(
    tokens: list[int], prompt: int, spans: list[Span], events: list[Event], tree: list[dict[str, Any]]
) -> Inspection:
    """An inspection built by hand: one sample whose loss follows its spans."""
    loss = [0] * len(tokens)
    for s in spans:
        loss[s.start : s.start + s.length] = [int(s.trained)] * s.length
    logprobs = [-0.5 if m else 0.0 for m in loss[prompt:]]
    sample = Sample(tokens, len(tokens) - prompt, loss[prompt:], logprobs, 1.0, {"leaf": 3})
    lin = Linearization([sample], events, {3: [0]}, SessionStats(samples=1), [spans])
    finish = FinishResult(1.0, None, [], lin, {"nodes": tree})
    session = SessionView("<s&1>", [], [finish])
    header = Header(tokenizer_fingerprint="sha256:<x>", created="2026-01-01T00:00:00Z")
    return Inspection("<odd & path>.tito", header, False, [session], lambda t: EVIL.get(t, f"w{t}"))


def test_the_page_escapes_token_text_messages_and_reasons() -> None:
    tree = [
        {
            "id": 1,
            "parent": 0,
            "role": "user",
            "message": {"role": "user", "content": '<b>hi</b> & "you"'},
            "generated": False,
            "turn": None,
            "leaf": False,
            "samples": [],
        },
        {
            "id": 3,
            "parent": 1,
            "role": "assistant",
            "message": {"role": "assistant", "content": "<script>"},
            "generated": True,
            "turn": 1,
            "leaf": True,
            "samples": [0],
        },
    ]
    spans = [Span(0, 3, 2, True), Span(1, 6, 1, False)]
    page = render_html(synthetic([1, 2, 3, 4, 5, 6, 7], 3, spans, [Event("fork", '<why> & "how"', 1, 5, 3)], tree))
    parsed = Parsed()
    parsed.feed(page)
    assert parsed.tags.count("script") == 1 and "b" not in parsed.tags and "i" not in parsed.tags
    text = "".join(parsed.text)
    for name in EVIL.values():
        assert name in text  # shown literally
    assert '"<b>hi</b> & "you""' in text and "<s&1>" in text and '<why> & "how"' in text
    tip = next(t for t in parsed.titles if t.startswith("</span><script>"))
    assert "id 5" in tip and "logprob -0.5" in tip and "trained: turn 0 output" in tip
    assert not re.search(r"https?:|src=|@import|url\(", page)  # nothing fetched


def test_a_150k_token_session_stays_small_with_every_trained_token_shown() -> None:
    n, prompt = 150_000, 20_000
    spans = [Span(t, start, 400, True) for t, start in enumerate(range(prompt + 5_000, n, 10_000))]
    spans[3] = Span(3, spans[3].start, 400, False)  # one output carried untrained (masked)
    page = render_html(synthetic(list(range(n)), prompt, spans, [], []))  # its time: benchmarks/bench_inspect_page.py
    trained = sum(s.length for s in spans if s.trained)
    shown = {kind: page.count(f'class="tok {kind}" data-i=') for kind in ("prompt", "context", "masked", "trained")}
    assert shown["trained"] == trained and shown["masked"] == 400, shown
    assert shown["prompt"] + shown["context"] <= (len(spans) + 1) * 2 * FOLD_RUN, shown  # the rest is folded
    assert len(page) < 6_000_000, len(page)


# --- the page in a real browser --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip(
            "no chromium on this machine: the real-browser test needs Debian's chromium "
            "(apt-get install -y chromium; .ci/run installs it where apt is available)"
        )
    return path


# Script-bearing text where a cassette puts text: a prompt, the model's reasoning, text and tool call, a tool's
# output, the session's name. Each payload would set window.__pwned (or open a dialog) if it ever ran.
PWN = {
    "prompt": "<script>window.__pwned='prompt'</script>Fix it.",
    "reasoning": "</script><script>window.__pwned='reasoning'</script>",
    "text": "<img src=x onerror=\"window.__pwned='text'\">Done.",
    "command": "echo '</script><svg onload=alert(1)>'",
    "tool": "</script><script>window.__pwned='tool'</script><img src=x onerror=\"window.__pwned='img'\">",
    "session": "\"><img src=x onerror=\"window.__pwned='name'\">'<script>alert('name')</script>",
}


def hostile_cassette(folder: Path) -> Path:
    """A scripted recording carrying PWN's payloads, and a copy of its session named as a pull request could
    name it (a name it was not recorded under replays with differences, and its page shows them)."""
    from tests.scripted_support import record_scenario
    from tito_rl.cassette.reader import CassetteReader, read_header
    from tito_rl.cassette.writer import CassetteWriter

    scenario = {
        "name": "pwn",
        "turns": [
            {
                "reasoning": PWN["reasoning"],
                "text": PWN["text"],
                "tool_calls": [{"name": "Bash", "arguments": {"command": PWN["command"], "description": "x"}}],
            },
            {"text": PWN["text"]},
        ],
        "client": {
            "sessions": [
                {
                    "id": "pwn-0000",
                    "wire": "anthropic",
                    "system": "You are an agent.",
                    "tools": ["Bash"],
                    "results": {"Bash": [PWN["tool"]]},
                    "steps": [{"prompt": PWN["prompt"]}, {"finish": 1.0}],
                }
            ]
        },
    }
    recorded = folder / "recorded.tito"
    asyncio.run(record_scenario(scenario, recorded))
    out = folder / "pwn.tito"
    with CassetteWriter(out, read_header(recorded), header_redacted=True) as writer:
        for name in (None, PWN["session"]):
            with CassetteReader(recorded) as reader:
                for record in reader.records():
                    record.session = name or record.session
                    writer.append_redacted(record)
    return out


@pytest.fixture(scope="module")
def pages(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The pages, written before the browser starts: Playwright's sync API keeps an event loop running in
    this thread, and a replay cannot start one inside it."""
    folder = tmp_path_factory.mktemp("pages")
    for name in ("drift_realign", "reasoning_drop_fork"):
        (folder / f"{name}.html").write_text(render_html(inspected(name)), encoding="utf-8")
    done = tito_inspect(str(hostile_cassette(folder)), "--html", str(folder / "pwn.html"))
    assert done.returncode == 0, done.stderr
    return {p.stem: p for p in folder.glob("*.html")}


@pytest.fixture(scope="module")
def browser(chromium: str, pages: dict[str, Path]) -> Iterator[Any]:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[dev]')"
    )
    with sync_api.sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=chromium,
            headless=True,
            args=BROWSER_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


def open_page(browser: Any, path: Path) -> tuple[Any, list[str]]:
    page = browser.new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    return page, requests


def test_the_page_renders_tree_coloured_strips_tooltips_and_decisions(
    pages: dict[str, Path], browser: Any, tmp_path: Path
) -> None:
    inspection = inspected("drift_realign")
    finish = inspection.sessions[0].finishes[0]
    lin, sample = finish.linearization, finish.linearization.samples[0]
    page, requests = open_page(browser, pages["drift_realign"])

    # the tree: one element per node, each labelled as the golden's tree lines
    labels = page.locator(".tree .node .label").all_inner_texts()
    assert labels == [re.sub(r"^[│├└─ ]*", "", line) for line in render_tree(finish.tree["nodes"])]
    assert page.locator("#s0f1n5 a[href='#s0f1x0']").inner_text() == "sample 0"

    # the strip: every kind present, each with its own colour
    strip = "#s0f1x0 .strip"
    colours = {
        kind: page.eval_on_selector(f"{strip} .tok.{kind}", "e => getComputedStyle(e).backgroundColor")
        for kind in ("prompt", "context", "masked", "trained")
    }
    assert len(set(colours.values())) == 4, colours
    counts = {kind: page.locator(f"{strip} .tok.{kind}").count() for kind in ("context", "masked", "trained")}
    assert counts["trained"] == sum(sample.loss_mask) and counts["masked"] > 0 and counts["context"] > 0, counts

    # a tooltip: the last trained token, `<|im_end|>`, shown literally, with its id, logprob and turn
    last = len(sample.tokens) - 1
    token = page.locator(f"{strip} .tok[data-i='{last}']")
    assert token.inner_text() == inspection.names(sample.tokens[last]) == "<|im_end|>"
    token.hover()
    tip = page.locator("#tip")
    assert tip.is_visible()
    shown = tip.inner_text()
    assert f"id {sample.tokens[last]} " in shown and "trained: turn 1 output" in shown, shown
    logprob = float(re.search(r"logprob (\S+)", shown).group(1))
    assert logprob == pytest.approx(sample.rollout_log_probs[last - sample.prompt_length], abs=1e-5)
    page.locator(f"{strip} .tok[data-i='205']").hover()
    assert "masked: turn 0 reply, realigned" in tip.inner_text()

    # decisions: a marker right before the token each one landed on, linked with the list and the aside
    for placement in place_events(lin):
        marker = page.locator(f"#s0f1m{placement.event}")
        assert marker.inner_text() == lin.events[placement.event].kind == "realign"
        assert marker.evaluate("m => m.nextElementSibling.dataset.i") == str(placement.token) == "205"
        box, next_box = marker.bounding_box(), page.locator(f"{strip} .tok[data-i='205']").bounding_box()
        assert 0 <= next_box["x"] - (box["x"] + box["width"]) < 12 and abs(box["y"] - next_box["y"]) < 8
        item = page.locator(f"#s0f1d{placement.event}")
        assert lin.events[placement.event].describe() in item.inner_text()
        item.locator("a").click()
        assert page.evaluate("location.hash") == f"#s0f1m{placement.event}"
        assert lin.events[placement.event].describe() in page.locator("#s0f1x0 aside").inner_text()

    assert all(url.startswith("file://") for url in requests), requests
    shot = tmp_path / "inspect.png"
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("TITO_INSPECT_SCREENSHOT"):
        shutil.copy(shot, os.environ["TITO_INSPECT_SCREENSHOT"])
    page.close()


def test_a_decision_inside_a_folded_prompt_stays_visible(pages: dict[str, Path], browser: Any) -> None:
    page, _ = open_page(browser, pages["reasoning_drop_fork"])
    marker = page.locator("#s0f1x1 a.mark", has_text="fork")  # the fork, in sample 1's 347-token prompt, at 271
    assert marker.is_visible() and marker.inner_text() == "fork"
    token = page.locator("#s0f1x1 .tok[data-i='271']")
    assert token.is_visible() and token.inner_text() == "<tool_call>"
    assert page.locator("#s0f1x1 details.fold").count() >= 1  # the rest of the prompt is folded
    page.close()


def test_script_in_a_cassette_never_runs_or_leaves_its_element(pages: dict[str, Path], browser: Any) -> None:
    """Prompts, reasoning, model text, tool calls, tool output and the session name carrying `<script>`,
    `</script>`, `<img onerror>` and quotes are shown as text where they belong, and nothing of theirs runs."""
    page = browser.new_page()
    dialogs: list[str] = []

    def dismiss(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", dismiss)
    page.goto(pages["pwn"].as_uri())
    page.wait_for_load_state("load")
    assert page.evaluate("typeof window.__pwned") == "undefined" and dialogs == []
    assert page.locator("script").count() == 1 and page.locator("img, svg, [onerror], [onload]").count() == 0
    assert page.locator("section.session h2").all_inner_texts()[1] == f"session {PWN['session']}"
    assert page.locator("nav a").all_inner_texts()[1] == PWN["session"]
    labels = "\n".join(page.locator(".tree .node .label").all_inner_texts())
    for key in ("tool", "prompt"):  # the tree shows each message's start as its text
        assert PWN[key][:40] in labels, (key, labels)
    strips = page.locator(".strip").first
    text = strips.inner_text().replace("·", " ").replace("↵", "\n")
    assert PWN["reasoning"] in text.replace("\n", "") and "onerror=" in text
    # every token of the hostile text is a text node in its own span: no element came from the cassette
    tags = page.evaluate("[...new Set([...document.body.querySelectorAll('*')].map(e => e.tagName.toLowerCase()))]")
    assert set(tags) <= {
        "h1",
        "h2",
        "h3",
        "h4",
        "div",
        "dl",
        "dt",
        "dd",
        "ul",
        "ol",
        "li",
        "span",
        "a",
        "nav",
        "section",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
        "p",
        "code",
        "aside",
        "details",
        "summary",
        "br",
        "script",
    }, tags
    page.close()


# --- the audit's page in the same browser -----------------------------------------------------------------------


def test_the_audit_page_renders_its_rules_and_examples_with_nothing_run(browser: Any, tmp_path: Path) -> None:
    """`tito audit --html` on the slime recordings, hostile text included (the stop token slime leaves in its
    replies, the agent's own words in examples), as a person opens it: every rule that fired has its section and
    example, the special token reads literally, the page loads nothing and runs nothing."""
    page_file = tmp_path / "audit.html"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tito_rl",
            "audit",
            str(ROOT / "cassettes/targets/slime_retry.tito"),
            str(ROOT / "cassettes/targets/slime_mixed.tito"),
            "--html",
            str(page_file),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr  # the retry trained twice fires the default --fail-on
    page, requests = open_page(browser, page_file)
    headings = page.locator("h3").all_inner_texts()
    for rule in ("trained-twice", "stop-token-leak", "tool-call-lost", "never-trained", "sampling-override"):
        assert any(h.startswith(f"{rule}: ") for h in headings), (rule, headings)
    assert page.locator(".fail").first.is_visible()
    examples = page.locator(".example pre").all_inner_texts()
    assert any("<|im_end|>" in text for text in examples)  # shown as text, not swallowed as markup
    assert page.evaluate("document.scripts.length") == 0
    assert all(url.startswith("file://") for url in requests), requests
    page.close()
