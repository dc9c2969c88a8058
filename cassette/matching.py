"""Which recorded engine call answers a replayed one: same input_ids, same result-changing sampling params.

Never rid (random per call), timestamps, or cached_tokens (radix-cache state): those differ between two
runs of the same traffic. Sampling params are compared after filling SGLang's defaults, so an explicit
`temperature: 1.0` matches an omitted one. When nothing matches, the answer says what changed: the
closest recorded request, the first token where the prompts part, and the text on both sides of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tito_rl.cassette.format.packing import (
    common_prefix_bytes,
    pack_u32,
    packed_token_list,
    token_prefix_len,
    unpack_u32,
)
from tito_rl.cassette.format.records import EngineRecord

# SGLang 0.5.23 `SamplingParams` defaults; None-valued keys mean "unset".
SAMPLING_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": 128,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "ignore_eos": False,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "no_stop_trim": False,
}
# Keys that change how output is delivered, never which tokens are produced.
NON_RESULT_SAMPLING_KEYS = frozenset({"stream_interval"})
TOP_K_ALL = 1 << 30
CONTEXT_TOKENS = 12


def normalize_sampling(params: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (params or {}).items():
        if key in NON_RESULT_SAMPLING_KEYS or value is None:
            continue
        if key == "top_k" and value == TOP_K_ALL:
            value = -1
        if key == "stop" and isinstance(value, str):
            value = [value]
        if key in ("stop", "stop_token_ids") and isinstance(value, list):
            if not value:
                continue
            value = sorted(value, key=repr) if key == "stop_token_ids" else value
        if key in SAMPLING_DEFAULTS and value == SAMPLING_DEFAULTS[key]:
            continue
        out[key] = value
    return out


def sampling_key(params: dict[str, Any] | None) -> str:
    return json.dumps(normalize_sampling(params), sort_keys=True, separators=(",", ":"))


@dataclass
class RecordedCall:
    """One recorded /generate call, its prompt kept packed (4 bytes a token) for memory and fast hashing."""

    session: str
    seq: int
    packed_ids: bytes
    sampling: dict[str, Any]
    response: Any
    record: EngineRecord | None = None

    @property
    def input_ids(self) -> list[int]:
        return unpack_u32(self.packed_ids)


@dataclass
class NoMatch:
    """Why no recorded call answers a request, in terms a user can act on."""

    closest: RecordedCall | None
    divergence_index: int | None  # first differing token; None when the prompts are equal
    context_text: str
    sampling_diff: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # key -> (recorded, requested)
    prompt_tokens: int = 0

    def message(self) -> str:
        if self.closest is None:
            return "no recorded engine request in the cassette to match against"
        where = f"closest recorded request: session {self.closest.session!r} seq {self.closest.seq}"
        recorded_len = len(self.closest.packed_ids) // 4
        if self.divergence_index is None:
            diff = ", ".join(
                f"{k}: recorded {a!r}, requested {b!r}"
                for k, a, b in ((k, *v) for k, v in sorted(self.sampling_diff.items()))
            )
            return f"no recorded engine request matches: same input_ids but sampling params differ ({diff}); {where}"
        return (
            f"no recorded engine request matches: {where}; the prompts ({recorded_len} recorded tokens, "
            f"{self.prompt_tokens} requested) first differ at token {self.divergence_index}\n{self.context_text}"
        )


class EngineIndex:
    """Recorded calls by (prompt, sampling); repeated identical requests are served in recorded order."""

    def __init__(self, decode: Callable[[list[int]], str] | None = None) -> None:
        self._by_key: dict[tuple[bytes, str], list[RecordedCall]] = {}
        self._served: dict[tuple[bytes, str, str | None], int] = {}
        self.calls: list[RecordedCall] = []
        self._decode = decode

    def add(self, record: EngineRecord) -> bool:
        """Index a /generate record with an answer; other engine calls (aborts, health) are not matched."""
        request = record.request
        if not isinstance(request, dict):
            return False
        packed = packed_token_list(request.get("input_ids"))
        if packed is None or not isinstance(record.response, dict) or record.status != 200:
            return False
        call = RecordedCall(
            record.session,
            record.seq,
            packed,
            normalize_sampling(request.get("sampling_params")),
            record.response,
            record,
        )
        self.calls.append(call)
        self._by_key.setdefault((call.packed_ids, sampling_key(call.sampling)), []).append(call)
        return True

    def add_all(self, records: Iterable[Any]) -> int:
        return sum(self.add(r) for r in records if isinstance(r, EngineRecord))

    def match(
        self, input_ids: list[int], sampling_params: dict[str, Any] | None, session: str | None = None
    ) -> RecordedCall | NoMatch:
        key = (pack_u32(input_ids), sampling_key(sampling_params))
        candidates = self._by_key.get(key)
        if not candidates:
            return self.explain(input_ids, sampling_params, session)
        if session is not None:
            own = [c for c in candidates if c.session == session]
            candidates = own or candidates
        served_key = (*key, session)
        n = self._served.get(served_key, 0)
        self._served[served_key] = n + 1
        return candidates[min(n, len(candidates) - 1)]  # past the recording: repeat its last answer

    def explain(
        self, input_ids: list[int], sampling_params: dict[str, Any] | None, session: str | None = None
    ) -> NoMatch:
        if not self.calls:
            return NoMatch(None, None, "", prompt_tokens=len(input_ids))
        wanted = normalize_sampling(sampling_params)
        packed = pack_u32(input_ids)

        def closeness(call: RecordedCall) -> tuple[int, int, bool, int]:
            prefix = _packed_prefix(call.packed_ids, packed)
            same_len = len(call.packed_ids) == len(packed)
            return (
                prefix,
                int(same_len and prefix == len(packed) // 4 and call.sampling == wanted),
                call.session == session,
                -abs(len(call.packed_ids) - len(packed)),
            )

        best = max(self.calls, key=closeness)
        recorded = best.input_ids
        prefix = token_prefix_len(recorded, input_ids)
        if prefix == len(recorded) == len(input_ids):
            diff = {
                k: (best.sampling.get(k), wanted.get(k))
                for k in sorted(set(best.sampling) | set(wanted))
                if best.sampling.get(k) != wanted.get(k)
            }
            return NoMatch(best, None, "", diff, len(input_ids))
        return NoMatch(best, prefix, self._context(recorded, input_ids, prefix), prompt_tokens=len(input_ids))

    def _context(self, recorded: list[int], requested: list[int], index: int) -> str:
        start = max(0, index - CONTEXT_TOKENS)
        lines = []
        for label, ids in (("recorded ", recorded), ("requested", requested)):
            before, after = ids[start:index], ids[index : index + CONTEXT_TOKENS]
            after_text = repr(self._text(after)) if after else "<end of prompt>"
            lines.append(f"  {label}: ...{self._text(before)!r} | {after_text}  (ids from {index}: {after[:6]})")
        return "\n".join(lines)

    def _text(self, ids: list[int]) -> str:
        if self._decode is None:
            return " ".join(map(str, ids))
        return self._decode(ids)


def _packed_prefix(a: bytes, b: bytes) -> int:
    return common_prefix_bytes(a, b) // 4
