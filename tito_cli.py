"""The single `tito` command line.

Each subcommand lives in the package that owns the concept and is imported lazily, so `tito --help`
stays fast and a subcommand's heavy imports (tokenizer, sglang parsers) are paid only when used.
A subcommand module exposes `add_arguments(parser)` and `run(args) -> int`; what it does and its exit
codes are said here, in one table, so every `tito COMMAND --help` says them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

USAGE_ERROR = "2: a usage error (unknown option, missing argument)"


@dataclass(frozen=True)
class Subcommand:
    module: str
    summary: str  # one line in `tito --help`
    description: str  # what it does, in `tito NAME --help`
    exits: tuple[str, ...]  # "CODE: meaning", in `tito NAME --help`
    # It parses engine output through tito's adapter: sglang's parsers start loading in a helper process before
    # anything else loads (trajectory/adapters/parser_process.py).
    parses: bool = False


SUBCOMMANDS: dict[str, Subcommand] = {
    "demo": Subcommand(
        "replayer.demo", "replay a committed real Claude Code cassette with no engine: verified, its decisions, "
                         "an HTML page (--synthetic: the manager alone)",
        "Replays a committed recording of the real Claude Code CLI (or CASSETTE) through the adapter app and the "
        "trajectory manager with no engine and no GPU, and prints what was recorded, the verification (engine "
        "requests, replies, samples, then the golden), the message tree, every decision, the samples and the "
        "path of its inspect --html page. --synthetic replays a built-in synthetic session through the manager "
        "alone.",
        ("0: the replay matches its recording", "1: a difference",
         "2: the cassette cannot be replayed"), parses=True),
    "serve": Subcommand(
        "trajectory.adapters.serve", "run the adapter app in front of an SGLang engine",
        "Serves the adapter app (Anthropic Messages, OpenAI Chat and Responses, Gemini API, rendered to "
        "token ids for SGLang's /generate) in front of an engine, a router or tito's fake engine, with the "
        "trajectory manager building each session's samples; agents use the session id as their API key.",
        ("0: stopped by SIGINT or SIGTERM", "1: --listen is not HOST:PORT",
         "2: the settings cannot be used (an unknown parser name, a chat template that does not parse)"), parses=True),
    "fake-engine": Subcommand(
        "fake_engine.cli", "run the SGLang-compatible fake engine",
        "Starts an SGLang-compatible engine that needs no GPU: it plays a scenario's script (--script), the "
        "engine leg of a cassette (--cassette) or a built-in demo, with optional faults, and serves until "
        "stopped.",
        ("0: stopped by SIGINT or SIGTERM", "1: --listen is not HOST:PORT",
         "2: the scenario, cassette or options cannot be used")),
    "record": Subcommand(
        "recorder.cli", "record agent and engine traffic into a cassette",
        "The adapter app as a recording proxy in front of a live engine: both legs of every session (agent "
        "requests and replies, engine /generate calls) are written into a cassette, secrets redacted. With "
        "--agent it starts the agents itself and stops when they are done; otherwise it serves until stopped. "
        "Progress goes to stderr: a live line on a terminal, a line at most every 10 s otherwise.",
        ("0: stopped, or every started session succeeded",
         "1: a started agent session failed, or --listen is not HOST:PORT",
         "2: the options or the output cannot be used", "130: interrupted while agents ran")),
    "simulate": Subcommand(
        "recorder.simulate", "a scenario: fake engine, recording proxy, the real CLI; cassette and golden",
        "Records one scenario end to end with no GPU: the fake engine plays its script, tito record runs the "
        "pinned real CLI (installed with npm on first use) or the scripted client against it, and the "
        "cassette's golden is written.",
        ("0: the cassette (and its golden) was written", "1: the recording or the golden failed")),
    "scenario": Subcommand(
        "recorder.scenario_cli", "check scenario files against their model (check), print its JSON Schema",
        "Checks scenario files without running them (every section against its typed model, one line per file "
        "saying ok or what is wrong and where), or prints a scenario file's JSON Schema for editors.",
        ("0: every file is valid, or the schema was printed", "2: a file is invalid or cannot be read")),
    "replay": Subcommand(
        "replayer.replay_cli", "replay cassettes through the adapter and manager, verify, check goldens",
        "Replays cassettes offline through the current adapter and manager: each engine request, reply and "
        "sample is compared with the recording, and each session's result with its golden. A folder stands "
        "for the cassettes in it; a golden in it without its cassette, or a golden section for a session the "
        "cassette no longer has, is unused and fails. The what-if options replay under a candidate change.",
        ("0: every session matches its recording and its golden", "1: a difference, or an unused golden",
         "2: the input cannot be replayed (no such file, corrupt cassette, another tokenizer, unknown session)"),
        parses=True),
    "diff": Subcommand(
        "replayer.diff", "compare the training data of two cassettes, or of one under a candidate change",
        "Replays both sides and compares each pair of sessions: samples, forks by reason, trained tokens, and "
        "the first divergent token with the decoded text around it. Sessions pair by name, by --pair, or, for "
        "two cassettes of one session each, with each other.",
        ("0: nothing differs", "1: something differs (as diff(1))", "2: an input cannot be replayed"), parses=True),
    "cassette": Subcommand(
        "replayer.cassette_cli", "a cassette's summary (info), records as JSON (export), cut and merge",
        "Looks at and reshapes cassettes without replaying them: info (header and per-session counts), export "
        "(the records as JSON), cut (some sessions into a cassette of their own), merge (several into one). "
        "No action overwrites an existing file.",
        ("0: done", "2: unusable input (no such file, corrupt cassette, unknown session, an existing output)")),
    "inspect": Subcommand(
        "replayer.inspect_cli", "show a cassette's sessions: exchanges, tree, decisions; --html for a page",
        "Replays a cassette (differences noted, not failed) and shows each session's exchanges with token counts "
        "and timings, the manager's stats, the message tree and every decision with the sample token it lands "
        "on; --html writes it as one self-contained page with each sample's tokens coloured.",
        ("0: shown", "2: the input cannot be replayed (no such file, corrupt cassette, another tokenizer, "
                     "unknown session)"), parses=True),
}


class _Version(argparse.Action):
    """`--version`, its package metadata read only when asked (`tito --help` stays free of importlib.metadata)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("tito")
        except PackageNotFoundError:
            found = "unknown (not installed)"
        print(f"tito {found}")
        parser.exit()


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=78, break_on_hyphens=False)


