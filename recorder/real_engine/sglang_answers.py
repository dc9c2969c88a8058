"""`make real-sglang-answers`: the real SGLang's tiny MoE answering with its expert routes, recorded and committed.

The fake engine's routes are tito's reading of SGLang's source; these answers are what SGLang 0.5.23 itself sends,
for a later change to hold the fake engine's to (shape, encoding, `routed_experts_start_len`, the stream's chunks,
the OpenAI route's `sgl_ext`). The requests go through tito's engine tap in front of the MoE model (started with
`--enable-return-routed-experts` and a fixed `--random-seed`), as the engine contract's do, and are written as a
contract recording: `recorder/engine_contract/answers/sglang-0.5.23-routes.json`. Greedy decoding of the same seeded
weights repeats, so a re-recording gives the same ids and routes (tests/test_real_sglang.py checks that, live).

    python -m tito_rl.recorder.real_engine.sglang_answers            # starts the MoE model, writes the file
    python -m tito_rl.recorder.real_engine.sglang_answers --url URL  # an SGLang already serving that model
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from tito_rl.recorder.engine_contract.answers import Recording, answers_path
from tito_rl.recorder.engine_contract.exchange import Unreachable
from tito_rl.recorder.engine_contract.generated import all_requests, route_field_requests
from tito_rl.recorder.engine_contract.requests import MODEL, ContractRequest
from tito_rl.recorder.engine_contract.runner import base_values, record_live, served_model
from tito_rl.recorder.real_engine.server import RealEngineError
from tito_rl.recorder.real_engine.sglang_paths import (
    BASE_FLAGS,
    PARSER_FLAGS,
    ROUTED_EXPERTS_FLAG,
    SGLANG_VERSION,
    SglangStart,
)
from tito_rl.recorder.real_engine.sglang_server import RealSglangServer
from tito_rl.trajectory.dialects.view import SGLANG, SGLANG_OPENAI
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

ROUTES = "routes"  # the recording's one start mode: the MoE model with --enable-return-routed-experts
ROUTES_VERSION = f"{SGLANG_VERSION}-routes"  # answers/sglang-0.5.23-routes.json
RANDOM_SEED = 7
ROUTES_START = SglangStart(moe=True, random_seed=RANDOM_SEED)
NEW_TOKENS = 5
LONGER = "$longer_prompt_ids"  # the prompt and more: its first rows route as the prompt's do
MORE_TEXT = " and the capital of Spain is"


def _generate(**extra: Any) -> dict[str, Any]:
    return {
        "input_ids": "$prompt_ids",
        "return_logprob": True,
        "return_routed_experts": True,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0},
    } | extra


KEPT_SET = {
    "max_new_tokens": NEW_TOKENS,
    "temperature": 0,
    "top_p": 0.9,
    "custom_params": {"return_top_p_token_ids": True},
}


def route_requests() -> list[ContractRequest]:
    """What a trainer asks of a MoE engine for routing replay, and the edges: a start offset, a longer prompt that
    shares a prefix, a stream, a request that does not ask, and the OpenAI route; then the top-p kept set as slime
    asks for it (`custom_params.return_top_p_token_ids`, which its patched SGLang answers), and the field's
    requests recorded around an MoE engine (`generated.route_field_requests`: slime's adapters)."""
    r = ContractRequest
    kept = _generate(routed_experts_start_len=3, sampling_params=KEPT_SET)
    return [
        r("generate routes", ROUTES, "POST", "/generate", _generate(), dialect=SGLANG),
        r("generate routes from 3", ROUTES, "POST", "/generate", _generate(routed_experts_start_len=3), dialect=SGLANG),
        r("generate routes longer prompt", ROUTES, "POST", "/generate", _generate(input_ids=LONGER), dialect=SGLANG),
        r("generate routes sse", ROUTES, "POST", "/generate", _generate(stream=True), dialect=SGLANG),
        r(
            "generate routes not asked",
            ROUTES,
            "POST",
            "/generate",
            {k: v for k, v in _generate().items() if k != "return_routed_experts"},
            dialect=SGLANG,
        ),
        r(
            "chat routes",
            ROUTES,
            "POST",
            "/v1/chat/completions",
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "Say hello in one word."}],
                "max_tokens": NEW_TOKENS,
                "temperature": 0,
                "return_routed_experts": True,
            },
            dialect=SGLANG_OPENAI,
        ),
        r("generate routes kept set", ROUTES, "POST", "/generate", kept, dialect=SGLANG),
        r("generate routes kept set sse", ROUTES, "POST", "/generate", kept | {"stream": True}, dialect=SGLANG),
        *route_field_requests(),
    ]


