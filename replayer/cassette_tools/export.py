"""`tito cassette export`: a cassette as one JSON document, for `jq` and for reading.

`{"header": {...}, "records": [...], "truncated": bool}`, records in file order, each `{"type": ..., <its
fields>}` decoded as the reader decodes it: token deltas resolved to id lists, masks and logprob columns as
lists, agent bodies as parsed JSON when they are JSON and as text otherwise (bytes that are not UTF-8 as
`\\xNN` escapes), SSE events as their text; an engine generation also gets `view`, the dialect-neutral reading of
it (`tito_rl.trajectory.dialects`: prompt and output ids, logprobs, finish reason, sampling; null where the call
does not say). Records are written as they are read, one per line, so a large
cassette never sits in memory as JSON; the output is ASCII (non-ASCII as `\\u` escapes) and depends only on
the cassette, so two exports are byte-identical wherever they run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Collection
from dataclasses import asdict, fields
from typing import Any, TextIO

from tito_rl.cassette.format.records import RECORD_TYPES, EngineRecord, Record
from tito_rl.cassette.reader import CassetteReader
from tito_rl.trajectory.dialects.registry import is_generation, record_view

_TYPE_NAMES = {cls: name for name, cls in RECORD_TYPES.items()}


def export(path: str | os.PathLike[str], out: TextIO, sessions: Collection[str] | None = None) -> bool:
    """Write `path` as JSON to `out`, only the named sessions' records when `sessions` is given; returns
    whether the cassette ends in a cut record (then `truncated` is true and every record listed is whole)."""
    with CassetteReader(path) as reader:
        out.write('{"header": ' + _dumps(jsonable(reader.header.to_dict()), indent=2) + ',\n"records": [')
        separator = "\n"
        for record in reader.records():
            if sessions is None or record.session in sessions:
                out.write(separator + _dumps(record_json(record)))
                separator = ",\n"
        out.write(f'\n],\n"truncated": {_dumps(reader.truncated)}}}\n')
        return reader.truncated


def record_json(record: Record) -> dict[str, Any]:
    """One decoded record as JSON values: `type` first, then its fields in the format's order, then an engine
    generation's `view`."""
    data = {"type": _TYPE_NAMES[type(record)], **{f.name: jsonable(getattr(record, f.name)) for f in fields(record)}}
    if isinstance(record, EngineRecord) and is_generation(record.path):
        data["view"] = jsonable(asdict(record_view(record)))
    return data


def jsonable(value: Any) -> Any:
    """Bytes become their JSON or their text, and non-finite floats (not JSON) the strings Python writes."""
    if isinstance(value, bytes | bytearray | memoryview):
        return _body(bytes(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if all(type(v) is int for v in value):  # token ids and masks (150k of them): nothing to convert
            return value
        return [jsonable(v) for v in value]
    if type(value).__module__ == "numpy":  # a view's expert routes and kept sets (trajectory.channels)
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf'
    return value


def _body(data: bytes) -> Any:
    try:
        return jsonable(json.loads(data))
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is a ValueError)
        return data.decode("utf-8", errors="backslashreplace")


def _dumps(value: Any, indent: int | None = None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=True, allow_nan=False)
