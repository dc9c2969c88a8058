"""vcrpy support: record and replay the engine leg of an adapter embedded in your own process.

vcrpy patches the HTTP client (aiohttp for the adapter) and asks a serializer and a persister to store its
interactions. These store them as a tito cassette (engine records, redacted, token arrays packed), so
`tito cassette info` and `tito fake-engine --cassette` read the same file. Requests are matched on
input_ids and result-changing sampling params (the `tito_input_ids` matcher), never on the random rid; a
mismatch names the first differing token with the decoded text on both sides, as `tito replay` does.
Record modes are vcrpy's, plus pytest-recording's `rewrite` (the cassette recorded anew, the old one ignored).

    import tito_rl.replayer.pytest_plugin.vcr as tito_vcr
    my_vcr = tito_vcr.configure_vcr(record_mode="once")
    with my_vcr.use_cassette("tests/cassettes/engine.tito"):
        ...  # run the adapter in-process; its /generate calls are recorded, then replayed
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tito_rl.cassette.format.records import EngineRecord, Header
from tito_rl.cassette.matching import normalize_sampling
from tito_rl.cassette.reader import CassetteReader
from tito_rl.cassette.redaction import REDACTED, Redactor
from tito_rl.cassette.writer import ROUTING_HEADERS, CassetteWriter
from tito_rl.replayer.comparison.differences import json_difference, message_at, short, token_context, token_divergence
from tito_rl.trajectory.dialects.registry import detect_dialect, view_of

SERIALIZER_NAME = "tito"
MATCHER_NAME = "tito_input_ids"
DEFAULT_SESSION = "vcr"
HEADER_METADATA_KEY = "tito_header"
RECORD_MODES = ("none", "once", "new_episodes", "all", "rewrite")
MATCH_LABELS = ("recorded", "request")


class TitoSerializer:
    """vcrpy serializer: vcr's interaction dicts <-> cassette bytes.

    The header is kept across load/save through vcrpy's cassette metadata, so re-saving a cassette in
    `new_episodes` mode keeps its creation time and fingerprint.
    """

    def __init__(
        self,
        header: Header | None = None,
        redactor_factory: type[Redactor] = Redactor,
        tokenizer_fingerprint: str | None = None,
    ) -> None:
        self.header = header
        self.redactor_factory = redactor_factory
        self.tokenizer_fingerprint = tokenizer_fingerprint

    def _header(self, metadata: dict[str, Any] | None) -> Header:
        if metadata and isinstance(metadata.get(HEADER_METADATA_KEY), dict):
            return Header(**metadata[HEADER_METADATA_KEY])
        if self.header is not None:
            return self.header
        from tito_rl.trajectory.tokens.tokenizer import fingerprint

        return Header(tokenizer_fingerprint=fingerprint(), extra={"recorded_by": "vcrpy"})

    def serialize(self, data: dict[str, Any]) -> bytes:
        buffer = io.BytesIO()
        writer = CassetteWriter(buffer, self._header(data.get("metadata")), redactor=self.redactor_factory())
        secret = writer.redactor.secret_headers
        for interaction in data["interactions"]:
            record = _engine_record(interaction["request"], interaction["response"])
            routing = next((v for k, v in record.headers.items() if k.lower() in ROUTING_HEADERS), None)
            # The routing key is the live session id, often a bearer token: named by digest, scrubbed everywhere.
            record.session = writer.redactor.session_name(str(routing), "bearer") if routing else DEFAULT_SESSION
            response_headers = record.extra["response_headers"]
            record.extra["response_headers"] = {
                k: ([REDACTED] if k.lower() in secret else v) for k, v in response_headers.items()
            }
            writer.write_engine(record)
        return buffer.getvalue()

    def deserialize(self, data: bytes | str) -> dict[str, Any]:
        if isinstance(data, str):
            data = data.encode("latin-1")
        with CassetteReader(io.BytesIO(data), self.tokenizer_fingerprint) as reader:
            interactions = [_interaction(r) for r in reader.records() if isinstance(r, EngineRecord)]
            header = reader.header
        return {"version": 1, "interactions": interactions, "metadata": {HEADER_METADATA_KEY: header.to_dict()}}


class TitoPersister:
    """Binary files, written whole and atomically (vcrpy re-saves the full cassette)."""

    @classmethod
    def load_cassette(cls, cassette_path: str | os.PathLike[str], serializer: Any) -> Any:
        from vcr.persisters.filesystem import CassetteNotFoundError
        from vcr.serialize import deserialize

        path = Path(cassette_path)
        if not path.is_file() or path.stat().st_size == 0:
            raise CassetteNotFoundError()
        return deserialize(path.read_bytes(), serializer)

    @staticmethod
    def save_cassette(cassette_path: str | os.PathLike[str], cassette_dict: dict[str, Any], serializer: Any) -> None:
        from vcr.serialize import serialize

        data = serialize(cassette_dict, serializer)
        path = Path(cassette_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)


class RewritePersister(TitoPersister):
    """`rewrite`: the cassette on disk is ignored, so everything is recorded anew and saved over it."""

    @classmethod
    def load_cassette(cls, cassette_path: str | os.PathLike[str], serializer: Any) -> Any:
        from vcr.persisters.filesystem import CassetteNotFoundError

        raise CassetteNotFoundError()


def input_ids_matcher_for(tokenizer_dir: str | None = None) -> Callable[[Any, Any], None]:
    """A vcrpy matcher: same prompt tokens and result-changing sampling params; rid and the rest ignored.

    vcrpy calls it with (this request, a recorded one). A token mismatch names the first differing index,
    the decoded text on both sides and the rendered message it falls in (the tokenizer in `tokenizer_dir`,
    default the embedded Qwen3 one, loaded on the first mismatch only)."""

    def tito_input_ids(r1: Any, r2: Any) -> None:
        a, b = _json_body(r1.body), _json_body(r2.body)
        if isinstance(a, dict) and isinstance(b, dict) and "input_ids" in a and "input_ids" in b:
            recorded, request = b["input_ids"], a["input_ids"]
            if recorded != request:
                index = token_divergence(recorded, request)
                raise AssertionError(_token_mismatch(recorded, request, index or 0, tokenizer_dir))
            rec_params, req_params = (
                normalize_sampling(b.get("sampling_params")),
                normalize_sampling(a.get("sampling_params")),
            )
            if rec_params != req_params:
                keys = sorted(set(rec_params) | set(req_params))
                raise AssertionError(
                    "sampling params differ: "
                    + "; ".join(
                        f"{k}: recorded {rec_params.get(k)!r}, request {req_params.get(k)!r}"
                        for k in keys
                        if rec_params.get(k) != req_params.get(k)
                    )
                )
            return
        path = urlsplit(getattr(r2, "uri", "") or "").path or "/"
        rec_ids = view_of(None, path, b, None).prompt_ids if isinstance(b, dict) else None
        req_ids = view_of(None, path, a, None).prompt_ids if isinstance(a, dict) else None
        if rec_ids is not None and req_ids is not None and rec_ids != req_ids:  # another dialect's id prompt
            index = token_divergence(rec_ids, req_ids)
            raise AssertionError(_token_mismatch(rec_ids, req_ids, index or 0, tokenizer_dir))
        _plain_match(a, b, r1, r2)

    return tito_input_ids


def _token_mismatch(recorded: list[int], request: list[int], index: int, tokenizer_dir: str | None) -> str:
    head = f"input_ids differ at token {index} (recorded {len(recorded)} tokens, request {len(request)})"
    try:
        from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(tokenizer_dir)
    except Exception as exc:  # ids alone still say where: a tokenizer problem must not hide the mismatch
        return (
            f"{head}; ids from {index}: recorded {recorded[index : index + 6]}, request {request[index : index + 6]} "
            f"(no tokenizer to decode them: {exc})"
        )

    def decode(ids: list[int]) -> str:
        text: str = tokenizer.decode(ids, skip_special_tokens=False)
        return text

    lines = [head, *token_context(recorded, request, index, decode, MATCH_LABELS)]
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    where = message_at(request, index, decode, start if isinstance(start, int) else None)
    return "\n".join(lines + ([f"in {where}"] if where else []))


def _plain_match(a: Any, b: Any, r1: Any, r2: Any) -> None:
    """Any other JSON request (an OpenAI-style engine call with messages in) as a JSON value, its random per-call
    ids aside: gateways re-serialise, so bytes are never compared; a mismatch names the first differing path."""
    if isinstance(a, dict) and isinstance(b, dict):
        found = json_difference(
            {k: v for k, v in b.items() if k not in VOLATILE_KEYS},
            {k: v for k, v in a.items() if k not in VOLATILE_KEYS},
        )
        if found is not None:
            where, was, now = found
            raise AssertionError(f"JSON bodies differ at {where}: recorded {short(was)}, request {short(now)}")
        return
    if _raw(r1.body) != _raw(r2.body):
        raise AssertionError("bodies differ")


input_ids_matcher = input_ids_matcher_for()
VOLATILE_KEYS = frozenset({"rid", "request_id"})


def configure_vcr(
    my_vcr: Any = None,
    *,
    record_mode: str = "once",
    header: Header | None = None,
    tokenizer_fingerprint: str | None = None,
    tokenizer_dir: str | None = None,
    **kwargs: Any,
) -> Any:
    """A `vcr.VCR` that stores tito cassettes; extra kwargs go to `vcr.VCR`. `tokenizer_dir` decodes the
    tokens a mismatch names (default: the embedded Qwen3 tokenizer)."""
    import vcr

    if record_mode not in RECORD_MODES:
        raise ValueError(f"record_mode must be one of {RECORD_MODES}, got {record_mode!r}")
    rewrite = record_mode == "rewrite"
    mode = "all" if rewrite else record_mode
    if my_vcr is None:
        kwargs.setdefault("match_on", ("method", "path", MATCHER_NAME))
        my_vcr = vcr.VCR(record_mode=mode, **kwargs)
    else:
        my_vcr.record_mode = mode
    my_vcr.register_serializer(SERIALIZER_NAME, TitoSerializer(header, tokenizer_fingerprint=tokenizer_fingerprint))
    my_vcr.register_persister(RewritePersister if rewrite else TitoPersister)
    my_vcr.register_matcher(MATCHER_NAME, input_ids_matcher_for(tokenizer_dir))
    my_vcr.serializer = SERIALIZER_NAME
    return my_vcr


# --- vcr dicts <-> engine records ------------------------------------------------------------------------


def _json_body(body: Any) -> Any:
    if isinstance(body, dict | list):
        return body
    raw = _raw(body)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def _raw(body: Any) -> bytes | None:
    if body is None:
        return None
    if isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode()
    if isinstance(body, dict | list):
        return json.dumps(body).encode()
    return bytes(body)


def _single_values(headers: dict[str, Any]) -> dict[str, str | list[str]]:
    return {k: (v[0] if isinstance(v, list) and len(v) == 1 else v) for k, v in (headers or {}).items()}


def _body_kind(body: Any) -> tuple[str, Any]:
    """How vcrpy held the body (so playback gives it back the same way) and its JSON value if any."""
    if body is None:
        return "none", None
    if isinstance(body, dict | list):
        return "object", body
    parsed = _json_body(body)
    if parsed is not None:
        return ("json-str" if isinstance(body, str) else "json-bytes"), parsed
    return ("str" if isinstance(body, str) else "bytes"), body


def _engine_record(request: dict[str, Any], response: dict[str, Any]) -> EngineRecord:
    headers = _single_values(request.get("headers", {}))
    request_kind, request_json = _body_kind(request.get("body"))
    body = response.get("body") or {}
    response_kind, response_value = _body_kind(body["string"]) if "string" in body else ("absent", None)
    status = response.get("status") or {}
    url = request.get("uri", "")
    return EngineRecord(
        session=DEFAULT_SESSION,
        seq=0,
        method=request.get("method", "POST"),
        path=urlsplit(url).path or "/",
        dialect=detect_dialect(urlsplit(url).path or "/", request_json, response_value),
        request=request_json if isinstance(request_json, dict) else None,
        status=int(status.get("code", 0)),
        response=response_value,
        headers=headers,
        extra={
            "uri": url,
            "reason": status.get("message", ""),
            "response_headers": response.get("headers", {}),
            "request_kind": request_kind,
            "response_kind": response_kind,
            **({} if isinstance(request_json, dict) else {"request_body": request_json}),
        },
    )


def _restore(kind: str, value: Any) -> Any:
    if kind == "object":
        return value
    if kind in ("json-str", "json-bytes"):
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        return text if kind == "json-str" else text.encode()
    return value


def _interaction(record: EngineRecord) -> dict[str, Any]:
    extra = record.extra or {}
    request_kind = extra.get("request_kind", "object" if record.request is not None else "none")
    request_value = extra.get("request_body", record.request)
    response_kind = extra.get("response_kind", "json-bytes")
    body: dict[str, Any] = {}
    if response_kind != "absent":
        body["string"] = _restore(response_kind, record.response)
    return {
        "request": {
            "method": record.method,
            "uri": extra.get("uri") or f"http://engine{record.path}",
            "body": _restore(request_kind, request_value),
            "headers": {k: [v] for k, v in record.headers.items()},
        },
        "response": {
            "status": {"code": record.status, "message": extra.get("reason", "")},
            "headers": extra.get("response_headers", {}),
            "body": body,
        },
    }