def record(url: str, progress: Callable[[str], None] = lambda line: None) -> Recording:
    """The route requests sent to the SGLang at `url` through tito's engine tap."""
    tokenizer = load_tokenizer()
    values = base_values(tokenizer, *served_model(url))
    values.pop("$long_prompt_ids")  # no over-long request here: 8,000 ids the file need not hold
    values[LONGER] = values["$prompt_ids"] + list(tokenizer.encode(MORE_TEXT, add_special_tokens=False))
    flags = [*BASE_FLAGS, "--random-seed", str(RANDOM_SEED), ROUTED_EXPERTS_FLAG]
    recording = Recording(engine=SGLANG, version=ROUTES_VERSION, start_flags={ROUTES: flags}, values=values)
    recording.exchanges = record_live(url, route_requests(), values, progress, SGLANG_OPENAI)
    return recording


CONTRACT_START = SglangStart(parsers=True, random_seed=RANDOM_SEED)


def record_contract(url: str, progress: Callable[[str], None] = lambda line: None) -> Recording:
    """The engine contract's SGLang requests (`generated.all_requests`: the listed ones, the field's, the options
    in combination) sent to the dense model at `url`, started as CONTRACT_START, through tito's engine tap."""
    values = base_values(load_tokenizer(), *served_model(url))
    flags = [*BASE_FLAGS, "--random-seed", str(RANDOM_SEED), *PARSER_FLAGS]
    recording = Recording(engine=SGLANG, version=SGLANG_VERSION, start_flags={SGLANG: flags}, values=values)
    recording.exchanges = record_live(url, all_requests(SGLANG), values, progress, SGLANG_OPENAI)
    return recording


def say(line: str) -> None:
    print(f"real-sglang-answers: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.recorder.real_engine.sglang_answers",
        description="Record the real SGLang's tiny MoE answering with its expert routes.",
    )
    parser.add_argument("--url", default=None, help="an SGLang serving the model (default: start it)")
    parser.add_argument(
        "--contract",
        action="store_true",
        help="the engine contract's SGLang requests to the dense model instead (answers/sglang-0.5.23.json)",
    )
    parser.add_argument("--out", default=None, help="default: answers/sglang-0.5.23-routes.json (or -0.5.23.json)")
    args = parser.parse_args(argv)
    recorder, start = (record_contract, CONTRACT_START) if args.contract else (record, ROUTES_START)
    out = args.out or str(answers_path(SGLANG, SGLANG_VERSION if args.contract else ROUTES_VERSION))
    try:
        if args.url:
            recording = recorder(args.url, say)
        else:
            with RealSglangServer(start) as server:
                recording = recorder(server.url, say)
    except (RealEngineError, Unreachable, ValueError) as error:
        print(f"real-sglang-answers: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    # The contract asks for errors on purpose (an empty prompt, bad bodies, unknown routes): any status there.
    bad = [] if args.contract else [e.request.name for e in recording.exchanges if e.answer.status != 200]
    if bad:
        print(f"real-sglang-answers: not answered 200: {', '.join(bad)}", file=sys.stderr)
        return 1
    with open(out, "w", encoding="utf-8") as handle:
        handle.write(recording.to_json())
    say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
