"""The parser helper (`trajectory/adapters/parsing/parser_process.py`): parses answered by a forked process give
what the parsers in process give, on every engine output of the committed corpus; errors come back as the same
exceptions; a helper that dies is replaced by the parsers in process with no result changed; `tito replay` ends
its helper, and a long run loads the parsers in process instead; the helper starts only where a core is likely
idle. Each check runs in a fresh interpreter (a fork of this multi-threaded test process would be unsafe, and
this one has loaded the parsers already), with `TITO_PARSER_HELPER=1`: the suite's own load would turn it off.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.process_helpers import ROOT
from tito_rl.trajectory.adapters.parsing import parser_process

FORCED = {**os.environ, parser_process.HELPER_ENV: "1"}


def run_fresh(code: str, timeout_s: float = 300.0) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=FORCED
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_the_helper_parses_every_corpus_output_as_the_parsers_in_process_do() -> None:
    out = run_fresh("""
import json, sys
from pathlib import Path
from tito_rl.trajectory.adapters.parsing import parser_process
from tito_rl.trajectory.adapters.parsing.output_parser import OutputParser

helper = parser_process.start()
assert helper is not None and "sglang.srt.function_call.function_call_parser" not in sys.modules
from tito_rl.cassette.reader import read_cassette
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer
tokenizer = load_tokenizer()
cases = []
for path in sorted(Path("cassettes").glob("*.tito")):
    for log in read_cassette(path).sessions.values():
        tools = []
        for a in log.agent:
            body = json.loads(a.body) if a.body else {}
            tools = [{"type": "function", "function": {"name": t.get("name") or t.get("function", {}).get("name"),
                      "parameters": {"type": "object", "properties": {}}}} for t in body.get("tools") or []
                     if isinstance(t, dict) and (t.get("name") or t.get("function", {}).get("name"))] or tools
        for e in log.engine:
            if e.path.endswith("/generate") and isinstance(e.response, dict) and e.response.get("output_ids"):
                cases.append((tokenizer.decode(e.response["output_ids"]), tools))
helped = [OutputParser().parse(text, tools) for text, tools in cases]
assert "sglang.srt.function_call.function_call_parser" not in sys.modules  # every one answered by the helper
parser_process.load_here()
here = [OutputParser().parse(text, tools) for text, tools in cases]
assert helped == here
print(len(cases), sum(bool(p.tool_calls) for p in here), sum(bool(p.reasoning) for p in here))
""")
    outputs, with_calls, with_reasoning = map(int, out.split())
    assert outputs > 100 and with_calls > 50 and with_reasoning > 50  # the corpus's outputs, of every kind


def test_errors_come_back_as_the_same_exceptions_and_a_dead_helper_is_replaced() -> None:
    out = run_fresh("""
import os, signal, sys
from tito_rl.trajectory.adapters.parsing import parser_process
from tito_rl.trajectory.adapters.parsing.output_parser import OutputParser

helper = parser_process.start()
try:
    OutputParser("qwen3", "no-such-parser")
except ValueError as exc:
    through_helper = str(exc)
else:
    raise AssertionError("an unknown parser name was accepted")
