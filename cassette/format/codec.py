"""Records to frame maps and back, holding each session's delta bases. The writer and the reader run the same
codec over the same records in the same order, so every delta resolves exactly."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from tito_rl.cassette.format.budget import DecodeBudget
from tito_rl.cassette.format.checks import check_fields
from tito_rl.cassette.format.deltas import BytesDelta, LogprobColumn, TokenDelta, bytes_delta, token_delta
from tito_rl.cassette.format.errors import CorruptCassetteError
from tito_rl.cassette.format.extensions import EXT_U32, PackedExt, packed_floats, packed_mask
from tito_rl.cassette.format.packing import PackedIds, is_float_list, packed_token_list, unpack_u32
from tito_rl.cassette.format.records import (
    ENGINE_WIDE,
    TYPE_NAMES,
    AgentRecord,
    DropRecord,
    EngineEvent,
    EngineRecord,
    Record,
    SamplesRecord,
    record_from_dict,
)
from tito_rl.cassette.format.routes import (
    SAMPLE_ROUTES,
    IntArray,
    RouteContext,
    decode_channels,
    encode_channels,
    packed_sample_routes,
)
from tito_rl.trajectory.dialects.view import SGLANG_OPENAI, VLLM_GENERATE, VLLM_OPENAI

KEPT_SAMPLE_KEYS = ("rollout_top_p_token_ids", "rollout_top_p_token_offsets")  # flat uint32: packed as token ids


@dataclass
class _SessionState:
    context: bytes = b""  # last engine prompt followed by its output ids, packed
    # Reading: the last output, not yet joined to `context` (the next prompt's delta joins both in one copy: a
    # long session's context is copied once per call, not twice)
    context_out: bytes = b""
    agent_body: bytes = b""
    messages: bytes = b""  # the JSON of the session's last OpenAI-style engine request (its prompt ids aside)
    routes: RouteContext = field(default_factory=RouteContext)  # the session's expert routes so far (routes.py)
    seq: int = 0

    def release(self) -> None:
        self.context, self.context_out, self.agent_body, self.messages = b"", b"", b"", b""
        self.routes.clear()


class SessionCodec:
    """Turns records into frame maps and back, holding each session's delta bases.

    Writer and reader must see the same records in the same order; the format therefore forbids
    reordering frames, and a reader that skips a frame cannot resolve later deltas of that session.
    """

    def __init__(
        self,
        budget: DecodeBudget | None = None,
        packed_prompts: bool = False,
        packed_samples: bool = False,
        route_memory: int | None = None,
        route_folder: str | None = None,
    ) -> None:
        """`budget`: what decoding may resolve deltas to (a reader's; none for the writer's own records).
        `packed_prompts`: /generate requests' input_ids decoded as `PackedIds`, not lists (replay's reading), and
        samples' routes left an `IntArray` (numpy inside; `packed_samples` too).
        `packed_samples`: samples' token ids decoded as `PackedIds` too: each holds its whole session, and a
        reader that views them as arrays (the audit) would only throw the list of ints away again.
        `route_memory`: the bytes of a session's route context kept in memory, the rest in a temporary file in
        `route_folder` (`RouteContext`; None: all in memory)."""
        self._sessions: dict[str, _SessionState] = {}
        self.route_memory, self.route_folder = route_memory, route_folder
        self.budget = budget
        self.packed_prompts = packed_prompts
        self.packed_samples = packed_samples

    def _state(self, session: str) -> _SessionState:
        state = self._sessions.get(session)
        if state is None:
            routes = RouteContext(memory_bytes=self.route_memory, folder=self.route_folder)
            state = self._sessions[session] = _SessionState(routes=routes)
        return state

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
        elif isinstance(record, EngineRecord) and record.dialect in OPENAI_STYLE:
            data["request"], data["response"] = _encode_openai(state, record.dialect, record.request, record.response)
        elif isinstance(record, EngineRecord):
            data["request"], data["response"] = self._encode_engine(state, record.request, record.response)
            if record.dialect is None:  # a /generate call as before dialects: the bytes every older cassette has
                del data["dialect"]
        elif isinstance(record, SamplesRecord):
            data["samples"] = [self._encode_sample(state, s) for s in record.samples]
        if isinstance(record, EngineRecord) and record.wire is None:  # no bytes kept: the record as before wires
            del data["wire"]
        if isinstance(record, EngineRecord) and record.order is None:  # no place kept: the record as before version 7
            del data["order"]
        if isinstance(record, EngineRecord):  # per-token channels (routes, kept sets) as integers, routes as deltas
            data["response"] = encode_channels(state.routes, record.request, record.response, data["response"])
        if isinstance(record, SamplesRecord | DropRecord):
            # The session ended: its delta bases (a long session's context and last body, ~1 MB) are let go, so a
            # recorder running for days holds only what its live sessions need. A record of the session after
            # this one is stored whole (a delta on an empty base), which any reader resolves as before.
            state.release()
        return data

    def release(self, session: str) -> None:
        """Let go of a session's delta bases (its last prompt and output, agent body and engine messages: each its
        whole history), as the writer does at the session's finish or drop, so a reader streaming a long cassette
        holds only what its live sessions need. Only right where the writer released them too: after a
        `SamplesRecord` or `DropRecord` of the session (cassettes/FORMAT.md)."""
        state = self._sessions.get(session)
        if state is not None:
            state.release()

    def close(self) -> None:
        """Let go of every session's bases (the writer's, once its file is closed): route contexts' files too."""
        for state in self._sessions.values():
            state.release()

    def held_bytes(self) -> int:
        """The delta bases held in memory for all sessions, in bytes."""
        return sum(
            len(s.context) + len(s.context_out) + len(s.agent_body) + len(s.messages) + s.routes.nbytes
            for s in self._sessions.values()
        )

    def spilled_bytes(self) -> int:
        """The route contexts held in temporary files for all sessions, in bytes."""
        return sum(s.routes.spilled_bytes for s in self._sessions.values())

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
        if sample.get(SAMPLE_ROUTES) is not None:
            routes = packed_sample_routes(sample[SAMPLE_ROUTES])
            if routes is not None:
                out[SAMPLE_ROUTES] = routes
        for key in KEPT_SAMPLE_KEYS:
            value: Any = sample.get(key)
            if hasattr(value, "tolist"):  # numpy (Sample.to_dict(arrays=True)): stored as the lists it stands for
                value = out[key] = value.tolist()
            packed = packed_token_list(value)
            if packed is not None:
                out[key] = PackedExt(EXT_U32, packed)
        return out

    # decoding

    def decode(self, data: dict[str, Any]) -> Record:
        record = record_from_dict(data)
        if not isinstance(getattr(record, "session", None), str) or type(record.seq) is not int:
            raise CorruptCassetteError("corrupt cassette: a record without a session name or seq")
        if isinstance(record, EngineEvent) and record.session != ENGINE_WIDE:
            raise CorruptCassetteError("corrupt cassette: an engine-wide event named a session")
        state = self._state(record.session)
        state.seq = max(state.seq, record.seq + 1)
        if isinstance(record, AgentRecord):
            if isinstance(record.body, BytesDelta):
                record.body = self._spent(record.body.apply(state.agent_body), "an agent body")
            state.agent_body = record.body if isinstance(record.body, bytes) else b""
        elif isinstance(record, EngineRecord) and isinstance(record.dialect, str) and record.dialect in OPENAI_STYLE:
            record.request, record.response = self._decode_openai(state, record.request, record.response)
        elif isinstance(record, EngineRecord):
            record.request, record.response = self._decode_engine(state, record.request, record.response)
        elif isinstance(record, SamplesRecord) and isinstance(record.samples, list):
            for sample in record.samples:
                if isinstance(sample, dict) and isinstance(sample.get("tokens"), TokenDelta):
                    packed = self._spent(sample["tokens"].apply(state.context, state.context_out), "a sample")
                    sample["tokens"] = PackedIds(packed) if self.packed_samples else self._built(unpack_u32(packed))
                if isinstance(sample, dict) and isinstance(sample.get(SAMPLE_ROUTES), IntArray):
                    # left packed for the audit and the replay (they read them with numpy: nested lists of a
                    # long MoE sample cost seconds to build and as long to compare); nested lists, as written, for
                    # the rest
                    array = sample[SAMPLE_ROUTES].values
                    self._spend(array.size * 8, "a sample's routes")
                    if not (self.packed_samples or self.packed_prompts):
                        sample[SAMPLE_ROUTES] = self._built(array.tolist(), Any)
        if isinstance(record, EngineRecord):  # per-token channels back to the engine's exact strings
            record.response = decode_channels(state.routes, record.response, self._spend)
        check_fields(record, data["t"], self.budget.built if self.budget is not None else None)
        return record

    def _spend(self, n: int, what: str) -> None:
        if self.budget is not None:
            self.budget.spend(n, what)

    def _spent(self, data: bytes, what: str) -> bytes:
        if self.budget is not None:
            self.budget.spend(len(data), what)
        return data

    def _built(self, values: list[Any], items: Any = int) -> list[Any]:
        return values if self.budget is None else self.budget.built_here(values, items)

    def _decode_engine(self, state: _SessionState, request: Any, response: Any) -> tuple[Any, Any]:
        resolved = False
        if isinstance(request, dict) and isinstance(request.get("input_ids"), TokenDelta):
            state.context = self._spent(request["input_ids"].apply(state.context, state.context_out), "a prompt")
            state.context_out = b""
            request["input_ids"] = (
                PackedIds(state.context) if self.packed_prompts else self._built(unpack_u32(state.context))
            )
            resolved = True
        # Packable exactly when the writer packed them (and extended its context with them).
        packed_out = packed_token_list(response.get("output_ids")) if isinstance(response, dict) else None
        if packed_out is not None:
            if resolved:
                state.context_out = packed_out
            meta = response.get("meta_info")
            if isinstance(meta, dict) and isinstance(meta.get("output_token_logprobs"), LogprobColumn):
                triples = meta["output_token_logprobs"].apply(response["output_ids"])
                meta["output_token_logprobs"] = self._built(triples, Any)
        return request, response

    def _decode_openai(self, state: _SessionState, request: Any, response: Any) -> tuple[Any, Any]:
        """`_encode_openai` backwards, in the same order, so each delta meets the base it was made against."""
        prompt_set = False
        if isinstance(request, dict) and isinstance(request.get(JSON_FIELD), BytesDelta):
            state.messages = self._spent(request[JSON_FIELD].apply(state.messages), "an engine request")
            key, ids = request.get(KEY_FIELD), request.get(IDS_FIELD)
            try:
                request = json.loads(state.messages.decode("utf-8", "surrogatepass"))
            except ValueError as exc:
                raise CorruptCassetteError(f"corrupt cassette: an engine request is not JSON: {exc}") from None
            if not isinstance(request, dict):
                raise CorruptCassetteError("corrupt cassette: an engine request is not a JSON object")
            if isinstance(ids, TokenDelta) and isinstance(key, str) and key in request:
                state.context = self._spent(ids.apply(_joined(state)), "a prompt")
                request[key] = self._built(unpack_u32(state.context))
                prompt_set = True
        for holder in _prompt_holders(response):
            if isinstance(holder.get("prompt_token_ids"), TokenDelta):
                state.context = self._spent(holder["prompt_token_ids"].apply(_joined(state)), "a prompt")
                holder["prompt_token_ids"] = self._built(unpack_u32(state.context))
                prompt_set = True
                break
        output = _output_ids(response)
        if prompt_set and output is not None:
            state.context = state.context + output
        return request, response


