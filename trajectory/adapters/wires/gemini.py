"""Gemini API wire (Gemini CLI 0.61) <-> canonical messages; replies as a GenerateContentResponse, its SSE
events (`:streamGenerateContent?alt=sse`) or, for a stream without `alt=sse`, the JSON array of its chunks.

Translation follows the other wires: systemInstruction -> one system message; a user content's text parts
-> one user message and each functionResponse -> a tool message, in part order; a model content -> one
assistant message (thought parts -> reasoning, text, functionCall -> tool_calls). Wire ids, thought
signatures and the names on function responses are dropped, so echoes compare by value: Gemini CLI adds an
`id` and a `thoughtSignature` to the calls it echoes and leaves thought parts out of its history.
Field names are read in camelCase or snake_case, as the REST API accepts both.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tito_rl.trajectory.adapters.canonical import message, tool_call
from tito_rl.trajectory.adapters.turns import BadRequest, TurnReply, TurnRequest, function_tool, number, sse, stop_list

TURN_ACTIONS = frozenset({"generateContent", "streamGenerateContent"})
COUNT_ACTION = "countTokens"
PART_JOINER = "\n\n"  # between the text parts of one user or system content (Gemini CLI sends context + task)
DATA_KEYS = ("text", "functionCall", "functionResponse", "inlineData", "fileData")
JSON_MIME = "application/json"


def split_action(model_action: str) -> tuple[str, str]:
    """`gemini-2.5-flash:streamGenerateContent` -> (model, action); no colon: no action."""
    model, _, action = model_action.rpartition(":")
    return (model, action) if model else (model_action, "")


def _get(obj: dict[str, Any], camel: str) -> Any:
    if camel in obj:
        return obj[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return obj.get(snake)


def _object(value: Any, where: str, required: bool = False) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object")
    return value


def _finite(value: Any, where: str) -> None:
    """JSON out to the template cannot carry NaN, and NaN != NaN would fork every echo of it."""
    if isinstance(value, float) and not math.isfinite(value):
        raise BadRequest(f"{where} holds a non-finite number {value!r}")
    if isinstance(value, dict):
        for v in value.values():
            _finite(v, where)
    elif isinstance(value, list):
        for v in value:
            _finite(v, where)


def _kind(part: Any, where: str) -> str:
    if not isinstance(part, dict):
        raise BadRequest(f"{where} must be an object")
    kinds = [k for k in DATA_KEYS if _get(part, k) is not None]
    if len(kinds) != 1:
        found = "no" if not kinds else "more than one"
        raise BadRequest(f"{where} has {found} supported data field (one of {', '.join(DATA_KEYS)})")
    return kinds[0]


def _text(part: dict[str, Any], where: str) -> str:
    text = part["text"]
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text must be a string")
    return text


def _media(part: dict[str, Any], kind: str, where: str) -> str:
    data = _object(_get(part, kind), f"{where}.{kind}", required=True)
    mime = _get(data, "mimeType")
    return "[image]" if isinstance(mime, str) and mime.startswith("image/") else "[file]"


def _call(part: dict[str, Any], where: str) -> dict[str, Any]:
    call = _object(_get(part, "functionCall"), f"{where}.functionCall", required=True)
    name, args = call.get("name"), call.get("args")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.functionCall.name must be a non-empty string")
    _finite(_object(args, f"{where}.functionCall.args"), f"{where}.functionCall.args")
    return tool_call(name, args or {})


def response_text(response: Any) -> str:
    """A function response as the tool message's text: Gemini CLI's `{"output": text}` is the text itself,
    anything else compact JSON (key order kept: the client's own order is what it re-sends)."""
    output = response.get("output") if isinstance(response, dict) and len(response) == 1 else None
    if isinstance(output, str):
        return output
    return json.dumps(response, ensure_ascii=False, separators=(",", ":"))


def _function_response(part: dict[str, Any], where: str) -> dict[str, Any]:
    result = _object(_get(part, "functionResponse"), f"{where}.functionResponse", required=True)
    response = _object(result.get("response"), f"{where}.functionResponse.response")
    _finite(response, f"{where}.functionResponse.response")
    return message("tool", response_text(response))


def _user(parts: list[Any], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        kind = _kind(part, at)
        if kind == "functionResponse":
            if texts:
                out.append(message("user", PART_JOINER.join(texts)))
                texts = []
            out.append(_function_response(part, at))
        elif kind == "functionCall":
            raise BadRequest(f"{at}: a functionCall belongs in a model content")
        else:
            texts.append(_text(part, at) if kind == "text" else _media(part, kind, at))
    if texts:
        out.append(message("user", PART_JOINER.join(texts)))
    return out


def _model(parts: list[Any], where: str) -> dict[str, Any]:
    reasoning: list[str] = []
    content: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        kind = _kind(part, at)
        thought = part.get("thought", False)
        if not isinstance(thought, bool):
            raise BadRequest(f"{at}.thought must be a boolean")
        if kind == "text":
            (reasoning if thought else content).append(_text(part, at))
        elif kind == "functionCall":
            calls.append(_call(part, at))
        elif kind == "functionResponse":
            raise BadRequest(f"{at}: a functionResponse belongs in a user content")
        else:
            content.append(_media(part, kind, at))
    return message("assistant", "".join(content), "".join(reasoning), calls)


def _contents(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise BadRequest("contents must be a non-empty list")
    messages: list[dict[str, Any]] = []
    for i, content in enumerate(raw):
        where = f"contents[{i}]"
        content = _object(content, where, required=True)
        role = content.get("role") or "user"  # the API's default for a single-turn request
        parts = content.get("parts")
        if not isinstance(parts, list) or not parts:
            raise BadRequest(f"{where}.parts must be a non-empty list")
        if role in ("user", "function"):  # `function`: the older role of function responses
            messages += _user(parts, where)
        elif role == "model":
            messages.append(_model(parts, where))
        else:
            raise BadRequest(f"{where}.role must be user or model, got {role!r}")
    return messages


def _system(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [message("system", raw)] if raw else []
    parts = _object(raw, "systemInstruction").get("parts")
    if not isinstance(parts, list):
        raise BadRequest("systemInstruction.parts must be a list")
    texts = []
    for j, part in enumerate(parts):
        at = f"systemInstruction.parts[{j}]"
        if _kind(part, at) != "text":
            raise BadRequest(f"{at} must be a text part")
        texts.append(_text(part, at))
    return [message("system", PART_JOINER.join(texts))] if texts else []


def json_schema(schema: Any) -> Any:
    """Gemini's OpenAPI `parameters` (types as `STRING`, `OBJECT`) in the JSON Schema spelling the template
    shows the model for every other client."""
    if isinstance(schema, dict):
        return {k: (v.lower() if k == "type" and isinstance(v, str) else json_schema(v)) for k, v in schema.items()}
    if isinstance(schema, list):
        return [json_schema(v) for v in schema]
    return schema


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("tools must be a list")
    tools = []
    for i, tool in enumerate(raw):
        declarations = _get(_object(tool, f"tools[{i}]", required=True), "functionDeclarations")
        if declarations is None:
            continue  # googleSearch, codeExecution...: hosted tools with no function form for the template
        if not isinstance(declarations, list):
            raise BadRequest(f"tools[{i}].functionDeclarations must be a list")
        for j, decl in enumerate(declarations):
            decl = _object(decl, f"tools[{i}].functionDeclarations[{j}]", required=True)
            schema = _get(decl, "parametersJsonSchema")
            if schema is None:
                schema = json_schema(decl.get("parameters"))
            tools.append(function_tool(decl.get("name"), decl.get("description"), schema))
    return tools


def _sampling(config: dict[str, Any]) -> dict[str, Any]:
    sampling: dict[str, Any] = {}
    for wire_key, key, kind in (
        ("maxOutputTokens", "max_tokens", int),
        ("temperature", "temperature", float),
        ("topP", "top_p", float),
        ("topK", "top_k", int),
    ):
        if (value := number({wire_key: _get(config, wire_key)}, wire_key, kind)) is not None:
            sampling[key] = value
    if (stops := stop_list(_get(config, "stopSequences"), "stopSequences")) is not None:
        sampling["stop"] = stops
    if number({"candidateCount": _get(config, "candidateCount")}, "candidateCount", int) not in (None, 1):
        raise BadRequest("candidateCount must be 1: one candidate is generated per request")
    return sampling


def parse_request(
    body: dict[str, Any], model: str = "", action: str = "generateContent", sse_stream: bool = True
) -> TurnRequest:
    """`model` and `action` come from the path; `sse_stream` is `alt=sse` (without it a stream is one JSON
    array of chunks)."""
    if _get(body, "cachedContent"):
        raise BadRequest("cachedContent is not supported: send the whole conversation in contents")
    messages = _system(_get(body, "systemInstruction")) + _contents(body.get("contents"))
    config = _object(_get(body, "generationConfig"), "generationConfig")
    sampling = _sampling(config)
    has_schema = _get(config, "responseSchema") is not None or _get(config, "responseJsonSchema") is not None
    structured = _get(config, "responseMimeType") == JSON_MIME and has_schema
    thinking = _object(_get(config, "thinkingConfig"), "generationConfig.thinkingConfig")
    stream = action == "streamGenerateContent"
    options = {
        "sse": stream and sse_stream,
        "array": stream and not sse_stream,
        "include_thoughts": _get(thinking, "includeThoughts") is True,
    }
    return TurnRequest(messages, _tools(_get(body, "tools")), sampling, options["sse"], model, structured, options)


def count_request(body: dict[str, Any], model: str = "") -> TurnRequest:
    """countTokens takes `contents` or a whole `generateContentRequest`."""
    inner = _get(body, "generateContentRequest")
    return parse_request(_object(inner, "generateContentRequest", required=True) if inner is not None else body, model)


def count_tokens_body(n: int) -> dict[str, Any]:
    return {"totalTokens": n}


def _part_groups(request: TurnRequest, reply: TurnReply) -> list[list[dict[str, Any]]]:
    """The reply's parts, grouped as the stream sends them: thoughts, text, then each call."""
    parsed, groups = reply.parsed, []
    if parsed.reasoning and request.options.get("include_thoughts"):
        groups.append([{"text": parsed.reasoning, "thought": True}])
    if parsed.content:
        groups.append([{"text": parsed.content}])
    groups += [[{"functionCall": {"name": c.name, "args": c.arguments_dict()}}] for c in parsed.tool_calls]
    return groups or [[{"text": ""}]]


def finish_reason(reply: TurnReply) -> str:
    return "MAX_TOKENS" if reply.finish_reason == "length" else "STOP"


def _usage(reply: TurnReply) -> dict[str, Any]:
    thoughts = min(reply.reasoning_tokens, reply.completion_tokens)
    usage: dict[str, Any] = {
        "promptTokenCount": reply.prompt_tokens,
        "candidatesTokenCount": reply.completion_tokens - thoughts,
        "totalTokenCount": reply.prompt_tokens + reply.completion_tokens,
    }
    if reply.cached_tokens:
        usage["cachedContentTokenCount"] = reply.cached_tokens
    if thoughts:
        usage["thoughtsTokenCount"] = thoughts
    return usage


def _chunk(request: TurnRequest, reply: TurnReply, parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}}
    if last:
        candidate["finishReason"] = finish_reason(reply)
    candidate["index"] = 0
    chunk: dict[str, Any] = {"candidates": [candidate]}
    if last:
        chunk["usageMetadata"] = _usage(reply)
    chunk.update(modelVersion=request.model, responseId=reply.make_id("", length=22))
    return chunk


def _chunks(request: TurnRequest, reply: TurnReply) -> list[dict[str, Any]]:
    groups = _part_groups(request, reply)
    return [_chunk(request, reply, parts, i == len(groups) - 1) for i, parts in enumerate(groups)]


def build_json(request: TurnRequest, reply: TurnReply) -> dict[str, Any] | list[dict[str, Any]]:
    if request.options.get("array"):
        return _chunks(request, reply)
    return _chunk(request, reply, [p for group in _part_groups(request, reply) for p in group], True)


def build_events(request: TurnRequest, reply: TurnReply) -> list[str]:
    """One `data:` event per part group; the last carries finishReason and usageMetadata, as the API does."""
    return [sse(chunk) for chunk in _chunks(request, reply)]


STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


OVERLOADED_STATUS = 503  # UNAVAILABLE, what the Gemini API answers when the model is overloaded


def error_body(status: int, text: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": text, "status": STATUSES.get(status, "UNKNOWN")}}
