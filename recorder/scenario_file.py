"""A whole scenario file, checked at once: the engine's script, its `client:` section (the scripted client's
script or a real CLI's) and the `tito record` flags in `client.record_args`.

`tito record --scenario` and `tito simulate` call `check_scenario` before they start anything, and `tito
fake-engine --script` checks the engine's side the same way (`fake_engine.policies.scripted.load_scenario`: the
client's side is not its to play), so one mistake gives the same one line from each: `FILE: path: what is wrong`.
`tito scenario check FILE...` runs it alone; `tito scenario schema` prints the file's JSON Schema for editors (the same
Structs, so the schema cannot drift from what the tools accept).
"""

from __future__ import annotations

import argparse
import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from tito_rl.fake_engine.policies.scripted import Scenario, parse_scenario, read_scenario_data
from tito_rl.fake_engine.scenario_model import ScenarioError as ScenarioError  # raised by check_scenario
from tito_rl.fake_engine.scenario_model import validate
from tito_rl.recorder.agents.cli_script import SCRIPTED, CliClient
from tito_rl.recorder.scripted.script import ClientScript


@dataclass(frozen=True)
class ScenarioFile:
    path: Path
    engine: Scenario
    client: ClientScript | CliClient | None  # None: an engine script only (fake_engine/examples/)

    @property
    def record_args(self) -> tuple[str, ...]:
        return self.client.record_args if self.client is not None else ()

    @property
    def engine_args(self) -> tuple[str, ...]:
        """The fake engine's extra start flags (the scripted client's `engine_args`: `--enable-return-routed-experts`
        for a scenario whose `moe:` model serves routes)."""
        return getattr(self.client, "engine_args", ())


def check_scenario(path: str | Path) -> ScenarioFile:
    """Every section of the file, or a ScenarioError `PATH: where: what` (one line)."""
    path = Path(path)
    try:
        data = read_scenario_data(path)
        engine = parse_scenario(data, default_name=path.stem)
        client = parse_client(engine.client)
        problem = record_args_problem(client.record_args) if client is not None else None
        if problem:
            raise ScenarioError(f"client.record_args: {problem}")
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    except OSError as exc:
        raise ScenarioError(f"{path}: {exc.strerror or exc}") from None
    return ScenarioFile(path, engine, client)


def parse_client(data: dict[str, Any] | None) -> ClientScript | CliClient | None:
    """`client.agent` says which: `scripted` (the default) or a pinned CLI."""
    if data is None:
        return None
    if data.get("agent", SCRIPTED) == SCRIPTED:
        return validate(data, ClientScript, where="client")
    return validate(data, CliClient, where="client")


def record_args_problem(record_args: tuple[str, ...]) -> str | None:
    """What is wrong with `client.record_args` as `tito record` flags (unknown, or a bad value), or None."""
    from tito_rl.recorder.record_options import add_arguments

    parser = argparse.ArgumentParser(prog="tito record", add_help=False, exit_on_error=False)
    add_arguments(parser)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed, unknown = parser.parse_known_args(["--engine", "http://-", "--out", "-", *record_args])
    except argparse.ArgumentError as exc:
        return str(exc)
    except SystemExit:
        return f"not valid tito record flags: {' '.join(record_args)}"
    if unknown:
        return f"not tito record flags: {' '.join(unknown)}"
    from tito_rl.trajectory.adapters.serve import options_problem

    return options_problem(parsed)


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file: the engine's keys, and `client:` as one of the two clients."""
    (engine, scripted, cli), components = msgspec.json.schema_components(
        [Scenario, ClientScript, CliClient], ref_template="#/$defs/{name}"
    )
    top = components[Scenario.__name__]
    top["properties"]["client"] = {
        "anyOf": [scripted, cli, {"type": "null"}],
        "description": "the client's side: the scripted client (agent: scripted, the default) or a pinned real CLI",
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "tito scenario file",
        **engine,
        "$defs": components,
    }
