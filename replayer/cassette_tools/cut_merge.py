"""Cut and merge cassettes: `tito cassette cut` keeps some sessions (a bug report's attachment), `tito cassette
merge` joins the cassettes several proxies recorded.

Both copy records as the reader decodes them, through `CassetteWriter.append_redacted`: never redacted a
second time (a pass with other patterns could change bodies that replay re-sends byte for byte), and each
session's deltas re-encoded from scratch, which is exact because deltas never cross sessions. Inputs are
checked in full before the output is created, and an output is never overwritten: like `tito record`, these
tools only ever make new cassettes, and a failure part way removes the partial one.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tito_rl.cassette.format.errors import CassetteError
from tito_rl.cassette.format.records import ABSENT_ADAPTER_SETTINGS, EngineEvent, Header
from tito_rl.cassette.reader import CassetteReader, CassetteSummary, summarize
from tito_rl.cassette.writer import CassetteWriter

# Header.adapter keys a replay does not depend on: where the live engine was, how long the adapter waited
# for it (replay serves the engine leg from the cassette, at once), and the tokenizer's local folder (the
# fingerprint, compared on its own, says whether two tokenizers are the same). Every other key shapes the
# prompts, replies or samples a replay verifies (chat template, reasoning preservation, system folding,
# context length and default max tokens in the sampling params, the model name in replies, the parsers, the
# manager's settings), so it must agree; a key not listed here is compared too, so a setting added later is
# never merged silently.
MERGE_IGNORED_ADAPTER_KEYS = frozenset(
    {
        "engine_url",
        "engine_timeout_s",
        "abort_grace_s",
        "disconnect_poll_s",
        "tokenizer_dir",
    }
)
_MISSING = object()
_SHOWN_CHARS = 60


class CassetteToolError(Exception):
    """The inputs cannot be cut or merged as asked; the message is the one line the CLI prints."""


@dataclass
class Written:
    """A cassette a tool made: its sessions in file order, and warnings about its inputs."""

    path: Path
    sessions: list[str]
    warnings: list[str] = field(default_factory=list)


def cut(source: str | os.PathLike[str], out: str | os.PathLike[str], sessions: Sequence[str]) -> Written:
    """A new cassette with `source`'s header and only the named sessions' records, in their file order."""
    summary = read_summary(source)
    available = [s.session for s in summary.sessions]
    require_sessions(source, available, sessions)
    wanted = set(sessions)
    with new_cassette(out, summary.header) as writer, CassetteReader(source) as reader:
        for record in reader.records():
            if record.session in wanted or isinstance(record, EngineEvent):  # updates: beside every session
                writer.append_redacted(record)
    return Written(Path(out), [n for n in available if n in wanted], truncation_warnings([(source, summary)]))


def merge(sources: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str]) -> Written:
    """One cassette holding every input's sessions, input after input, each input's records in file order.

    The header is the first input's, with `extra.merged_from` naming every input. Inputs must agree on what
    replay depends on (`replay_settings`) and share no session name. A truncated input is merged up to its
    last complete record, with a warning.
    """
    if not sources:
        raise CassetteToolError("no cassettes to merge")
    summaries = [(path, read_summary(path)) for path in sources]
    first_path, first = summaries[0]
    for path, summary in summaries[1:]:
        difference = settings_difference(first.header, summary.header, str(first_path), str(path))
        if difference is not None:
            raise CassetteToolError(f"cannot merge: {difference}; replay depends on it")
    owners: dict[str, str | os.PathLike[str]] = {}
    for path, summary in summaries:
        for s in summary.sessions:
            if s.session in owners:
                raise CassetteToolError(
                    f"session {s.session!r} is in both {owners[s.session]} and {path}; "
                    "session names must be unique in a cassette"
                )
            owners[s.session] = path
    header = Header(
        **{
            **first.header.to_dict(),
            "extra": {**first.header.extra, "merged_from": [source_note(p, s) for p, s in summaries]},
        }
    )
    warnings = truncation_warnings(summaries)
    events_from: str | os.PathLike[str] | None = None  # one recording's engine counter: the first input's events
    with new_cassette(out, header) as writer:
        for path, summary in summaries:
            keep_events = events_from is None and summary.events > 0
            if summary.events and not keep_events:
                warnings.append(
                    f"{path}: its {summary.events} engine-wide event(s) left out: their order counts another "
                    f"recording's engine calls than {events_from}'s"
                )
            events_from = path if keep_events else events_from
            with CassetteReader(path) as reader:
                for record in reader.records():
                    if keep_events or not isinstance(record, EngineEvent):
                        writer.append_redacted(record)
    return Written(Path(out), list(owners), warnings)


def replay_settings(header: Header) -> dict[str, Any]:
    """What a merge requires its inputs to agree on, flattened to dotted keys (`adapter.manager.reward_policy`)
    so a refusal names the exact setting: the tokenizer, the parsers, the adapter settings that replay uses.

    A setting the header lacks (recorded before it existed, or by vcrpy) counts as its default, as replay
    builds the adapter and manager from the header with defaults for what is missing, except where its absence
    means the behaviour from before it existed (`ABSENT_ADAPTER_SETTINGS`: no `splice`, prompts rendered)."""
    defaults = default_adapter_settings()
    manager = {**defaults["manager"], **(header.adapter.get("manager") or {})}
    adapter = {**defaults, **ABSENT_ADAPTER_SETTINGS, **header.adapter, "manager": manager}
    flat: dict[str, Any] = {"tokenizer_fingerprint": header.tokenizer_fingerprint}
    _flatten("parsers", header.parsers, flat)
    _flatten("adapter", {k: v for k, v in adapter.items() if k not in MERGE_IGNORED_ADAPTER_KEYS}, flat)
    return flat


def default_adapter_settings() -> dict[str, Any]:
    """This tito's defaults as a recording's header writes them (`adapter`, with `manager` inside)."""
    # Imported here: the adapter app pulls in the parsers, which `tito cassette info` has no need for.
    from tito_rl.recorder.taps.proxy import adapter_settings_dict
    from tito_rl.trajectory.adapters.app import AdapterSettings
    from tito_rl.trajectory.manager import TrajectoryManager

    return {**adapter_settings_dict(AdapterSettings()), "manager": TrajectoryManager().settings()}


def settings_difference(first: Header, other: Header, first_name: str, other_name: str) -> str | None:
    """The first replay setting two headers disagree on, with both values, or None when they agree."""
    a, b = replay_settings(first), replay_settings(other)
    differing = [k for k in list(a) + [k for k in b if k not in a] if a.get(k, _MISSING) != b.get(k, _MISSING)]
    if not differing:
        return None
    key = differing[0]
    more = f" (and {len(differing) - 1} more setting(s))" if len(differing) > 1 else ""
    return (
        f"{key} is {_show(b.get(key, _MISSING))} in {other_name} but {_show(a.get(key, _MISSING))} in "
        f"{first_name}{more}"
    )


def source_note(path: str | os.PathLike[str], summary: CassetteSummary) -> dict[str, Any]:
    """What `extra.merged_from` says of one input: where it came from, when and by what it was recorded."""
    header = summary.header
    note: dict[str, Any] = {
        "path": str(path),
        "created": header.created,
        "tito_version": header.tito_version,
        "agent": header.agent,
        "sessions": [s.session for s in summary.sessions],
    }
    if summary.truncated:
        note["truncated"] = True
    if "merged_from" in header.extra:
        note["merged_from"] = header.extra["merged_from"]
    return note


def read_summary(path: str | os.PathLike[str]) -> CassetteSummary:
    """The whole input read once, so a corrupt record fails the tool before it writes anything."""
    try:
        return summarize(path)
    except FileNotFoundError:
        raise CassetteToolError(f"{path}: no such cassette") from None
    except (CassetteError, OSError) as exc:
        raise CassetteToolError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None


def require_sessions(path: str | os.PathLike[str], available: Sequence[str], names: Sequence[str]) -> None:
    unknown = [n for n in dict.fromkeys(names) if n not in available]
    if unknown:
        raise CassetteToolError(
            f"{path}: no session {', '.join(map(repr, unknown))}; it has {', '.join(available) or 'none'}"
        )


def truncation_warnings(inputs: Sequence[tuple[str | os.PathLike[str], CassetteSummary]]) -> list[str]:
    return [
        f"{path} ends in a cut record (the recorder stopped mid-write); copied up to its last complete record"
        for path, summary in inputs
        if summary.truncated
    ]


@contextlib.contextmanager
def new_cassette(out: str | os.PathLike[str], header: Header) -> Iterator[CassetteWriter]:
    """A writer of a cassette that must not exist yet; removed again if copying into it fails."""
    try:
        writer = CassetteWriter(out, header, header_redacted=True)
    except FileExistsError:
        raise CassetteToolError(f"{out} exists; tito never overwrites a cassette") from None
    except OSError as exc:
        raise CassetteToolError(f"{out}: {exc.strerror or exc}") from None
    try:
        with writer:
            yield writer
    except BaseException as exc:
        Path(out).unlink(missing_ok=True)
        if isinstance(exc, CassetteError | OSError):
            raise CassetteToolError(str(exc)) from None
        raise


def _flatten(prefix: str, value: Any, into: dict[str, Any]) -> None:
    if isinstance(value, dict):  # an empty map adds no key: `{}` and no map mean the same defaults
        for key in sorted(value, key=str):
            _flatten(f"{prefix}.{key}", value[key], into)
    else:
        into[prefix] = value


def _show(value: Any) -> str:
    if value is _MISSING:
        return "missing"
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"
