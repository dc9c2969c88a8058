"""What a replay starts from: the cassette read and checked (its header's settings, its tokenizer), the
sessions chosen, the target named. Anything wrong here is unusable input (`ReplayInputError`, exit 2)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any, get_type_hints

import msgspec

from tito_rl.cassette.format.errors import CassetteError, TokenizerMismatchError
from tito_rl.cassette.format.records import ABSENT_ADAPTER_SETTINGS, Header
from tito_rl.cassette.reader import Cassette, SessionLog, check_tokenizer, open_cassette
from tito_rl.recorder.targets.base import TargetError
from tito_rl.recorder.targets.profiles.trust import ReplayTarget, recorded_ref, resolve
from tito_rl.recorder.targets.registry import TargetSpec
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.engine.routes_layout import given_layout
from tito_rl.trajectory.dialects.view import SGLANG
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.tokens.tokenizer import fingerprint

# A recording from before the adapter asked for kept sets never asked for them (whether it asks for routes, a replay
# learns from the recording's own engine calls: `engine_leg.CassetteTransport` answers `/get_server_info`).
ABSENT_CHANNEL_SETTINGS: dict[str, Any] = {"engine_kept_sets": False}
LOCAL_SETTINGS = frozenset({"client_session_factory", "rid_factory", "clock", "disconnect_poll_s"})


class ReplayInputError(Exception):
    """The input cannot be replayed at all (corrupt cassette, other tokenizer, unknown session): exit 2."""


class TargetUnavailableError(ReplayInputError):
    """The target to replay through is not installed here (a slime cassette where slime is not): tests skip."""


def load_cassette(
    path: str | os.PathLike[str], tokenizer: str | None = None, verify: bool = True
) -> tuple[Cassette, str | None]:
    """The cassette (its sessions read from the file as they are replayed) and the tokenizer folder to replay it
    with; `ReplayInputError` when it cannot be. `verify`: every frame checked first (`open_cassette`). Recorded
    prompts are read packed: replay counts, compares and slices them, and a long session's are most of its reading."""
    try:
        cassette = open_cassette(path, verify, packed_prompts=True)
    except FileNotFoundError:
        raise ReplayInputError(f"{path}: no such cassette") from None
    except (CassetteError, OSError) as exc:
        raise unreadable(path, exc) from None
    problem = settings_problem(cassette.header)
    if problem:
        raise ReplayInputError(f"{path}: header {problem}")
    folder = tokenizer or cassette.header.adapter.get("tokenizer_dir")
    if folder and not Path(folder).is_dir():
        raise ReplayInputError(
            f"{path}: recorded with the tokenizer in {folder}, which is not on this machine; pass --tokenizer DIR"
        )
    try:
        check_tokenizer(cassette.header, fingerprint(folder), os.fspath(path))
    except TokenizerMismatchError as exc:
        raise ReplayInputError(str(exc)) from None
    except FileNotFoundError as exc:
        raise ReplayInputError(f"{path}: {exc}") from None
    return cassette, folder


def unreadable(path: str | os.PathLike[str], exc: Exception) -> ReplayInputError:
    return ReplayInputError(str(exc) if str(path) in str(exc) else f"{path}: {exc}")


def read_session(cassette: Cassette, path: str, name: str) -> SessionLog:
    """A session's records, read from the file now; `ReplayInputError` for a damaged one."""
    try:
        return cassette.sessions[name]
    except (CassetteError, OSError) as exc:
        raise unreadable(path, exc) from None


def settings_problem(header: Header) -> str | None:
    """What is wrong with the settings a header gives the adapter and the manager (a cassette can come from a
    pull request): a value of another type than the setting's, or a manager setting that does not exist."""
    adapter_types = get_type_hints(AdapterSettings)
    manager_types = {k: v for k, v in get_type_hints(TrajectoryManager.__init__).items() if k != "return"}
    manager = header.adapter.get("manager", {})
    if not isinstance(manager, dict):
        return f"adapter.manager: expected a map, got {type(manager).__name__}"
    checks = [
        (f"adapter.{k}", v, adapter_types[k])
        for k, v in header.adapter.items()
        if k in adapter_types and k not in LOCAL_SETTINGS
    ]
    for key, value in manager.items():
        if key not in manager_types:
            return f"adapter.manager.{key}: not a setting of this tito's manager"
        checks.append((f"adapter.manager.{key}", value, manager_types[key]))
    checks += [
        (f"parsers.{k}", header.parsers[k], str | None) for k in ("tool_call", "reasoning") if k in header.parsers
    ]
    for where, value, hint in checks:
        try:
            msgspec.convert(value, hint)
        except msgspec.ValidationError as exc:
            return f"{where}: {exc}"
    try:
        TrajectoryManager(**manager)
    except ValueError as exc:
        return f"adapter.manager: {exc}"
    try:
        given_layout(header.adapter.get("engine_routes_layout"))
    except ValueError as exc:
        return f"adapter.{exc}"
    return None


