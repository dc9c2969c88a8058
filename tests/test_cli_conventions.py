"""The `tito` command line keeps the conventions a user expects: `--version`, a `--help` per subcommand that
says what it does and its exit codes, `-q`/`-v` and `--full-diff` on `tito replay`, and a recording's progress
that does not flood a CI log."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.process_helpers import ROOT
from tito_rl.commands import SUBCOMMANDS
from tito_rl.main import main
from tito_rl.recorder.taps.progress import ProgressTap
from tito_rl.trajectory.adapters.tap import AgentExchange
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer


def test_version_prints_the_installed_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tito_rl", "--version"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stdout == f"tito {version('tito-rl')}\n" and not proc.stderr


EXITING = """
import gc, os, sys
from tito_rl import main as tito_cli

def ending(code):  # what the collector holds when the program exits at once
    print(code, gc.isenabled(), gc.get_freeze_count() > 0)
    raise SystemExit(0)

os._exit = ending
sys.argv = ["tito", *sys.argv[1:]]
tito_cli.main()
"""


@pytest.mark.parametrize(
    ("args", "state"),
    [
        (["inspect", "cassettes/plain_chat.tito", "--session", "sid-7685e4fa5d99cf88"], "0 False False"),
        (["inspect", "cassettes/plain_chat.tito"], "0 True False"),
        (["replay", "-q", "cassettes/plain_chat.tito"], "0 True True"),
    ],
)
def test_a_program_that_exits_at_once_leaves_the_collector_what_its_end_needs(args: list[str], state: str) -> None:
    """Run as the program, `inspect --session` exits with automatic collection still paused (turning it on
    would start a pass over everything made), and `tito replay` has frozen what loading made before replaying;
    called in a process that goes on, neither leaves anything so (`test_inspect`, `test_replay_cli`)."""
    done = subprocess.run([sys.executable, "-c", EXITING, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == state


def test_replay_called_in_process_freezes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    import gc

    frozen = gc.get_freeze_count()
    assert main(["replay", "-q", str(ROOT / "cassettes" / "plain_chat.tito")]) == 0
    assert gc.get_freeze_count() == frozen and gc.isenabled()
    capsys.readouterr()


@pytest.mark.parametrize("name", list(SUBCOMMANDS))
def test_every_subcommand_help_says_what_it_does_and_its_exit_codes(name: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main([name, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    command = SUBCOMMANDS[name]
    assert " ".join(out.split()).count(" ".join(command.description.split()[:12])) == 1  # the description
    exits = out[out.index("\nexit codes:\n") :].splitlines()[1:]
    codes = [line.split()[0] for line in exits if line.startswith("  ") and line.split()[0].isdigit()]
    assert codes[0] == "0" and "2" in codes and codes == sorted(codes, key=int)


@pytest.mark.parametrize(
    "command",
    [
        ("cassette", "info"),
        ("cassette", "export"),
        ("cassette", "cut"),
        ("cassette", "merge"),
        ("scenario", "check"),
        ("scenario", "schema"),
    ],
)
def test_every_action_help_says_what_it_does_and_its_exit_codes(command: tuple[str, str], capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    usage, _, rest = out.partition("\n\n")
    assert usage.startswith(f"usage: tito {' '.join(command)} ")
    description = rest.split("\n\n")[0]
    assert len(description.split()) >= 12 and not description.startswith(("positional", "options"))  # a purpose
    exits = out[out.index("\nexit codes:\n") :].splitlines()[1:]
    codes = [line.split()[0] for line in exits if line.startswith("  ") and line.split()[0].isdigit()]
    assert codes[0] == "0" and "2" in codes and codes == sorted(codes, key=int)


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


class Inner:
    """A tap that takes everything and writes nothing."""

    def __getattr__(self, name: str):  # noqa: ANN204 - any tap method
        return lambda *args, **kwargs: None


def _progress(tty: bool) -> tuple[ProgressTap, Stream, list[float]]:
    now = [100.0]
    stream = Stream(tty)
    return ProgressTap(Inner(), stream, clock=lambda: now[0]), stream, now


def _exchange(turn: int) -> AgentExchange:
    return AgentExchange(
        method="POST",
        path="/v1/messages",
        query="",
        headers={},
        body=b"{}",
        status=200,
        reply_headers={},
        turn_index=turn,
    )


def test_progress_into_a_log_is_a_line_at_most_every_10_s_and_a_last_one_at_the_end() -> None:
    tap, stream, now = _progress(tty=False)
    for t, at in enumerate([100.0, 101.0, 109.9, 110.0, 115.0, 119.0]):
        now[0] = at
        tap.agent_exchange("s", "agent", _exchange(t))
        if at == 115.0:
            tap.session_finished("s", "api", 1.0, [])  # a finish does not force a line into a log
    lines = stream.getvalue().splitlines()
    assert [line.split("| turns ")[1].split()[0] for line in lines] == ["1", "4"]  # at 100 s and 110 s only
    tap.flush()
    assert stream.getvalue().splitlines()[-1] == "tito record: " + tap.counts.line() and "turns 6" in tap.counts.line()
    tap.flush()
    assert len(stream.getvalue().splitlines()) == 3  # nothing new: no repeated line


def test_progress_on_a_terminal_redraws_its_line_often_and_at_each_finish() -> None:
    tap, stream, now = _progress(tty=True)
    for at in (100.0, 100.2, 100.6):
        now[0] = at
        tap.agent_exchange("s", "agent", _exchange(0))
    tap.session_finished("s", "api", 1.0, [])
    assert stream.getvalue().count("\r") == 3 and "\n" not in stream.getvalue()


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """tool_loop.tito with its golden, and a chat template that changes every prompt after the first."""
    folder = tmp_path_factory.mktemp("conventions")
    for suffix in (".tito", ".golden"):
        shutil.copy(ROOT / "cassettes" / f"tool_loop{suffix}", folder / f"tool_loop{suffix}")
    template = folder / "candidate.jinja"
    template.write_text(load_tokenizer().chat_template.replace("'\\n</tool_response>'", "'\\n</tool_response>\\n'"))
    return folder / "tool_loop.tito", template


def test_replay_verbose_shows_every_difference_and_quiet_only_failures(candidate, capsys) -> None:
    cassette, template = candidate
    what_if = [str(cassette), "--chat-template", str(template), "--engine-match", "order"]
    assert main(["replay", *what_if]) == 1
    plain = capsys.readouterr().out
    assert plain.count("warning: engine request differs") == 6 and plain.count("  recorded: …") == 1
    assert "… and 6 more such difference(s); the golden decides (-v shows them)" in plain

    assert main(["replay", *what_if, "-v"]) == 1
    verbose = capsys.readouterr().out
    assert verbose.count("warning: engine request differs") == 6 and verbose.count("  recorded: …") == 6
    assert verbose.count("differs from the recording (noted, not failed)") == 7 and "more such" not in verbose

    folder = cassette.parent / "two"
    folder.mkdir(exist_ok=True)
    for name in ("tool_loop.tito", "tool_loop.golden"):
        shutil.copy(cassette.parent / name, folder / name)
    for suffix in (".tito", ".golden"):
        shutil.copy(ROOT / "cassettes" / f"drift_realign{suffix}", folder / f"drift_realign{suffix}")
    assert main(["replay", str(folder), "--fork-threshold", "0", "--engine-match", "order", "-q"]) == 1
    quiet = capsys.readouterr().out.splitlines()
    assert quiet[0] == str(folder / "drift_realign.tito") and "FAIL: golden changed" in quiet[1]
    assert not any("tool_loop" in line for line in quiet)  # a passing cassette is not shown
    assert quiet[-1] == "2 session(s): 1 ok, 1 failed"


def test_replay_cuts_a_long_golden_diff_unless_full_diff(candidate, capsys) -> None:
    cassette, _ = candidate
    golden = cassette.with_suffix(".golden")
    kept = golden.read_text()
    head, _, rest = kept.partition("tree:\n")
    golden.write_text(head + "tree:\n" + "".join(f"  stale line {i}\n" for i in range(100)))
    try:
        assert main(["replay", str(cassette)]) == 1
        out = capsys.readouterr().out
        assert "more diff line(s) cut; --full-diff shows it whole" in out and "-  stale line 99" not in out
        assert "\x1b[" not in out  # captured, not a terminal: no colour
        assert main(["replay", str(cassette), "--full-diff"]) == 1
        out = capsys.readouterr().out
        assert "-  stale line 99" in out and "cut" not in out
    finally:
        golden.write_text(kept)


def test_progress_around_a_foreign_gateway_counts_its_turns_tokens_and_requests_without_a_session() -> None:
    """A foreign gateway says nothing of turns: an exchange answered after a generation of its own is a turn, one
    without is a side request; requests naming no session are counted apart."""
    from tito_rl.trajectory.adapters.tap import EngineExchange

    tap, _, _ = _progress(tty=False)
    tap.agent_request("ro-1", "path:/r/{sid}", {})
    assert tap.counts.line().startswith("sessions 1 (finished 0)")  # counted at its first request
    call = EngineExchange(
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}]},
        200,
        response={
            "choices": [{"message": {"content": "yo"}, "token_ids": [5, 6, 7]}],
            "prompt_token_ids": [1, 2, 3, 4],
        },
        dialect="vllm-openai",
    )
    tap.engine_exchange("ro-1", "path:/r/{sid}", call)
    foreign = AgentExchange(
        method="POST",
        path="/r/ro-1/v1/chat/completions",
        query="",
        headers={},
        body=b"{}",
        status=200,
        reply_headers={},
    )
    tap.agent_exchange("ro-1", "path:/r/{sid}", foreign)  # after a generation: a turn
    tap.agent_exchange("ro-1", "path:/r/{sid}", foreign)  # none since: a side request (a count_tokens)
    tap.without_session("GET /health")
    assert tap.counts.line() == (
        "sessions 1 (finished 0) | turns 1 (+1 side) | tokens 4 in, 3 out | errors 0 | 1 without a session"
    )
