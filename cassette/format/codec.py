"""Records to frame maps and back, holding each session's delta bases. The writer and the reader run the same
codec over the same records in the same order, so every delta resolves exactly."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from tito_rl.cassette.format.budget import DecodeBudget
from tito_rl.cassette.format.checks import check_fields
from tito_rl.cassette.format.deltas import BytesDelta, LogprobColumn, TokenDelta, bytes_delta, token_delta
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.extensions import EXT_U32, PackedExt, packed_floats, packed_mask
from tito_rl.cassette.format.packing import PackedIds, is_float_list, packed_token_list, unpack_u32
from tito_rl.cassette.format.records import (
    TYPE_NAMES,
    AgentRecord,
    DropRecord,
    EngineRecord,
    Record,
    SamplesRecord,
    record_from_dict,
)


@dataclass
class _SessionState:
    context: bytes = b""  # last engine prompt followed by its output ids, packed
    agent_body: bytes = b""
    seq: int = 0


class SessionCodec:
    """Turns records into frame maps and back, holding each session's delta bases.

    Writer and reader must see the same records in the same order; the format therefore forbids
    reordering frames, and a reader that skips a frame cannot resolve later deltas of that session.
    """

    def __init__(self, budget: DecodeBudget | None = None, packed_prompts: bool = False) -> None:
        """`budget`: what decoding may resolve deltas to (a reader's; none for the writer's own records).
        `packed_prompts`: /generate requests' input_ids decoded as `PackedIds`, not lists (replay's reading)."""
        self._sessions: dict[str, _SessionState] = {}
        self.budget = budget
        self.packed_prompts = packed_prompts

    def _state(self, session: str) -> _SessionState:
        return self._sessions.setdefault(session, _SessionState())

    def next_seq(self, session: str) -> int:
        state = self._state(session)
        seq = state.seq
        state.seq += 1
        return seq

    # encoding

    def encode(self, record: Record) -> dict[str, Any]:
        # Shallow on purpose: asdict() would deep-copy every token list of a long session.
        data = {"t": TYPE_NAMES[type(record)], **{f.name: getattr(record, f.name) for f in fields(record)}}
        state = self._state(record.session)
        if isinstance(record, AgentRecord):
            body = bytes(record.body)
            data["body"] = bytes_delta(state.agent_body, body)
            state.agent_body = body
        elif isinstance(record, EngineRecord):
            data["request"], data["response"] = self._encode_engine(state, record.request, record.response)
        elif isinstance(record, SamplesRecord):
            data["samples"] = [self._encode_sample(state, s) for s in record.samples]
        if isinstance(record, SamplesRecord | DropRecord):
            # The session ended: its delta bases (a long session's context and last body, ~1 MB) are let go, so a
            # recorder running for days holds only what its live sessions need. A record of the session after
            # this one is stored whole (a delta on an empty base), which any reader resolves as before.
            state.context, state.agent_body = b"", b""
        return data

    def held_bytes(self) -> int:
        """The delta bases held for all sessions, in bytes."""
        return sum(len(s.context) + len(s.agent_body) for s in self._sessions.values())

    @staticmethod
    def _encode_engine(state: _SessionState, request: Any, response: Any) -> tuple[Any, Any]:
        packed_in = packed_token_list(request.get("input_ids")) if isinstance(request, dict) else None
        if packed_in is not None:
            request = {**request, "input_ids": token_delta(state.context, packed_in)}
            state.context = packed_in
        packed_out = packed_token_list(response.get("output_ids")) if isinstance(response, dict) else None
        if packed_out is not None:
            output_ids = response["output_ids"]
            if packed_in is not None:
                state.context = state.context + packed_out
            response = {**response, "output_ids": PackedExt(EXT_U32, packed_out)}
            meta = response.get("meta_info")
            if isinstance(meta, dict) and _is_logprob_triples(meta.get("output_token_logprobs"), output_ids):
                column = LogprobColumn([t[0] for t in meta["output_token_logprobs"]])
                response["meta_info"] = {**meta, "output_token_logprobs": column}
        return request, response

    @staticmethod
    def _encode_sample(state: _SessionState, sample: dict[str, Any]) -> dict[str, Any]:
        out = dict(sample)
        packed = packed_token_list(sample.get("tokens"))
        if packed is not None:
            out["tokens"] = token_delta(state.context, packed)
        mask = sample.get("loss_mask")
        if isinstance(mask, list) and all(type(v) is int and v in (0, 1) for v in mask):
            out["loss_mask"] = packed_mask(mask)
        if is_float_list(sample.get("rollout_log_probs")):
            out["rollout_log_probs"] = packed_floats(sample["rollout_log_probs"])
        return out

    # decoding

    def decode(self, data: dict[str, Any]) -> Record:
        record = record_from_dict(data)
        if not isinstance(getattr(record, "session", None), str) or type(record.seq) is not int:
            raise CorruptCassetteError("corrupt cassette: a record without a session name or seq")
        state = self._state(record.session)
        state.seq = max(state.seq, record.seq + 1)
        if isinstance(record, AgentRecord):
            if isinstance(record.body, BytesDelta):
                record.body = self._spent(record.body.apply(state.agent_body), "an agent body")
            state.agent_body = record.body if isinstance(record.body, bytes) else b""
        elif isinstance(record, EngineRecord):
            record.request, record.response = self._decode_engine(state, record.request, record.response)
        elif isinstance(record, SamplesRecord) and isinstance(record.samples, list):
            for sample in record.samples:
                if isinstance(sample, dict) and isinstance(sample.get("tokens"), TokenDelta):
                    sample["tokens"] = self._built(unpack_u32(self._spent(sample["tokens"].apply(state.context),
                                                                          "a sample")))
        check_fields(record, data["t"], self.budget.built if self.budget is not None else None)
        return record

    def _spent(self, data: bytes, what: str) -> bytes:
        if self.budget is not None:
            self.budget.spend(len(data), what)
        return data

    def _built(self, values: list[Any], items: Any = int) -> list[Any]:
        return values if self.budget is None else self.budget.built_here(values, items)

    def _decode_engine(self, state: _SessionState, request: Any, response: Any) -> tuple[Any, Any]:
        resolved = False
        if isinstance(request, dict) and isinstance(request.get("input_ids"), TokenDelta):
            state.context = self._spent(request["input_ids"].apply(state.context), "a prompt")
            request["input_ids"] = (PackedIds(state.context) if self.packed_prompts
                                    else self._built(unpack_u32(state.context)))
            resolved = True
        # Packable exactly when the writer packed them (and extended its context with them).
        packed_out = packed_token_list(response.get("output_ids")) if isinstance(response, dict) else None
        if packed_out is not None:
            if resolved:
                state.context = state.context + packed_out
            meta = response.get("meta_info")
            if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), LogprobColumn):
                triples = meta["output_token_logprobs"].apply(response["output_ids"])
                meta["output_token_logprobs"] = self._built(triples, Any)
        return request, response


def _is_logprob_triples(value: Any, output_ids: list[int]) -> bool:
    """Only the exact `[float, output_ids[i], None]` shape is stored as a column, so decoding is lossless."""
    if not isinstance(value, list) or len(value) != len(output_ids):
        return False
    return all(
        isinstance(t, list) and len(t) == 3 and type(t[0]) is float and t[1] == tid and type(t[1]) is int
        and t[2] is None
        for t, tid in zip(value, output_ids, strict=True)
    )
