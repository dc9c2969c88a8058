"""First differences between what was recorded and what a replay produced, said so a person can act on them.

Three kinds of comparison, each stopping at its first difference: token ids (engine prompts, sample tokens)
reported by index with the decoded text on both sides; JSON (agent replies, SSE events, sample metadata)
reported as a path such as `content[1].input.command`; and plain fields. A `Difference` carries a one-line
summary and the detail lines under it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from tito_rl.cassette.format.packing import PackedIds, pack_u32, packed_prefix_len

Decode = Callable[[list[int]], str]
CONTEXT_TOKENS = 12
MAX_VALUE_CHARS = 160
_MISSING = object()


@dataclass
class Difference:
    kind: str  # engine-request, engine-calls, reply, samples, golden, stall, error
    summary: str  # one line: what differs, where
    exchange: int | None = None  # the session's agent exchange (answer order)
    turn: int | None = None
    detail: list[str] = field(default_factory=list)

    def where(self) -> str:
        parts = []
        if self.exchange is not None:
            parts.append(f"agent exchange {self.exchange}")
        if self.turn is not None:
            parts.append(f"turn {self.turn}")
        return ", ".join(parts)

    def render(self, cassette: str, session: str) -> str:
        where = self.where()
        head = f"{cassette}: session {session}" + (f", {where}" if where else "") + f": {self.summary}"
        return "\n".join([head, *("    " + line for line in self.detail)])


def short(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=False)
    text = repr(text) if isinstance(value, str) else text
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"


# --- token ids --------------------------------------------------------------------------------------------


def token_divergence(recorded: Sequence[int], replayed: Sequence[int]) -> int | None:
    """First index where two id lists differ (a length difference counts); None when equal."""
    if recorded == replayed or list(recorded) == list(replayed):  # the usual case, at C speed (no copy for lists)
        return None
    return packed_prefix_len(_packed(recorded), _packed(replayed))


def _packed(ids: Sequence[int]) -> bytes:
    return ids.packed if isinstance(ids, PackedIds) else pack_u32(list(ids))


LABELS = ("recorded", "replayed")


def token_context(
    recorded: Sequence[int], replayed: Sequence[int], index: int, decode: Decode, labels: tuple[str, str] = LABELS
) -> list[str]:
    """Decoded text around `index` on both sides: `...before | after`."""
    start = max(0, index - CONTEXT_TOKENS)
    lines = []
    for label, ids in zip(labels, (recorded, replayed), strict=True):
        before, after = list(ids[start:index]), list(ids[index : index + CONTEXT_TOKENS])
        after_text = repr(decode(after)) if after else "<end>"
        lines.append(f"{label}: …{decode(before)!r} | {after_text}  (ids from {index}: {after[:6]})")
    return lines


def message_at(ids: Sequence[int], index: int, decode: Decode, message_start: int | None) -> str | None:
    """The rendered chat message that holds token `index`: its number, role and opening text.

    Messages are found by the template's message-start token (`<|im_start|>` for ChatML templates such as
    Qwen's); without one, None.
    """
    if message_start is None:
        return None
    starts = [i for i, t in enumerate(ids[: index + 1]) if t == message_start]
    if not starts:
        return "before the first message (template preamble)"
    begin = starts[-1]
    end = next((i for i in range(begin + 1, len(ids)) if ids[i] == message_start), len(ids))
    text = decode(list(ids[begin + 1 : min(end, begin + 1 + 48)]))
    role, _, body = text.partition("\n")
    return f"rendered message {len(starts) - 1} ({role.strip() or '?'}): {short(body)}"


# --- JSON ------------------------------------------------------------------------------------------------


def json_difference(recorded: Any, replayed: Any, path: str = "") -> tuple[str, Any, Any] | None:
    """(path, recorded value, replayed value) at the first difference, depth first; None when equal."""
    if type(recorded) is not type(replayed) and not (_number(recorded) and _number(replayed)):
        return path or "(root)", recorded, replayed
    if isinstance(recorded, dict):
        for key in list(recorded) + [k for k in replayed if k not in recorded]:
            a, b = recorded.get(key, _MISSING), replayed.get(key, _MISSING)
            if a is _MISSING or b is _MISSING:
                return _join(path, key), _shown(a), _shown(b)
            found = json_difference(a, b, _join(path, key))
            if found:
                return found
        return None
    if isinstance(recorded, list):
        for i, (a, b) in enumerate(zip(recorded, replayed, strict=False)):
            found = json_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        if len(recorded) != len(replayed):
            i = min(len(recorded), len(replayed))
            return (
                f"{path}[{i}]",
                _shown(recorded[i] if i < len(recorded) else _MISSING),
                _shown(replayed[i] if i < len(replayed) else _MISSING),
            )
        return None
    return None if recorded == replayed else (path or "(root)", recorded, replayed)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def _shown(value: Any) -> Any:
    return "<absent>" if value is _MISSING else value


def parse_json(data: bytes | str | None) -> Any:
    """`data` parsed as JSON, else as text. orjson first (a reply stream's events are parsed one by one, and the
    audit and replay read thousands); the stdlib for what orjson refuses and JSON allows as Python reads it
    (NaN, integers past 64 bits), so the result is the stdlib's either way."""
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except ValueError:
        return data if isinstance(data, str) else data.decode("utf-8", errors="replace")