def _joined(state: _SessionState) -> bytes:
    """A reading session's context with its last output joined (`context_out`)."""
    if state.context_out:
        state.context, state.context_out = state.context + state.context_out, b""
    return state.context


# Engine dialects whose records `_encode_openai` stores (SGLang's /generate keeps `_encode_engine`).
OPENAI_STYLE = frozenset({SGLANG_OPENAI, VLLM_OPENAI, VLLM_GENERATE})
PROMPT_KEYS = ("input_ids", "token_ids", "prompt", "tokens")  # where a request carries its prompt as ids
# An OpenAI-style request as stored: its JSON text (the prompt ids' value null) as a bytes delta on the session's
# previous engine request, and the prompt ids apart as a token delta on the context. NUL-led keys: no request a
# gateway sends has one (one that does is stored as it came).
JSON_FIELD, KEY_FIELD, IDS_FIELD = "\0json", "\0key", "\0ids"


def _encode_openai(state: _SessionState, dialect: str, request: Any, response: Any) -> tuple[Any, Any]:
    """An OpenAI-style engine call, small: its prompt ids (in the request, or returned by the engine for a
    messages-in call) as a delta on the session's context, the rest of the request as a bytes delta on the
    session's previous one (a chat history grows by a message or two a call; the tools and settings around it
    repeat), its output ids packed. The prompt and output ids then
    become the context, so the next call and the finish's samples cost only what they add."""
    prompt_set = False
    if isinstance(request, dict) and not any(str(k).startswith("\0") for k in request):
        key = next((k for k in PROMPT_KEYS if packed_token_list(request.get(k)) is not None), None)
        stored: dict[str, Any] = {}
        if key is not None:
            packed = packed_token_list(request[key])
            assert packed is not None  # the key was chosen for holding a token list
            stored = {KEY_FIELD: key, IDS_FIELD: token_delta(state.context, packed)}
            state.context, prompt_set = packed, True
        text = json.dumps(
            {**request, key: None} if key is not None else request, ensure_ascii=False, separators=(",", ":")
        )
        data = text.encode("utf-8", "surrogatepass")
        request = {JSON_FIELD: bytes_delta(state.messages, data), **stored}
        state.messages = data
    response = _copied_holders(response)
    for holder in _prompt_holders(response):
        packed = packed_token_list(holder.get("prompt_token_ids"))
        if packed is not None:
            holder["prompt_token_ids"] = token_delta(state.context, packed)
            state.context, prompt_set = packed, True
            break
    output = _output_ids(response)
    if prompt_set and output is not None:
        state.context = state.context + output
    if isinstance(response, dict) and isinstance(response.get("choices"), list) and response["choices"]:
        first = response["choices"][0]
        packed_out = packed_token_list(first.get("token_ids")) if isinstance(first, dict) else None
        if packed_out is not None:
            first["token_ids"] = PackedExt(EXT_U32, packed_out)
    return request, response


