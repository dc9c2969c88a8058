"""The single `tito` command line.

Each subcommand lives in the package that owns the concept and is imported lazily, so `tito --help`
stays fast and a subcommand's heavy imports (tokenizer, sglang parsers) are paid only when used.
What each does and its exit codes are said in one table (`commands`), so every `tito COMMAND --help` says them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
from typing import Any

from tito_rl.commands import SUBCOMMANDS, USAGE_ERROR, Action, Subcommand


class _Version(argparse.Action):
    """`--version`, its package metadata read only when asked (`tito --help` stays free of importlib.metadata)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("tito-rl")
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
        lines += textwrap.wrap(
            meaning, width=78, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7, break_on_hyphens=False
        )
    return "\n".join(lines)


def add_actions(parser: argparse.ArgumentParser, name: str, actions: dict[str, Action]) -> None:
    """A subcommand's actions (`tito cassette cut`): each action's help says what it does and its exit codes, as a
    subcommand's does; the one chosen is `args.<name>_command`."""
    sub = parser.add_subparsers(dest=f"{name}_command", required=True, metavar="ACTION")
    for action, (summary, description, exits, add_arguments) in actions.items():
        add_arguments(
            sub.add_parser(
                action,
                help=summary,
                description=_wrapped(description),
                epilog=exit_codes(exits),
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tito", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=_Version, help="print tito's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = argv[0] if argv else None
    for name, command in SUBCOMMANDS.items():
        sp = sub.add_parser(
            name,
            help=command.summary,
            description=_wrapped(command.description),
            epilog=epilog(command),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        # Only the chosen subcommand's module is imported: its options are registered on demand.
        if name == wanted:
            module = importlib.import_module(command.module)
            if hasattr(module, "ACTIONS"):
                add_actions(sp, name, module.ACTIONS)
            else:
                module.add_arguments(sp)
            sp.set_defaults(_module=module, **dict(command.injects))
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
        from tito_rl.trajectory.adapters.parsing import parser_process

        parser_process.start()  # first, so the parsers load while this process loads everything else
        from tito_rl.trajectory.tokens.tokenizer import prefetch_fingerprint

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
    from tito_rl.trajectory.runtime.lazy_tls import defer_aiohttp_tls

    defer_aiohttp_tls()  # every subcommand but --help imports aiohttp's client: 0.1 s less start-up
    try:
        return int(args._module.run(args) or 0)
    except ImportError as exc:
        from tito_rl.trajectory.adapters.parsing.sglang_loader import (
            SglangInstallError,  # here: `tito --help` stays free of importlib.metadata
        )

        if not isinstance(exc, SglangInstallError):
            raise
        print(f"tito {args.command}: {exc}", file=sys.stderr)  # the fix is an install command: no traceback
        return 2


if __name__ == "__main__":
    sys.exit(main())