def sse_payload(event: str) -> tuple[str | None, Any]:
    """(event name, parsed data) of one SSE event's raw text."""
    name, data = None, []
    for line in event.splitlines():
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
    return name, parse_json("\n".join(data))


def reply_difference(
    recorded_body: bytes | None,
    recorded_events: list[str] | None,
    replayed_body: bytes | None,
    replayed_events: list[str] | None,
    volatile: Sequence[str] = (),
) -> list[str] | None:
    """Detail lines for the first difference between two replies (JSON body or SSE events); None if equal.
    `volatile`: fields compared only for being there (`volatile`); the rest as parsed JSON."""
    if recorded_events is not None or replayed_events is not None:
        a, b = recorded_events or [], replayed_events or []
        if recorded_events is None or replayed_events is None:
            return [
                f"recorded {'SSE events' if recorded_events is not None else 'a JSON body'}, replayed "
                f"{'SSE events' if replayed_events is not None else 'a JSON body'}"
            ]
        for i, (ea, eb) in enumerate(zip(a, b, strict=False)):
            if ea == eb:
                continue
            (name_a, data_a), (name_b, data_b) = sse_payload(ea), sse_payload(eb)
            label = f"event {i}" + (f" ({name_a})" if name_a else "")
            if name_a != name_b:
                return [f"{label}: recorded event {name_a!r}, replayed {name_b!r}"]
            found = _masked_difference(data_a, data_b, volatile)
            if found is None and volatile:
                continue
            if found is None:  # same JSON, other bytes (spacing, key order)
                return [f"{label}: same JSON, different bytes", f"recorded: {short(ea)}", f"replayed: {short(eb)}"]
            return _json_lines(label, found)
        if len(a) != len(b):
            i = min(len(a), len(b))
            extra = a[i] if i < len(a) else b[i]
            return [f"recorded {len(a)} events, replayed {len(b)}; first unmatched: {short(extra)}"]
        return None
    if recorded_body == replayed_body:
        return None
    found = _masked_difference(parse_json(recorded_body), parse_json(replayed_body), volatile)
    if found is None and volatile:
        return None
    if found is None:
        return ["same JSON, different bytes", f"recorded: {short(recorded_body)}", f"replayed: {short(replayed_body)}"]
    return _json_lines("body", found)


def _masked_difference(recorded: Any, replayed: Any, volatile: Sequence[str]) -> tuple[str, Any, Any] | None:
    """`json_difference` with the volatile fields masked on both sides; with any, key order counts too."""
    if not volatile:
        return json_difference(recorded, replayed)
    from tito_rl.replayer.comparison.volatile import mask

    a, b = mask(recorded, volatile), mask(replayed, volatile)
    found = json_difference(a, b)
    if found is None and json.dumps(a, ensure_ascii=False) != json.dumps(b, ensure_ascii=False):
        return "(key order)", list(a) if isinstance(a, dict) else a, list(b) if isinstance(b, dict) else b
    return found


def _json_lines(label: str, found: tuple[str, Any, Any]) -> list[str]:
    path, a, b = found
    return [f"{label}: {path}", f"recorded: {short(a)}", f"replayed: {short(b)}"]


# --- samples ---------------------------------------------------------------------------------------------

SAMPLE_FIELDS = ("tokens", "response_length", "loss_mask", "rollout_log_probs", "reward", "metadata")


def samples_difference(
    recorded: list[dict[str, Any]],
    replayed: list[dict[str, Any]],
    decode: Decode,
    turn_of: Callable[[int, int], int | None] | None = None,
    labels: tuple[str, str] = LABELS,
    channels_both_ways: bool = False,
) -> tuple[str, list[str], int | None] | None:
    """(summary, detail, turn) for the first field that differs, sample by sample; None when all are equal.

    `turn_of(sample, token index)` names the turn whose response holds a token of a replayed sample. The channels
    are compared where the first side has them (a recording from before them has none), or, with
    `channels_both_ways` (two replays), wherever either side has them.
    """
    label_a, label_b = labels
    for i, (a, b) in enumerate(zip(recorded, replayed, strict=False)):
        for name in SAMPLE_FIELDS:
            va, vb = a.get(name), b.get(name)
            if va == vb and type(va) is type(vb):
                continue
            if name in ("tokens", "loss_mask", "rollout_log_probs") and isinstance(va, list) and isinstance(vb, list):
                index = _list_divergence(va, vb)
                lines = [f"{label_a} {len(va)} values, {label_b} {len(vb)}; first difference at index {index}"]
                position = index if name == "tokens" else len(b.get("tokens", [])) - len(vb) + index
                turn = turn_of(i, position) if turn_of else None
                if turn is not None:
                    lines[0] += f" (token {position}, in turn {turn}'s response)"
                if name == "tokens":
                    lines += token_context(va, vb, index, decode, labels)
                else:
                    lines += [
                        f"{label_a}: {short(va[index : index + 8])}",
                        f"{label_b}: {short(vb[index : index + 8])}",
                    ]
                return f"sample {i}: {name} differ", lines, turn
            if name == "metadata" and isinstance(va, dict) and isinstance(vb, dict):
                found = json_difference(va, vb)
                if found is not None:
                    return f"sample {i}: metadata differ", _json_lines("metadata", found), None
            return f"sample {i}: {name} differ", [f"{label_a}: {short(va)}", f"{label_b}: {short(vb)}"], None
        found = _channel_difference(i, a, b, labels, channels_both_ways)
        if found is not None:
            return found
    if len(recorded) != len(replayed):
        return (
            f"{label_a}: {len(recorded)} sample(s), {label_b}: {len(replayed)}",
            [f"first {len(min(recorded, replayed, key=len))} sample(s) are equal"],
            None,
        )
    return None