assert "unknown tool parser 'no-such-parser'" in through_helper and parser_process.active() is helper
tools = [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object", "properties": {}}}}]
text = '<think>\\nLook.\\n</think>\\n\\n<tool_call>\\n{"name": "Bash", "arguments": {"command": "ls"}}\\n</tool_call>'
first = OutputParser().parse(text, tools)
os.kill(helper.pid, signal.SIGKILL)
os.waitpid(helper.pid, 0)
second = OutputParser().parse(text, tools)  # the helper is gone: parsed here, the same result
assert parser_process.active() is None and first == second and second.tool_calls[0].name == "Bash"
assert "sglang.srt.function_call.function_call_parser" in sys.modules
try:
    OutputParser("qwen3", "no-such-parser")
except ValueError as exc:
    assert str(exc) == through_helper
print("ok")
""")
    assert out == "ok"


def test_a_replay_ends_its_helper_and_a_long_one_parses_in_process() -> None:
    out = run_fresh("""
import os, sys
from tito_rl import main as tito_cli
from tito_rl.trajectory.adapters.parsing import parser_process

forked = []
start = parser_process.start
parser_process.start = lambda: forked.append(start()) or forked[-1]
assert tito_cli.main(["replay", "-q", "cassettes/plain_chat.tito"]) == 0
assert forked and forked[0] is not None and parser_process.active() is None
assert "sglang.srt.function_call.function_call_parser" not in sys.modules  # parsed by the helper alone
try:
    os.waitpid(forked[0].pid, 0)  # it exits once the replay closed its pipe
except ChildProcessError:
    pass
try:
    os.kill(forked[0].pid, 0)
except ProcessLookupError:
    pass
else:
    raise AssertionError("the helper outlived its replay")
parser_process.SHORT_RUN_PARSES = 1  # plain_chat has two exchanges: a long run now
assert tito_cli.main(["replay", "-q", "cassettes/plain_chat.tito"]) == 0
assert "sglang.srt.function_call.function_call_parser" in sys.modules and parser_process.active() is None
print("ok")
""")
    assert out.splitlines()[-1] == "ok"


def test_inspect_starts_the_helper_before_its_fingerprint_thread() -> None:
    """The helper is forked only while this process runs one thread: the tokenizer's fingerprint, hashed on a
    thread meanwhile, must start after it, or every `tito inspect` would load the parsers itself."""
    out = run_fresh("""
import contextlib, io, sys
from tito_rl import main as tito_cli
from tito_rl.trajectory.tokens import tokenizer
from tito_rl.trajectory.adapters.parsing import parser_process

forked, threads = [], []
start, prefetch = parser_process.start, tokenizer.prefetch_fingerprint
parser_process.start = lambda: forked.append(start()) or forked[-1]
tokenizer.prefetch_fingerprint = lambda *a: threads.append(len(forked)) or prefetch(*a)
with contextlib.redirect_stdout(io.StringIO()):
    assert tito_cli.main(["inspect", "cassettes/plain_chat.tito"]) == 0
assert forked[0] is not None and threads == [1]
assert "sglang.srt.function_call.function_call_parser" not in sys.modules  # parsed by the helper alone
print("ok")
""")
    assert out.splitlines()[-1] == "ok"


def test_tito_serve_answers_through_the_helper_then_takes_the_parsers_over() -> None:
    """The first requests are parsed while the parsers are still loading in the server (by the helper); once
    loaded there, the helper is gone (reaped: no child process left) and replies are parsed the same."""
    import json
    import time
    import urllib.request
    from pathlib import Path

    from tests.process_helpers import free_port, tito

    engine, port = free_port(), free_port()
    body = json.dumps(
        {
            "model": "tito",
            "max_tokens": 512,
            "messages": [{"role": "user", "content": "list the files"}],
            "tools": [
                {
                    "name": "Bash",
                    "description": "Run a shell command",
                    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
                }
            ],
        }
    ).encode()

    def ask(session: str) -> dict:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/messages",
            data=body,
            headers={"Authorization": f"Bearer {session}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as resp:
            return json.load(resp)

    def children(pid: int) -> list[str]:
        return [c for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    with (
        tito(
            "fake-engine",
            "--script",
            "fake_engine/examples/claude_tool_loop.yaml",
            "--listen",
            f"127.0.0.1:{engine}",
            ready=f"http://127.0.0.1:{engine}/health",
        ),
        tito(
            "serve",
            "--engine",
            f"http://127.0.0.1:{engine}",
            "--listen",
            f"127.0.0.1:{port}",
            ready=f"http://127.0.0.1:{port}/health",
            env={parser_process.HELPER_ENV: "1"},
        ) as serve,
    ):
        first = ask("serve-helper-session-1")
        deadline = time.monotonic() + 60
        while children(serve.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children(serve.pid) == []  # the helper ended and was reaped
        second = ask("serve-helper-session-2")
    for reply in (first, second):
        assert [b["type"] for b in reply["content"]] == ["thinking", "text", "tool_use"]
        assert reply["content"][2]["name"] == "Bash" and reply["content"][2]["input"] == {"command": "ls"}
    assert first["content"][:2] == second["content"][:2]


def test_tito_serve_with_an_unknown_parser_is_one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tito_rl", "serve", "--engine", "http://127.0.0.1:9", "--tool-parser", "no-such-parser"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("tito serve: unknown tool parser 'no-such-parser'; known: [")


def test_a_single_pytest_process_replays_through_the_helper(tmp_path) -> None:
    """pytest with the plugin, one process: the session items' parses are the helper's, the pytest process never
    loads the parsers, and the helper is gone when pytest ends; the session passes as in any other run."""
    import shutil

    (tmp_path / "cassettes").mkdir()
    shutil.copy(ROOT / "cassettes" / "tool_loop.tito", tmp_path / "cassettes")
    shutil.copy(ROOT / "cassettes" / "tool_loop.golden", tmp_path / "cassettes")
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    (tmp_path / "conftest.py").write_text(
        "import sys\n"
        "from tito_rl.trajectory.adapters.parsing import parser_process\n"
        "def pytest_sessionfinish(session):\n"
        "    helper = parser_process.active()\n"
        "    loaded = 'sglang.srt.function_call.function_call_parser' in sys.modules\n"
        "    print(f'\\nhelper {helper is not None} parsers-here {loaded}', file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=FORCED,
    )
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout + done.stderr
    assert "helper True parsers-here False" in done.stderr


def test_the_helper_loads_the_parsers_before_it_is_asked_anything() -> None:
    """The overlap is the point: the helper imports the parsers as soon as it is forked, not at the first parse
    (its memory maps pydantic's compiled core, which only the parsers' import brings in here)."""
    out = run_fresh("""
import sys, time
from tito_rl.trajectory.adapters.parsing import parser_process
helper = parser_process.start()
assert "pydantic_core" not in sys.modules
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    with open(f"/proc/{helper.pid}/maps") as maps:
        if "pydantic_core" in maps.read():
            break
    time.sleep(0.05)
else:
    raise AssertionError("the helper did not load the parsers unasked")
parser_process.stop()
print("ok")
""")
    assert out == "ok"


@pytest.mark.parametrize(
    ("forced", "cpus", "load", "wanted"),
    [
        ("", 2, 0.3, True),
        ("", 2, 1.4, True),
        ("", 2, 1.6, False),
        ("", 2, 3.9, False),
        ("", 1, 0.0, False),
        ("", 16, 14.0, True),
        ("1", 2, 3.9, True),
        ("0", 16, 0.0, False),
    ],
)
def test_the_helper_starts_only_where_a_core_is_likely_idle(
    monkeypatch: pytest.MonkeyPatch, forced: str, cpus: int, load: float, wanted: bool
) -> None:
    monkeypatch.setenv(parser_process.HELPER_ENV, forced)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    assert parser_process.wanted() is wanted
