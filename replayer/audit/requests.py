"""What the client asked against what reached the engine: `sampling-override` and `regenerated-retry`.

A client's sampling settings are read per wire (Anthropic `max_tokens`, `stop_sequences`; Chat `max_tokens` or
`max_completion_tokens`, `stop`; Responses `max_output_tokens`; Gemini's `generationConfig`) and compared with the
engine call's under OpenAI's names (the dialect view's `sampling`). A gateway lowering max tokens to the context
the prompt leaves has changed nothing the engine would not enforce itself: that is not an override when the
recording says the context length (the header's adapter or target settings, or the engine's model info).
"""

from __future__ import annotations

import math
from typing import Any

from tito_rl.cassette.format.records import Header
from tito_rl.replayer.audit.protocol import Example, Findings, Side, clip, decode
from tito_rl.replayer.audit.traffic import Exchange, RuleFamily, SessionState, request_sampling

COMPARED = ("max_tokens", "temperature", "top_p", "stop")


def client_sampling(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The sampling settings an agent's request sets, under OpenAI's names."""
    out: dict[str, Any] = {}
    if "/v1beta/models/" in path:
        config = body.get("generationConfig") or {}
        names = {
            "maxOutputTokens": "max_tokens",
            "temperature": "temperature",
            "topP": "top_p",
            "stopSequences": "stop",
        }
        source = config if isinstance(config, dict) else {}
    else:
        names = {
            "max_tokens": "max_tokens",
            "max_completion_tokens": "max_tokens",
            "max_output_tokens": "max_tokens",
            "temperature": "temperature",
            "top_p": "top_p",
            "stop": "stop",
            "stop_sequences": "stop",
        }
        source = body
    for key, name in names.items():
        value = source.get(key)
        if value is not None:
            out[name] = value
    if isinstance(out.get("stop"), str):
        out["stop"] = [out["stop"]]
    return out


def context_length(header: Header) -> int | None:
    """The context the recording says the model has, wherever the header holds it."""
    places = [header.adapter or {}, ((header.target or {}).get("settings") or {}), header.engine or {}]
    for place in places:
        for key in ("context_length", "max_context_length", "context_len", "max_model_len"):
            value = place.get(key) if isinstance(place, dict) else None
            if isinstance(value, int) and value > 0:
                return value
    return None


def overrides(client: dict[str, Any], engine: dict[str, Any], prompt_len: int | None, context: int | None) -> list[str]:
    """`name client → engine` for each setting the client set that reached the engine changed."""
    found = []
    for name in COMPARED:
        if name not in client:
            continue
        asked, sent = client[name], engine.get(name)
        if name == "stop":
            sent_list = [sent] if isinstance(sent, str) else list(sent or [])
            if not set(map(str, asked)) <= set(map(str, sent_list)):
                found.append(f"stop {asked} → {sent_list}")
            continue
        if sent is None:
            if name != "max_tokens":  # an engine with no max tokens sent generates up to the context
                found.append(f"{name} {asked} → (engine default)")
            continue
        if not isinstance(asked, int | float) or not isinstance(sent, int | float):
            continue
        if name == "max_tokens":
            capped = context is not None and prompt_len is not None and prompt_len + sent >= context
            if sent != asked and not (sent < asked and capped):
                found.append(f"max_tokens {asked} → {sent}")
        elif not math.isclose(float(asked), float(sent), rel_tol=1e-6, abs_tol=1e-9):
            found.append(f"{name} {asked} → {sent}")
    return found


class Requests(RuleFamily):
    rules = ("sampling-override", "regenerated-retry")

    def __init__(self, findings: Findings) -> None:
        self.findings = findings

    def exchange(self, state: SessionState, exchange: Exchange) -> None:
        record = exchange.record
        assert record is not None
        if exchange.regenerated:
            example = None
            if self.findings.wants_example("regenerated-retry"):
                first_seq, first = state.answered[exchange.retry_of]  # type: ignore[index]
                answer = exchange.answer
                assert answer is not None
                example = Example(
                    state.name,
                    exchange.index,
                    record.seq,
                    None,
                    f"exchange {exchange.index} re-sends exchange {exchange.retry_of}'s body, answered "
                    f"by engine call seq {first_seq}, and the engine generated again (seq {answer.seq})",
                    [
                        Side("first generation", clip(decode(first[:24]))),
                        Side("generated again", clip(decode(answer.output[:24]))),
                    ],
                )
            self.findings.add("regenerated-retry", state.name, 1, None, example)
        generating = [c for c in exchange.calls if c.generates]
        if not generating:
            return
        client = client_sampling(record.path, request_sampling(record))
        if not client:
            return
        context = state.notes.get("context")
        if context is None:
            context = state.notes["context"] = context_length(state.header) or 0
        for call in generating:
            changed = overrides(client, call.view.sampling, call.prompt_len, context or None)
            for change in changed:
                kind = change.split(" ", 1)[0]
                example = None
                if self.findings.wants_example("sampling-override"):
                    example = Example(
                        state.name,
                        exchange.index,
                        call.seq,
                        None,
                        change,
                        [Side("client", change.split(" → ")[0]), Side("engine", f"{kind} {change.split(' → ', 1)[1]}")],
                    )
                self.findings.add("sampling-override", state.name, 1, kind, example)
