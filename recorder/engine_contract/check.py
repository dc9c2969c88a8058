"""`tito check-engine URL`: which engine dialects a running engine answers, and whether each gives what tito needs.

One small request per dialect (four tokens, greedy), read the way tito's recorder reads it: token-faithful means
the prompt ids are known (sent, or returned), the output ids come back with one logprob each, and a finish reason.
Where a dialect answers but falls short, the start flag or request field it lacks is named: vLLM's
`/inference/v1/generate` answers 403 without `--enable-scale-out`; a chat answer without `token_ids` means the
engine ignores `return_token_ids` (vLLM before 0.10.2); `tool_choice` answering 400 means the engine was started
without `--enable-auto-tool-choice --tool-call-parser` (agents that call tools need it; token faithfulness does
not). Exit 0 when at least one dialect is token-faithful, 1 when none is, 2 when the engine cannot be reached.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tito_rl.recorder.engine_contract.exchange import Answer, Unreachable, send

PROMPT_IDS = [9707, 11, 1879, 0, 5692, 374]  # "Hello, world! Today is" in Qwen3's vocabulary; < 32000 for others
PROBE_TOKENS = 4
MESSAGES = [{"role": "user", "content": "Say hello."}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now.",
        "parameters": {"type": "object", "properties": {}},
    },
}


@dataclass
class DialectCheck:
    """What one dialect answered."""

    dialect: str
    route: str
    served: bool = False
    faithful: bool = False
    status: int | None = None
    missing: list[str] = field(default_factory=list)  # start flags or request fields, as a person acts on them
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        if self.faithful:
            verdict = "token-faithful"
        elif self.served:
            verdict = "answers, not token-faithful"
        else:
            verdict = "not served" if self.status in (404, 405, None) else f"refused ({self.status})"
        extra = [f"missing: {m}" for m in self.missing] + self.notes
        return f"{self.dialect:14} {self.route:32} {verdict}" + (f" ({'; '.join(extra)})" if extra else "")


def _choice0(answer: Answer) -> dict[str, Any]:
    """Choice 0 of a body, or of a stream merged: ids and logprob entries concatenated."""
    body = answer.body if isinstance(answer.body, dict) else {}
    choices = body.get("choices") or [{}]
    return choices[0] if isinstance(choices[0], dict) else {}


def _logprob_count(choice: dict[str, Any]) -> int:
    logprobs = choice.get("logprobs") or {}
    if isinstance(logprobs.get("content"), list):
        return sum(1 for e in logprobs["content"] if isinstance(e, dict) and isinstance(e.get("logprob"), float))
    if isinstance(logprobs.get("token_logprobs"), list):
        return sum(1 for v in logprobs["token_logprobs"] if isinstance(v, float))
    return 0


def _judge(
    check: DialectCheck,
    answer: Answer,
    prompt_known: bool,
    output_ids: Any,
    logprobs: int,
    finish: Any,
    missing_ids: str,
) -> None:
    check.status = answer.status
    if answer.status != 200:
        return
    check.served = True
    if not isinstance(output_ids, list) or not output_ids:
        check.missing.append(missing_ids)
        return
    if not prompt_known:
        check.missing.append(missing_ids)
    if logprobs != len(output_ids):
        check.missing.append(f"logprobs ({logprobs} for {len(output_ids)} output ids)")
    if not finish:
        check.notes.append("no finish reason")
    check.faithful = prompt_known and logprobs == len(output_ids) and bool(finish)


def check_sglang(url: str) -> DialectCheck:
    check = DialectCheck("sglang", "POST /generate")
    answer = send(
        url,
        "POST",
        "/generate",
        {
            "input_ids": PROMPT_IDS,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": PROBE_TOKENS, "temperature": 0},
        },
    )
    body = answer.body if isinstance(answer.body, dict) else {}
    meta = body.get("meta_info") or {}
    triples = meta.get("output_token_logprobs") if isinstance(meta, dict) else None
    count = (
        sum(1 for t in triples if isinstance(t, list) and t and isinstance(t[0], float))
        if isinstance(triples, list)
        else 0
    )
    _judge(
        check,
        answer,
        True,
        body.get("output_ids"),
        count,
        meta.get("finish_reason") if isinstance(meta, dict) else None,
        "output_ids (an SGLang /generate answer)",
    )
    return check


def check_vllm_chat(url: str, model: str) -> DialectCheck:
    check = DialectCheck("vllm-openai", "POST /v1/chat/completions")
    answer = send(
        url,
        "POST",
        "/v1/chat/completions",
        {
            "model": model,
            "messages": MESSAGES,
            "max_tokens": PROBE_TOKENS,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 0,
            "return_token_ids": True,
        },
    )
    choice = _choice0(answer)
    body = answer.body if isinstance(answer.body, dict) else {}
    if answer.status == 200 and ("matched_stop" in choice or "meta_info" in choice):
        check.dialect = "sglang-openai"  # SGLang's OpenAI server: its own fields carry the ids
        ids = choice.get("token_ids") or choice.get("response_token_ids")
        prompt = choice.get("prompt_token_ids") or body.get("prompt_token_ids")
        _judge(
            check,
            answer,
            isinstance(prompt, list),
            ids,
            _logprob_count(choice),
            choice.get("finish_reason"),
            "return_token_ids (SGLang >= 0.5.17), or input_ids in the request",
        )
        return check
    _judge(
        check,
        answer,
        isinstance(body.get("prompt_token_ids"), list),
        choice.get("token_ids"),
        _logprob_count(choice),
        choice.get("finish_reason"),
        "return_token_ids support (vLLM >= 0.10.2)",
    )
    return check


def check_vllm_completions(url: str, model: str) -> DialectCheck:
    check = DialectCheck("vllm-openai", "POST /v1/completions (ids)")
    answer = send(
        url,
        "POST",
        "/v1/completions",
        {
            "model": model,
            "prompt": PROMPT_IDS,
            "max_tokens": PROBE_TOKENS,
            "temperature": 0,
            "logprobs": 0,
            "return_token_ids": True,
        },
    )
    choice = _choice0(answer)
    _judge(
        check,
        answer,
        True,
        choice.get("token_ids"),
        _logprob_count(choice),
        choice.get("finish_reason"),
        "return_token_ids support (vLLM >= 0.10.2)",
    )
    return check


def check_vllm_generate(url: str, model: str) -> DialectCheck:
    check = DialectCheck("vllm-generate", "POST /inference/v1/generate")
    answer = send(
        url,
        "POST",
        "/inference/v1/generate",
        {
            "model": model,
            "token_ids": PROMPT_IDS,
            "return_token_ids": True,
            "sampling_params": {"max_tokens": PROBE_TOKENS, "temperature": 0, "logprobs": 0},
        },
    )
    if answer.status == 403:
        check.status = 403
        check.missing.append("--enable-scale-out (vLLM serves /inference/v1/generate only with it)")
        return check
    choice = _choice0(answer)
    _judge(
        check,
        answer,
        True,
        choice.get("token_ids"),
        _logprob_count(choice),
        choice.get("finish_reason"),
        "token_ids in the answer",
    )
    return check


def check_tool_choice(url: str, model: str, chat: DialectCheck) -> None:
    """A note on the chat dialect: agents that call tools need `tool_choice` served (a start flag on vLLM)."""
    if not chat.served:
        return
    answer = send(
        url,
        "POST",
        "/v1/chat/completions",
        {"model": model, "messages": MESSAGES, "max_tokens": 1, "tools": [TOOL], "tool_choice": "auto"},
    )
    if answer.status == 400 and "tool" in json.dumps(answer.body).lower():
        chat.notes.append(
            "tool_choice refused: start with --enable-auto-tool-choice --tool-call-parser "
            "(hermes for Qwen3) for agents that call tools"
        )


def served_model(url: str) -> str | None:
    answer = send(url, "GET", "/v1/models", timeout_s=10)
    try:
        return str(answer.body["data"][0]["id"])
    except (TypeError, KeyError, IndexError):
        return None


@dataclass
class EngineReport:
    url: str
    model: str | None
    checks: list[DialectCheck]

    @property
    def faithful(self) -> list[str]:
        return sorted({c.dialect for c in self.checks if c.faithful})


def check_engine(url: str) -> EngineReport:
    """Probe every dialect; raises Unreachable where the engine answers nothing at all."""
    model = served_model(url) or "default"
    checks = [check_sglang(url)]
    chat = check_vllm_chat(url, model)
    checks.append(chat)
    if chat.dialect == "vllm-openai":
        checks.append(check_vllm_completions(url, model))
        check_tool_choice(url, model, chat)
    checks.append(check_vllm_generate(url, model))
    return EngineReport(url, model, checks)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="URL", help="the engine's base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace, say: Callable[[str], None] = print) -> int:
    url = args.url.rstrip("/").removesuffix("/v1")  # the engine's root: an OpenAI base URL names /v1 too
    try:
        report = check_engine(url)
    except Unreachable as error:
        say(f"tito check-engine: {url} cannot be reached ({error})")
        return 2
    if args.json:
        say(
            json.dumps(
                {
                    "url": report.url,
                    "model": report.model,
                    "token_faithful": report.faithful,
                    "dialects": [asdict(c) for c in report.checks],
                },
                indent=2,
            )
        )
    else:
        say(f"engine {url} (model {report.model})")
        for check in report.checks:
            say(f"  {check.line()}")
        say("token-faithful: " + (", ".join(report.faithful) if report.faithful else "none"))
    return 0 if report.faithful else 1
