"""The records a cassette holds: the header, then per session its start, agent and engine exchanges,
samples and drops, as dataclasses (`cassettes/FORMAT.md`, "Records")."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from tito_rl.cassette.format.checks import check_fields
from tito_rl.cassette.format.errors import CorruptCassetteError, UnsupportedVersionError
from tito_rl.cassette.format.frames import encode_frame

FORMAT_VERSION = 7
# 2 = 1 + the optional index at the end; 3 = 2 with records compressed by any ratio (version 2 readers refused a
# record that inflated past 64x its stored size, so the version 2 writer stored those uncompressed); 4 = 3 + engine
# dialects (an engine record's `dialect`, and the deltas of OpenAI-style engine calls, which a version 3 reader
# would leave unresolved); 5 = 4 + per-token channels (routes, kept sets) stored as integers, routes as deltas on
# the session's earlier ones (extension 7, `routes.py`), which a version 4 reader does not know; 6 = 5 + a sample's
# routes as one integer array (extension 8); 7 = 6 + engine-wide events (`EngineEvent`, record type "event": a
# trainer's weight updates, pauses and aborts that belong to no session) and the engine calls' place among them
# (`EngineRecord.order`), which a version 6 reader would refuse as an unknown record type
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6, 7)
# The `session` of every engine-wide event: a name no session has (a session's name is never empty), so the
# index keeps the events' frames as one more entry, which the readers of sessions leave out.
ENGINE_WIDE = ""


def utc_now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def tito_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tito-rl")
    except PackageNotFoundError:
        return "0+unknown"


# `Header.adapter` keys whose absence does not mean today's default but the behaviour from before the setting
# existed: a cassette without `splice` was recorded with every prompt rendered, so it replays unspliced.
# Any other missing key counts as its default (replay builds `AdapterSettings` from the header).
ABSENT_ADAPTER_SETTINGS: dict[str, Any] = {"splice": False}


@dataclass
class Header:
    """What a replay must agree with: the tokenizer, the parsers, the adapter's settings, the engine."""

    tokenizer_fingerprint: str
    created: str = field(default_factory=utc_now_iso)  # pin it for byte-identical cassettes
    format_version: int = FORMAT_VERSION
    tito_version: str = field(default_factory=tito_version)
    parsers: dict[str, Any] = field(default_factory=dict)  # {"reasoning": "qwen3", "tool_call": "qwen25"}
    adapter: dict[str, Any] = field(default_factory=dict)  # adapter settings (threshold, reward policy...)
    agent: dict[str, Any] | None = None  # {"client": "claude-code", "version": "2.1.330"} when known
    engine: dict[str, Any] | None = None  # the engine's /model_info body
    extra: dict[str, Any] = field(default_factory=dict)
    # The system under test between the legs; None: tito's own adapter (every cassette before targets existed).
    target: dict[str, Any] | None = None  # {"kind": "tito"|"http"|"driver", "name", "version", "volatile", ...}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SessionStart:
    """First record of a session: its on-disk name and where the live id came from."""

    session: str
    source: str
    seq: int = 0


@dataclass
class AgentRecord:
    session: str
    seq: int
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    status: int
    reply_headers: dict[str, str]
    reply_body: bytes | None = None
    reply_events: list[str] | None = None
    started_s: float = 0.0
    duration_s: float = 0.0
    side: bool = False
    retry_of: int | None = None
    turn_index: int | None = None


@dataclass
class EngineRecord:
    session: str
    seq: int
    method: str
    path: str
    request: dict[str, Any] | None
    status: int
    response: Any = None
    error: str | None = None
    headers: dict[str, str | list[str]] = field(default_factory=dict)  # a list: vcrpy's repeated header
    started_s: float = 0.0
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. vcrpy's url and response headers
    # The engine API the call speaks (`tito_rl.trajectory.dialects`); None: a cassette from before dialects,
    # whose calls are SGLang's /generate. A streamed OpenAI-style answer's `response` is its chunks, in order.
    dialect: str | None = None
    # How to write `response` again as the bytes the engine sent (`tito_rl.cassette.answer_bytes`): a replay serves
    # them to a target that passes them on. None: not kept (before it existed; tito's own adapter's calls).
    wire: dict[str, Any] | None = None
    # Version 7: where the call sits among every engine call and engine-wide event of the recording, as
    # `[started, answered]` on one counter the recorder's engine tap advances at each call's start and answer
    # (never wall time): what the audit needs to know which weight update a call ran beside. None: not kept
    # (tito's own adapter's calls, every cassette before version 7).
    order: list[int] | None = None


@dataclass
class EngineEvent:
    """An engine call of no session (version 7): a trainer's weight update, pause, continue or abort made on the
    engine directly while sessions ran. `seq` is its number among the recording's events (its `session` is
    `ENGINE_WIDE`); `order` its `[started, answered]` on the counter of `EngineRecord.order`."""

    session: str
    seq: int
    method: str
    path: str
    request: dict[str, Any] | None
    status: int
    response: Any = None
    error: str | None = None
    order: list[int] = field(default_factory=list)
    dialect: str | None = None


@dataclass
class SamplesRecord:
    """The samples the live run produced at session finish, so a replay can prove it reproduces them."""

    session: str
    seq: int
    reward: float
    samples: list[dict[str, Any]]


@dataclass
class DropRecord:
    """The session was dropped through the session API: forgotten, no samples."""

    session: str
    seq: int


Record = SessionStart | AgentRecord | EngineRecord | SamplesRecord | DropRecord | EngineEvent
RECORD_TYPES: dict[str, type] = {
    "session": SessionStart,
    "agent": AgentRecord,
    "engine": EngineRecord,
    "samples": SamplesRecord,
    "drop": DropRecord,
    "event": EngineEvent,
}
TYPE_NAMES = {cls: name for name, cls in RECORD_TYPES.items()}


def encode_header(header: Header) -> bytes:
    data = header.to_dict()
    if data.get("target") is None:  # tito's own adapter: the header as every cassette before targets had it
        del data["target"]
    return encode_frame({"t": "header", **data})


def decode_header(record: dict[str, Any]) -> Header:
    """Version first: a future format may change everything except the header's `format_version` key."""
    if record.get("t") != "header":
        raise CorruptCassetteError("corrupt cassette: the first record is not a header")
    version = record.get("format_version")
    if version not in READABLE_VERSIONS:
        raise UnsupportedVersionError(
            f"cassette format version {version!r} is not supported (this tito reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        )
    known = {f.name for f in fields(Header)}
    try:
        header = Header(**{k: v for k, v in record.items() if k in known})
    except TypeError as exc:
        raise CorruptCassetteError(f"corrupt cassette: bad header: {exc}") from exc
    check_fields(header, "header")
    return header


def record_from_dict(record: dict[str, Any]) -> Record:
    cls = RECORD_TYPES.get(record["t"])
    if cls is None:
        raise CorruptCassetteError(f"corrupt cassette: unknown record type {record['t']!r}")
    known = {f.name for f in fields(cls)}
    try:
        built: Record = cls(**{k: v for k, v in record.items() if k in known})
        return built
    except TypeError as exc:
        raise CorruptCassetteError(f"corrupt cassette: bad {record['t']} record: {exc}") from exc