# Per-token channels: compared where the recorded sample has them (a recording from before them has none).
CHANNEL_FIELDS = ("rollout_routed_experts", "rollout_top_p_token_ids", "rollout_top_p_token_offsets", "weight_versions")


def _channel_difference(
    i: int, a: dict[str, Any], b: dict[str, Any], labels: tuple[str, str], both_ways: bool
) -> tuple[str, list[str], int | None] | None:
    label_a, label_b = labels
    for name in CHANNEL_FIELDS:
        if a.get(name) is None and not (both_ways and b.get(name) is not None):
            continue
        if name == "rollout_routed_experts":
            ra, rb = _route_rows(a.get(name)), _route_rows(b.get(name))
            if ra is not None and rb is not None:
                row = _row_divergence(ra, rb)
                if row is None:
                    continue
                return (
                    f"sample {i}: {name} differ",
                    [
                        f"{label_a} {len(ra)} rows, {label_b} {len(rb)}; first difference at row {row} (token {row})",
                        f"{label_a}: {short(ra[row : row + 1].tolist())}",
                        f"{label_b}: {short(rb[row : row + 1].tolist())}",
                    ],
                    None,
                )
        va, vb = (_plain(v.get(name), name == "rollout_routed_experts") for v in (a, b))
        if va == vb:
            continue
        if name == "rollout_routed_experts" and isinstance(va, list) and isinstance(vb, list):
            row = _list_divergence(va, vb)
            return (
                f"sample {i}: {name} differ",
                [
                    f"{label_a} {len(va)} rows, {label_b} {len(vb)}; first difference at row {row} (token {row})",
                    f"{label_a}: {short(va[row : row + 1])}",
                    f"{label_b}: {short(vb[row : row + 1])}",
                ],
                None,
            )
        return f"sample {i}: {name} differ", [f"{label_a}: {short(va)}", f"{label_b}: {short(vb)}"], None
    return None


def _route_rows(value: Any) -> Any:
    """Routes as `[rows, ids a row]` int64 (numpy: a long MoE sample's rows are millions of ids, which nested
    lists compared in Python took most of a replay's time over), the split into layers x top_k flattened as
    `_plain` does; None where they are not a rectangular integer array (then compared as plain values)."""
    import numpy as np

    if value is None:
        return None
    try:
        array = np.asarray(value)
    except (ValueError, TypeError):
        return None
    if array.ndim == 0 or array.dtype.kind not in "iu" and not (array.size == 0 and array.dtype.kind == "f"):
        return None
    return array.reshape(array.shape[0], -1).astype(np.int64, copy=False)


def _row_divergence(a: Any, b: Any) -> int | None:
    """The first row two route arrays differ at (a row count or width that differs: the first row past the shorter,
    or 0); None when equal."""
    import numpy as np

    if a.shape == b.shape:
        differ = np.flatnonzero((a != b).any(axis=1)) if a.size else np.zeros(0, np.int64)
        return int(differ[0]) if differ.size else None
    if a.shape[1:] != b.shape[1:]:
        return 0
    n = min(len(a), len(b))
    differ = np.flatnonzero((a[:n] != b[:n]).any(axis=1))
    return int(differ[0]) if differ.size else n


def _plain(value: Any, rows: bool = False) -> Any:
    """Plain lists; route rows flattened (`rows`): the split of a row into layers x top_k depends on what the
    replaying adapter knows of the model (`routes_layout`), the ids do not."""
    value = value.tolist() if hasattr(value, "tolist") else value
    if rows and isinstance(value, list):
        return [[e for layer in row for e in layer] if isinstance(row, list) else row for row in value]
    return value


def turn_locator(spans: Sequence[Sequence[Any]]) -> Callable[[int, int], int | None]:
    """`turn_of(sample, token)` over per-sample spans (`Linearization.spans`): the turn whose output holds it."""

    def turn_of(sample: int, token: int) -> int | None:
        for span in spans[sample] if sample < len(spans) else []:
            if span.start <= token < span.start + span.length:
                turn: int | None = span.turn_index
                return turn
        return None

    return turn_of


def _list_divergence(a: list[Any], b: list[Any]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y or type(x) is not type(y):
            return i
    return min(len(a), len(b))
