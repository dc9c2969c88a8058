"""The real engine's recorded answers to the contract, committed so CI holds the fake engine to them with no vLLM.

One JSON file per engine and version (`answers/vllm-0.32.0.json`; from the real SGLang on the CPU, `sglang-0.5.23.json`
and the MoE's `sglang-0.5.23-routes.json`, docs/real-engine.md): the start flags of each mode, the values the
requests' placeholders took (the model's name, the prompt ids, the stop id and string the seeded answer gave),
and each request as sent (placeholders kept) with the status and body, or the data events of its stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tito_rl.recorder.engine_contract.exchange import Answer
from tito_rl.recorder.engine_contract.requests import ContractRequest, resolve

ANSWERS_DIR = Path(__file__).with_name("answers")


@dataclass
class Exchange:
    """One contract request and the answer an engine gave it."""

    request: ContractRequest
    answer: Answer

    def to_json(self) -> dict[str, Any]:
        r = self.request
        return {
            "name": r.name,
            "mode": r.mode,
            "dialect": r.dialect,
            "method": r.method,
            "path": r.path,
            "body": r.body,
            "why": r.why,
            "answer": self.answer.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Exchange:
        request = ContractRequest(
            name=data["name"],
            mode=data["mode"],
            method=data["method"],
            path=data["path"],
            body=data.get("body"),
            why=data.get("why", ""),
            dialect=data.get("dialect", "vllm-openai"),
        )
        return cls(request, Answer.from_json(data["answer"]))


@dataclass
class Recording:
    """A whole contract run against one engine."""

    engine: str  # vllm | sglang
    version: str
    start_flags: dict[str, list[str]]
    values: dict[str, Any]
    exchanges: list[Exchange] = field(default_factory=list)

    def body_of(self, exchange: Exchange) -> Any:
        return resolve(exchange.request.body, self.values)

    def to_json(self) -> str:
        data = {
            "engine": self.engine,
            "version": self.version,
            "start_flags": self.start_flags,
            "values": self.values,
            "exchanges": [e.to_json() for e in self.exchanges],
        }
        return json.dumps(data, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Recording:
        data = json.loads(text)
        return cls(
            engine=data["engine"],
            version=data["version"],
            start_flags=data["start_flags"],
            values=data["values"],
            exchanges=[Exchange.from_json(e) for e in data["exchanges"]],
        )


def answers_path(engine: str, version: str) -> Path:
    return ANSWERS_DIR / f"{engine}-{version}.json"


def load_recording(engine: str, version: str) -> Recording:
    path = answers_path(engine, version)
    try:
        return Recording.from_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no recorded answers for {engine} {version} ({path})") from None
