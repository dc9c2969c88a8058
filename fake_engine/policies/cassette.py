"""`tito fake-engine --cassette FILE`: the fake engine answers from a cassette's engine leg.

Each /generate is looked up by its input_ids and result-changing sampling params (`tito_rl.cassette.matching`),
so a replayed agent that sends the same requests gets the same tokens, logprobs and finish reasons. A request
that was never recorded is refused (HTTP 400) with the closest recorded request, the first divergent token
and the decoded text around it: the usual cause is a changed prompt, and that message shows where.
"""

from __future__ import annotations

import os
from typing import Any

from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.matching import EngineIndex, NoMatch, RecordedCall
from tito_rl.cassette.reader import CassetteReader
from tito_rl.fake_engine.policy import GenerateRequest, Generation, PolicyError, finish_kind
from tito_rl.trajectory.dialects.view import SGLANG


class CassettePolicy:
    def __init__(self, index: EngineIndex, truncated: bool = False) -> None:
        self.index = index
        self.truncated = truncated

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        tokenizer_path: str | os.PathLike[str] | None = None,
        check_tokenizer: bool = True,
    ) -> CassettePolicy:
        """Read the engine leg; refuses a cassette recorded with another tokenizer than `tokenizer_path`'s."""
        from tito_rl.trajectory.tokens.tokenizer import fingerprint, load_tokenizer

        tokenizer = load_tokenizer(tokenizer_path)
        expected = fingerprint(tokenizer_path) if check_tokenizer else None
        index = EngineIndex(decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        others: dict[str, int] = {}  # engine calls of other dialects, which this engine cannot answer from
        with CassetteReader(path, expected) as reader:
            for record in reader.records():
                if isinstance(record, EngineRecord) and not index.add(record) and record.dialect not in (None, SGLANG):
                    others[record.dialect] = others.get(record.dialect, 0) + 1
            truncated = reader.truncated
        if others and not index.calls:
            named = ", ".join(f"{n} {d}" for d, n in sorted(others.items()))
            raise ValueError(
                f"{path}: its engine leg is not SGLang's /generate ({named} call(s)): --cassette serves SGLang "
                "recordings; replay the cassette with `tito replay`, which serves every dialect's engine leg"
            )
        return cls(index, truncated)

    def generate(self, req: GenerateRequest) -> Generation:
        found = self.index.match(req.input_ids, req.sampling_params, req.routing_key)
        if isinstance(found, NoMatch):
            raise PolicyError(found.message(), status=400)
        return generation_from_response(found)


def generation_from_response(call: RecordedCall) -> Generation:
    """Rebuild what the model produced from a recorded SGLang /generate body."""
    response: dict[str, Any] = call.response
    output_ids = list(response.get("output_ids") or [])
    meta = response.get("meta_info") or {}
    triples = meta.get("output_token_logprobs")
    logprobs = None
    if isinstance(triples, list) and len(triples) == len(output_ids):
        logprobs = [float(t[0]) if t and t[0] is not None else 0.0 for t in triples]
    finish = meta.get("finish_reason") or {}
    kind = finish_kind(finish.get("type", "stop") if isinstance(finish, dict) else "stop")
    matched = finish.get("matched") if isinstance(finish, dict) and kind == "stop" else None
    return Generation(
        output_ids=output_ids,
        logprobs=logprobs,
        finish=kind,
        matched=matched,
        cached_tokens=int(meta.get("cached_tokens") or 0),
    )