def epilog(command: Subcommand) -> str:
    return exit_codes(command.exits)


def exit_codes(exits: tuple[str, ...]) -> str:
    codes = [*exits, *(() if any(e.startswith("2:") for e in exits) else (USAGE_ERROR,))]
    lines = ["exit codes:"]
    for entry in codes:
        code, _, meaning = entry.partition(": ")
        lines += textwrap.wrap(meaning, width=78, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7,
                               break_on_hyphens=False)
    return "\n".join(lines)


def action_parser(sub: Any, name: str, summary: str, description: str, exits: tuple[str, ...]
                  ) -> argparse.ArgumentParser:
    """A subcommand's action (`tito cassette cut`): its help says what it does and its exit codes, as a
    subcommand's does."""
    return sub.add_parser(name, help=summary, description=_wrapped(description), epilog=exit_codes(exits),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tito", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version, help="print tito's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = argv[0] if argv else None
    for name, command in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=command.summary, description=_wrapped(command.description),
                            epilog=epilog(command), formatter_class=argparse.RawDescriptionHelpFormatter)
        # Only the chosen subcommand's module is imported: its options are registered on demand.
        if name == wanted:
            module = importlib.import_module(command.module)
            module.add_arguments(sp)
            sp.set_defaults(_module=module)
    return parser


# Commands that have written and closed everything when they return: run as the program, they exit at once.
# Tearing down the interpreter (the tokenizer, sglang's parsers and their pydantic models) took 0.3 s of a 2 s
# `tito replay`; nothing in it is needed once their output is flushed.
EXIT_AT_ONCE = frozenset({"replay", "inspect", "diff", "cassette"})


def main(argv: list[str] | None = None) -> int:
    as_program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    command = SUBCOMMANDS.get(argv[0]) if argv else None
    if command is not None and command.parses:
        from trajectory.adapters import parser_process

        parser_process.start()  # first, so the parsers load while this process loads everything else
        from trajectory.tokenizer import prefetch_fingerprint

        prefetch_fingerprint()  # the embedded tokenizer's, which most cassettes name, meanwhile on a thread
    try:
        args = build_parser(argv).parse_args(argv)
        # The process ends once the command returns (below): a command may skip work only a later caller needs.
        args.exits_at_once = as_program and args.command in EXIT_AT_ONCE
        code = _run(args)
    finally:
        if command is not None and command.parses:
            parser_process.stop()
    if args.exits_at_once:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _run(args: argparse.Namespace) -> int:
    from trajectory.lazy_tls import defer_aiohttp_tls

    defer_aiohttp_tls()  # every subcommand but --help imports aiohttp's client: 0.1 s less start-up
    try:
        return int(args._module.run(args) or 0)
    except ImportError as exc:
        from trajectory.sglang_loader import SglangInstallError  # here: `tito --help` stays free of importlib.metadata

        if not isinstance(exc, SglangInstallError):
            raise
        print(f"tito {args.command}: {exc}", file=sys.stderr)  # the fix is an install command: no traceback
        return 2


if __name__ == "__main__":
    sys.exit(main())
