"""`tito profile ACTION`: gateway profile files without running them (`recorder/targets/profiles/format.py`).

`check FILE...`: each file against the format; one line per file, `ok` or what is wrong and where. Exit 0 when all
are valid, 2 otherwise. `schema`: the JSON Schema of a profile file, for editors.
"""

from __future__ import annotations

import argparse

from tito_rl.recorder.file_checks import check_files, print_schema


def _check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="FILE", help="gateway profile files (YAML)")


# Each action: summary, description, exit codes (its --help) and its options (tito_rl.commands.Action).
ACTIONS = {
    "check": (
        "check gateway profile files against the format; exit 2 if any is invalid",
        "Checks each gateway profile (docs/targets.md) against the format without starting the gateway: one line "
        "per file, ok or what is wrong and where, e.g. samples.calls.prompt_ids.",
        ("0: every file is valid", "2: a file is invalid or cannot be read"),
        _check_arguments,
    ),
    "schema": (
        "print the JSON Schema of a gateway profile file",
        "Prints the JSON Schema of a gateway profile, made from the same model check uses, for editors (YAML "
        "language servers read `# yaml-language-server: $schema=profile.schema.json`).",
        ("0: printed",),
        lambda parser: None,
    ),
}


def run(args: argparse.Namespace) -> int:
    from tito_rl.recorder.targets.profiles.format import ProfileError, load_profile, profile_schema

    if args.profile_command == "schema":
        return print_schema(profile_schema())

    def summary(path: str) -> str:
        profile = load_profile(path)
        samples = profile.samples
        where = (
            "nowhere (replies and engine calls only)"
            if not samples
            else "a function"
            if samples.function
            else "its calls"
            if samples.calls
            else "ready rows"
        )
        sessions = profile.sessions.session_from
        return f"profile {profile.profile}, {profile.name}, sessions from {sessions}, samples from {where}"

    return check_files("profile", args.paths, summary, ProfileError)
