"""The typed model behind every scenario-file section: msgspec Structs that reject unknown keys and wrong
types, and one-line errors that say where (`turns[3].tool_calls[0].arguments: expected object, got array`).

Each section's Structs live with the code that plays it (the engine's script in `fake_engine/policies/scripted.py`, the
scripted client's in `recorder/scripted/script.py`, a real CLI's in `recorder/agents/cli_script.py`); the whole
file, its JSON Schema and `tito scenario` are in `recorder/scenario_file.py`. A rule types cannot say (exactly
one of several keys, a name that must exist elsewhere) is a `__post_init__` raising ValueError, which msgspec
reports at the Struct's path like any other error.
"""

from __future__ import annotations

import re
import types
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import msgspec

T = TypeVar("T")
NonNegInt = Annotated[int, msgspec.Meta(ge=0)]
PosInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0)]
PosFloat = Annotated[float, msgspec.Meta(gt=0)]

_AT = re.compile(r"^(?P<message>.*?) - at (?:`key` in )?`(?P<path>\$[^`]*)`$", re.S)
_KEY_ERROR = re.compile(r" - at `key` in `")
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_JSON_WORDS = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class Strict(msgspec.Struct, forbid_unknown_fields=True):
    """Base of every scenario section: a key the section does not define is an error, not ignored."""


class FrozenStrict(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`Strict` for a section nothing changes once it is read."""


class ScenarioError(ValueError):
    """A scenario file (or one of its sections) that does not fit its model; the message is one line."""


def validate(data: Any, model: type[T], where: str = "") -> T:
    """`data` (parsed YAML or JSON) as `model`, or a ScenarioError naming the path under `where`."""
    try:
        return msgspec.convert(data, model)
    except msgspec.ValidationError as exc:
        raise ScenarioError(describe(exc, data, model, where)) from None


def describe(exc: msgspec.ValidationError, data: Any, model: Any, where: str = "") -> str:
    """msgspec's message as `path: what is wrong`, with the allowed keys or values where that helps."""
    text = " ".join(str(exc).split())
    match = _AT.match(text)
    message, path = (match.group("message"), match.group("path")) if match else (text, "$")
    located, model_at, data_at = _walk(model, data, path)
    message = _reword(message, model_at, data_at)
    if _KEY_ERROR.search(text):
        message = f"key {_failing_key(model_at, data_at)!r}: {message}"
    return f"{(where + located).lstrip('.') or where or 'scenario'}: {message}"


def _reword(message: str, model_at: Any, data_at: Any) -> str:
    if m := re.fullmatch(r"Object contains unknown field `(.*)`", message):
        allowed = (
            ", ".join(sorted(f.encode_name for f in msgspec.structs.fields(model_at))) if _is_struct(model_at) else "?"
        )
        return f"unknown key {m.group(1)!r}; allowed: {allowed}"
    if m := re.fullmatch(r"Object missing required field `(.*)`", message):
        return f"missing key {m.group(1)!r}"
    if m := re.fullmatch(r"Invalid enum value (.*)", message):
        values = [repr(v) for v in get_args(model_at)] if get_origin(model_at) is Literal else []
        return f"{m.group(1)} is not one of {', '.join(values)}" if values else f"invalid value {m.group(1)}"
    if m := re.fullmatch(r"Expected `(.*?)`, got `(.*)`", message):
        return f"expected {_json_words(m.group(1))}, got {_json_words(m.group(2))}"
    if m := re.fullmatch(r"Expected `(.*?)`(.*)", message):
        got = f", got {data_at!r}" if isinstance(data_at, int | float | str) and len(repr(data_at)) < 40 else ""
        return f"expected {_json_words(m.group(1))}{m.group(2)}{got}"
    return message


def _json_words(types_text: str) -> str:
    """msgspec's Python type names as the JSON Schema words a YAML author and an editor use."""
    return re.sub(r"\b(str|int|float|bool)\b", lambda m: _JSON_WORDS[m.group(1)], types_text)


def _walk(model: Any, data: Any, path: str) -> tuple[str, Any, Any]:
    """The readable path (dict keys named where msgspec writes `[...]`), and the model and data found there."""
    parts: list[str] = []
    for name, index in _SEGMENT.findall(path[1:]):
        model = _narrow(model, data)
        if name:
            parts.append(f".{name}")
            model = _field_type(model, name)
            data = data.get(name) if isinstance(data, dict) else None
        elif index == "...":
            key = _failing_key(model, data)
            parts.append(f".{key}" if isinstance(key, str) and _IDENTIFIER.match(key) else f"[{key!r}]")
            model = get_args(model)[1] if len(get_args(model)) == 2 else Any
            data = data.get(key) if isinstance(data, dict) else None
        else:
            parts.append(f"[{index}]")
            args = get_args(model)
            model = args[0] if args else Any
            data = data[int(index)] if isinstance(data, list) and int(index) < len(data) else None
    return "".join(parts), _narrow(model, data), data


def _narrow(model: Any, data: Any) -> Any:
    """The member of a union (and the type inside Annotated) that `data`'s shape selects."""
    while get_origin(model) is Annotated:
        model = get_args(model)[0]
    if get_origin(model) in (Union, types.UnionType):
        members = [_narrow(m, data) for m in get_args(model) if m is not type(None)]
        for member in members:
            origin = get_origin(member) or member
            if isinstance(data, dict) and (_is_struct(member) or origin is dict):
                return member
            if isinstance(data, list) and origin in (list, tuple):
                return member
        return members[0] if members else model
    return model


def _field_type(model: Any, name: str) -> Any:
    if _is_struct(model):
        for field in msgspec.structs.fields(model):
            if field.encode_name == name:
                return field.type
    return Any


def _failing_key(model: Any, data: Any) -> Any:
    """The first key of a mapping whose key or value does not convert (msgspec stops at the first)."""
    key_type, value_type = (get_args(model) + (Any, Any))[:2]
    for key, value in data.items() if isinstance(data, dict) else ():
        try:
            msgspec.convert(key, key_type)
            msgspec.convert(value, value_type)
        except msgspec.ValidationError:
            return key
    return "..."


def _is_struct(model: Any) -> bool:
    return isinstance(model, type) and issubclass(model, msgspec.Struct)