def adapter_settings(header: Header, tokenizer: str | None, overrides: dict[str, Any]) -> AdapterSettings:
    known = {f.name for f in fields(AdapterSettings)} - LOCAL_SETTINGS
    values = {
        **ABSENT_ADAPTER_SETTINGS,
        **ABSENT_CHANNEL_SETTINGS,
        **{k: v for k, v in header.adapter.items() if k in known},
    }
    if "tool_call" in header.parsers:
        values["tool_parser"] = header.parsers["tool_call"]
    if "reasoning" in header.parsers:
        values["reasoning_parser"] = header.parsers["reasoning"]
    values.update(overrides)
    values["tokenizer_dir"] = tokenizer
    return AdapterSettings(**values, disconnect_poll_s=0.002)


def recorded_engine_model(cassette: Cassette) -> str | None:
    """The served model the recording's engine calls named: what a replay sends where the header does not say it
    (an adapter that asked the engine mid-run, `EngineClient.served_model`)."""
    for name in cassette.sessions:
        try:
            engine = cassette.sessions[name].engine
        except CassetteError:  # passed over: its own replay reports it
            continue
        for record in engine:
            model = record.request.get("model") if isinstance(record.request, dict) else None
            if isinstance(model, str) and model:
                return model
    return None


def select_sessions(cassette: Cassette, path: str, names: Iterable[str] | None, missing_ok: bool = False) -> list[str]:
    """The sessions to replay, in cassette order; `missing_ok` skips names this cassette lacks."""
    available = list(cassette.sessions)
    if names is None:
        return available
    wanted = set(names)
    unknown = sorted(wanted - set(available))
    if unknown and not missing_ok:
        raise ReplayInputError(
            f"{path}: no session {', '.join(map(repr, unknown))}; it has {', '.join(available) or 'none'}"
        )
    return [n for n in available if n in wanted]


def recorded_target(header: Header) -> str:
    """The target a cassette was recorded around, as `--target` names it."""
    return recorded_ref(header.target)


def replay_choice(header: Header, chosen: str | None, path: str, trust: bool = False) -> ReplayTarget:
    """The target to replay through and what its driver runs (`trust.resolve`): `--target` when given, else the
    target the header names (tito's adapter for every older cassette) where the user has it installed, else, with
    `trust` (`--trust-cassette`), the cassette's own. What only the cassette names is refused: unusable input."""
    try:
        return resolve(header.target, chosen, trust)
    except TargetError as exc:
        raise ReplayInputError(f"{path}: {exc}") from None


def replay_target(header: Header, chosen: str | None, path: str, trust: bool = False) -> TargetSpec:
    """`replay_choice`'s target."""
    return replay_choice(header, chosen, path, trust).spec


def recorded_routes_layout(cassette: Cassette) -> tuple[int, int] | None:
    """How the live adapter split SGLang's flat route rows where the header does not say: its engine was not up when
    `tito record` started, so it learned the split before its first generation, after the header was written. The
    recorded samples keep that split (their routes' shape, `[rows, layers, top_k]`), so a replay splits the same way
    with no model folder. The first sample with routes decides: None where it keeps them flat (its
    `metadata.routes_layout` says so); a session whose `/generate` calls never asked for routes ends the search (the
    adapter asks every call once the engine serves them), so a recording without routes reads one session. A header
    with the engine's `/model_info` was written with the engine up, when `tito record` learned what split there was
    to learn: no session is read. A session that does not read is passed over: its own replay reports it."""
    import numpy as np

    if cassette.header.engine is not None:
        return None
    for name in cassette.sessions:
        try:
            log = cassette.sessions[name]
        except CassetteError:
            continue
        asked = [isinstance(r.request, dict) and bool(r.request.get("return_routed_experts")) for r in log.engine]
        if asked and not any(asked):
            return None
        for sample in log.samples:
            routes = sample.get("rollout_routed_experts")
            if routes is None:
                continue
            metadata = sample.get("metadata")
            if isinstance(metadata, dict) and "routes_layout" in metadata:
                return None
            shape = np.shape(routes)
            return (int(shape[1]), int(shape[2])) if len(shape) == 3 and min(shape[1:]) > 0 else None
    return None


def replay_routes_layout(cassette: Cassette, settings: AdapterSettings) -> tuple[int, int] | None:
    """The route split a replay's adapter is given: the header's, else (SGLang's rows) the recorded samples'."""
    if settings.engine_routes_layout is not None or settings.engine_dialect != SGLANG:
        return settings.engine_routes_layout
    return recorded_routes_layout(cassette)
