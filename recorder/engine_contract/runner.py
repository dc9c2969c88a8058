"""Running the contract: against a live engine (recording its answers), and against the fake engine (held to them).

Live, the requests of one start mode go to one running engine in order, through tito's own engine tap in front of
it (`tapped`: the answers kept are what the tap recorded, each with its dialect); the placeholders' values are
learned as the run goes (the model's name from GET /v1/models, the stop id and string from the seeded chat
answer). Against the fake engine, each recorded request is sent as it was, the fake answering with the real
engine's tokens (`fake.RealTokensPolicy`), and the two answers compared by shape (`shape.compare_answers`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tito_rl.recorder.engine_contract.answers import Exchange, Recording
from tito_rl.recorder.engine_contract.exchange import Answer, send
from tito_rl.recorder.engine_contract.fake import RealTokensPolicy, running_fake
from tito_rl.recorder.engine_contract.left_out import left_out_for
from tito_rl.recorder.engine_contract.requests import (
    MODEL,
    PROMPT_TEXT,
    STOP_ID,
    STOP_TEXT,
    ContractRequest,
    resolve,
)
from tito_rl.recorder.engine_contract.shape import compare_answers
from tito_rl.recorder.engine_contract.tapped import tapped_engine
from tito_rl.recorder.real_engine.paths import MAX_MODEL_LEN
from tito_rl.trajectory.dialects.view import VLLM_OPENAI
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

SEEDED = ("chat json ids", "generate json")  # the answer whose third token gives the stop id and string


CONTEXT = "$context_length"


def base_values(tokenizer: Any, model: str, context_length: int = MAX_MODEL_LEN) -> dict[str, Any]:
    """The placeholders' values known before the first answer; the over-long prompt is 16 tokens past the
    engine's context length."""
    prompt = list(tokenizer.encode(PROMPT_TEXT, add_special_tokens=False))
    long_prompt = (prompt * ((context_length + 16) // len(prompt) + 1))[: context_length + 16]
    return {MODEL: model, CONTEXT: context_length, "$prompt_ids": prompt, "$long_prompt_ids": long_prompt}


def served_model(base_url: str) -> tuple[str, int]:
    """The served model's name and context length, from GET /v1/models (vLLM's and SGLang's `max_model_len`)."""
    answer = send(base_url, "GET", "/v1/models")
    try:
        card = answer.body["data"][0]
        return str(card["id"]), int(card.get("max_model_len") or MAX_MODEL_LEN)
    except (TypeError, KeyError, IndexError, ValueError):
        raise ValueError(f"GET {base_url}/v1/models answered {answer.status} without a model") from None


def stop_values(answer: Answer, tokenizer: Any) -> dict[str, Any]:
    """A stop id and a stop string the seeded answer is sure to meet: its third output token, or the first later
    one whose text is a printable word (a stop string must be found in the text)."""
    body = answer.body if isinstance(answer.body, dict) else {}
    choices = body.get("choices") or [{}]
    ids = body.get("output_ids") or choices[0].get("token_ids") or []  # SGLang's /generate, or vLLM's chat
    if len(ids) < 3:
        raise ValueError(f"the seeded chat answer has {len(ids)} token ids: cannot pick a stop id")
    text_at = next((i for i in range(2, len(ids)) if tokenizer.decode([ids[i]]).strip().isalnum()), 2)
    return {STOP_ID: ids[2], STOP_TEXT: tokenizer.decode([ids[text_at]]).strip() or tokenizer.decode([ids[2]])}


def record_live(
    base_url: str,
    requests: Iterable[ContractRequest],
    values: dict[str, Any],
    progress: Callable[[str], None] = lambda line: None,
    dialect: str = VLLM_OPENAI,
) -> list[Exchange]:
    """Send each request in order through tito's engine tap in front of the engine at `base_url` (`dialect`: the
    engine's, for the paths that do not say theirs), and keep what the tap recorded; `values` gains the stop id
    and string."""
    tokenizer = load_tokenizer()
    out: list[Exchange] = []
    with tapped_engine(base_url, dialect) as engine:
        for request in requests:
            answer = engine.send(
                f"{request.mode} {request.name}", request.method, request.path, resolve(request.body, values)
            )
            progress(f"{request.mode:4} {request.name}: {answer.status} ({answer.dialect})")
            if request.name in SEEDED and answer.status == 200 and STOP_ID not in values:
                values.update(stop_values(answer, tokenizer))
            out.append(Exchange(request, answer))
    return out


@dataclass
class Verdict:
    """The fake engine's answers against a recording: differences per request."""

    checked: int = 0
    differences: dict[str, list[str]] = field(default_factory=dict)
    left_out: dict[str, list[str]] = field(default_factory=dict)  # key of the LeftOut rule: the lines it covers

    @property
    def ok(self) -> bool:
        return not self.differences


def check_fake(
    recording: Recording, vllm_version: str | None = None, only: Callable[[Exchange], bool] = lambda exchange: True
) -> Verdict:
    """Send every recorded request to the fake engine (in its recorded start mode) and compare the answers."""
    tokenizer = load_tokenizer()
    policy = RealTokensPolicy(tokenizer)
    verdict = Verdict()
    for mode in dict.fromkeys(e.request.mode for e in recording.exchanges):
        context = int(recording.values.get(CONTEXT) or MAX_MODEL_LEN)
        with running_fake(mode, policy, vllm_version or recording.version, context) as url:
            for exchange in recording.exchanges:
                if exchange.request.mode != mode or not only(exchange):
                    continue
                policy.expect(exchange.answer)
                fake = send(url, exchange.request.method, exchange.request.path, recording.body_of(exchange))
                verdict.checked += 1
                found = compare_answers(exchange.answer, fake, f"{mode} {exchange.request.name}")
                for line in found:
                    rule = left_out_for(exchange, line)
                    if rule is not None:
                        verdict.left_out.setdefault(rule.key, []).append(line)
                    else:
                        verdict.differences.setdefault(exchange.request.name, []).append(line)
    return verdict


def drift(committed: Recording, live: Recording) -> list[str]:
    """Structural differences between two recordings of the same engine (a re-record against the committed)."""
    found: list[str] = []
    fresh = {(e.request.mode, e.request.name): e for e in live.exchanges}
    for exchange in committed.exchanges:
        key = (exchange.request.mode, exchange.request.name)
        if key not in fresh:
            found.append(f"{key[0]} {key[1]}: not in the new recording")
            continue
        found += compare_answers(exchange.answer, fresh[key].answer, f"{key[0]} {key[1]}")
    return found