def _copied_holders(response: Any) -> Any:
    """The response with the dicts that encoding changes copied (the caller's record stays as it was)."""
    if isinstance(response, dict):
        copy = dict(response)
        if isinstance(copy.get("choices"), list) and copy["choices"] and isinstance(copy["choices"][0], dict):
            copy["choices"] = [dict(copy["choices"][0]), *copy["choices"][1:]]
        return copy
    if isinstance(response, list):
        return [_copied_holders(chunk) for chunk in response]
    return response


def _prompt_holders(response: Any) -> list[dict[str, Any]]:
    """The dicts that may hold the engine's `prompt_token_ids`: the root (vLLM chat), the first choice (vLLM
    completions, SGLang), of the body or, for a stream, of each chunk in order."""
    bodies = response if isinstance(response, list) else [response]
    holders: list[dict[str, Any]] = []
    for body in bodies:
        if not isinstance(body, dict):
            continue
        holders.append(body)
        choices = body.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            holders.append(choices[0])
    return holders


def _output_ids(response: Any) -> bytes | None:
    """The call's output ids, packed: the first choice's `token_ids`, summed over a stream's chunks."""
    bodies = response if isinstance(response, list) else [response]
    out = bytearray()
    found = False
    for body in bodies:
        choices = body.get("choices") if isinstance(body, dict) else None
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
        ids = (
            None
            if first is None
            else packed_token_list(
                first.get("token_ids") if first.get("token_ids") is not None else first.get("response_token_ids")
            )
        )
        if ids is not None:
            out += ids
            found = True
    return bytes(out) if found else None


def _is_logprob_triples(value: Any, output_ids: list[int]) -> bool:
    """Only the exact `[float, output_ids[i], None]` shape is stored as a column, so decoding is lossless."""
    if not isinstance(value, list) or len(value) != len(output_ids):
        return False
    return all(
        isinstance(t, list)
        and len(t) == 3
        and type(t[0]) is float
        and t[1] == tid
        and type(t[1]) is int
        and t[2] is None
        for t, tid in zip(value, output_ids, strict=True)
    )
