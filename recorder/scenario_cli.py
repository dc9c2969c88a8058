"""`tito scenario ACTION`: scenario files without running them.

`check FILE...`: every section of each file against its model (`recorder/scenario_file.py`); one line per
file, `ok` or what is wrong and where. Exit 0 when all are valid, 2 otherwise. `schema`: the JSON Schema of a
scenario file, for editors (YAML language servers read `# yaml-language-server: $schema=scenario.schema.json`).
"""

from __future__ import annotations

import argparse

from tito_rl.recorder.file_checks import check_files, print_schema


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="FILE", help="scenario files (YAML or JSON)")


# Each action: summary, description, exit codes (its --help) and its options (tito_rl.commands.Action).
ACTIONS = {
    "check": (
        "check scenario files against their model; exit 2 if any is invalid",
        "Checks each scenario file against its typed model without running it (the engine's script, the "
        "client's, faults, stream cuts): one line per file, ok or what is wrong and where, e.g. "
        "turns[3].tool_calls[0].arguments.",
        ("0: every file is valid", "2: a file is invalid or cannot be read"),
        _check_arguments,
    ),
    "schema": (
        "print the JSON Schema of a scenario file",
        "Prints the JSON Schema of a scenario file, made from the same model check uses, for editors "
        "(YAML language servers read `# yaml-language-server: $schema=scenario.schema.json`).",
        ("0: printed",),
        lambda parser: None,
    ),
}


def run(args: argparse.Namespace) -> int:
    from tito_rl.recorder.scenario_file import ScenarioError, check_scenario, scenario_schema

    if args.scenario_command == "schema":
        return print_schema(scenario_schema())

    def summary(path: str) -> str:
        checked = check_scenario(path)
        client = "no client" if checked.client is None else f"client {checked.client.agent}"
        return f"{len(checked.engine.sessions or ())} engine session(s), {client}"

    return check_files("scenario", args.paths, summary, ScenarioError)
