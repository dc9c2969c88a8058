"""The single `tito` command line.

Each subcommand lives in the package that owns the concept and is imported lazily, so `tito --help`
stays fast and a subcommand's heavy imports (tokenizer, sglang parsers) are paid only when used.
A subcommand module exposes `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("replayer.demo", "replay a committed real Claude Code cassette with no engine: verified, its decisions, "
                              "an HTML page (--synthetic: the manager alone)"),
    "serve": ("trajectory.adapters.serve", "run the adapter app in front of an SGLang engine"),
    "fake-engine": ("fake_engine.cli", "run the SGLang-compatible fake engine"),
    "record": ("recorder.cli", "record agent and engine traffic into a cassette"),
    "simulate": ("recorder.simulate", "a scenario: fake engine, recording proxy, the real CLI; cassette and golden"),
    "scenario": ("recorder.scenario_cli", "check scenario files against their model (check), print its JSON Schema"),
    "replay": ("replayer.replay_cli", "replay cassettes through the adapter and manager, verify, check goldens"),
    "diff": ("replayer.diff", "compare the training data of two cassettes, or of one under a candidate change"),
    "cassette": ("replayer.cassette_cli", "a cassette's summary (info), records as JSON (export), cut and merge"),
    "inspect": ("replayer.inspect_cli", "show a cassette's sessions: exchanges, tree, decisions; --html for a page"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tito", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = argv[0] if argv else None
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text)
        # Only the chosen subcommand's module is imported: its options are registered on demand.
        if name == wanted:
            module = importlib.import_module(module_name)
            module.add_arguments(sp)
            sp.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv).parse_args(argv)
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
