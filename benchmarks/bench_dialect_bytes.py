"""Cassette bytes per token in every engine dialect, against SGLang's /generate for the same traffic (issue #31,
point 2: within 2x).

The traffic is `bench_recorder.py`'s (b): a 40-turn coding-agent session growing to ~150k prompt tokens, both legs
and the finish's sample. Its engine calls are then restated in each dialect as the engine would send and answer
them: `vllm-openai` chat with messages in (the whole chat history every call, prompt ids returned at the root,
`token_id:N` logprobs, Qwen Code's tool list), streamed and not; `vllm-openai` completions with an id prompt;
`sglang-openai` with `input_ids` and `return_meta_info`; `vllm-generate`. Bytes are divided by the prompt tokens
sent over the session.

Run: .venv/bin/python benchmarks/bench_dialect_bytes.py
Last line: worst ratio to /generate: <R>x (<dialect>)
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_recorder import build_session, write_cassette  # noqa: E402

from tito_rl.cassette.format.records import (
    EngineRecord,  # noqa: E402
)
from tito_rl.cassette.reader import CassetteReader  # noqa: E402
from tito_rl.trajectory.adapters.tap import EngineExchange  # noqa: E402
from tito_rl.trajectory.dialects.registry import record_view  # noqa: E402
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer  # noqa: E402

GOAL = 2.0
# Qwen Code's own tool list (~37 kB), sent with every chat call as agents do: a messages-in cassette that stored
# it whole per call would pass on a synthetic body without tools and fail on real traffic.
QWEN_CAPTURE = Path(__file__).resolve().parents[1] / "tests" / "captures" / "qwen" / "bodies" / "qwen_001.json"
TOOLS = json.loads(QWEN_CAPTURE.read_bytes()).get("tools", []) if QWEN_CAPTURE.exists() else []


def chat_messages(turn: int, tool_texts: list[str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the bug."},
    ]
    for i in range(turn):
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call_{i:04d}",
                        "type": "function",
                        "function": {"name": "Read", "arguments": f'{{"file_path": "/repo/src/module_{i}.py"}}'},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i:04d}", "content": tool_texts[i]})
    return messages


def restated(
    dialect: str, stream: bool, engine: list[EngineExchange], tool_texts: list[str], tokenizer: Any
) -> list[EngineExchange]:
    out = []
    for turn, call in enumerate(engine):
        prompt, output = call.request["input_ids"], call.response["output_ids"]
        lps = [t[0] for t in call.response["meta_info"]["output_token_logprobs"]]
        sampling = {"max_tokens": 32000, "temperature": 1.0, "skip_special_tokens": False}
        if dialect == "vllm-generate":
            request = {"token_ids": prompt, "sampling_params": sampling}
            response: Any = {
                "choices": [
                    {
                        "index": 0,
                        "token_ids": output,
                        "finish_reason": "stop",
                        "logprobs": {"content": [{"logprob": lp} for lp in lps]},
                    }
                ]
            }
            path = "/inference/v1/generate"
        elif dialect == "sglang-openai":
            request = {
                "model": "m",
                "messages": chat_messages(turn, tool_texts),
                "tools": TOOLS,
                "input_ids": prompt,
                "return_meta_info": True,
                "return_prompt_token_ids": True,
                "return_token_ids": True,
                "no_stop_trim": True,
                "logprobs": True,
                **sampling,
            }
            response = {
                "id": f"x{turn}",
                "object": "chat.completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": tokenizer.decode(output[:-1])},
                        "finish_reason": "stop",
                        "prompt_token_ids": prompt,
                        "token_ids": output,
                        "meta_info": {
                            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, output, strict=True)]
                        },
                    }
                ],
            }
            path = "/v1/chat/completions"
        elif dialect == "vllm-completions":
            request = {"model": "m", "prompt": prompt, "logprobs": 0, "return_token_ids": True, **sampling}
            response = {
                "id": f"cmpl-{turn}",
                "object": "text_completion",
                "created": 1,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "text": tokenizer.decode(output[:-1]),
                        "prompt_token_ids": prompt,
                        "token_ids": output,
                        "logprobs": {"token_logprobs": lps, "tokens": [f"token_id:{t}" for t in output]},
                        "finish_reason": "stop",
                    }
                ],
            }
            path = "/v1/completions"
        else:
            request = {
                "model": "m",
                "messages": chat_messages(turn, tool_texts),
                "tools": TOOLS,
                "logprobs": True,
                "return_token_ids": True,
                "return_tokens_as_token_ids": True,
                "stream": stream,
                **sampling,
            }
            entries = [
                {
                    "token": f"token_id:{t}",
                    "logprob": lp,
                    "bytes": list(tokenizer.decode([t]).encode()),
                    "top_logprobs": [],
                }
                for t, lp in zip(output, lps, strict=True)
            ]
            if stream:
                response = [
                    {
                        "id": f"chatcmpl-{turn}",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": "m",
                        "prompt_token_ids": prompt,
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": ""},
                                "token_ids": [],
                                "finish_reason": None,
                            }
                        ],
                    }
                ]
                for i, (t, entry) in enumerate(zip(output, entries, strict=True)):
                    last = i == len(output) - 1
                    response.append(
                        {
                            "id": f"chatcmpl-{turn}",
                            "object": "chat.completion.chunk",
                            "created": 1,
                            "model": "m",
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {} if last else {"content": tokenizer.decode([t])},
                                    "logprobs": {"content": [entry]},
                                    "token_ids": [t],
                                    "finish_reason": "stop" if last else None,
                                }
                            ],
                        }
                    )
            else:
                response = {
                    "id": f"chatcmpl-{turn}",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "m",
                    "prompt_token_ids": prompt,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": tokenizer.decode(output[:-1])},
                            "logprobs": {"content": entries},
                            "finish_reason": "stop",
                            "token_ids": output,
                        }
                    ],
                }
            path = "/v1/chat/completions"
        name = "vllm-openai" if dialect == "vllm-completions" else dialect
        out.append(
            EngineExchange(
                "POST",
                path,
                request,
                200,
                response,
                headers={},
                started_s=call.started_s,
                duration_s=call.duration_s,
                dialect=name,
            )
        )
    return out


def main() -> int:
    tokenizer = load_tokenizer(None)
    events, sample = build_session(tokenizer)
    engine = [e for k, e in events if k == "engine"]
    prompt_tokens = sum(len(e.request["input_ids"]) for e in engine)
    # The tool results the prompts grew by, as text for the chat histories.
    tool_texts = [
        tokenizer.decode(
            engine[i + 1].request["input_ids"][
                len(engine[i].request["input_ids"]) + len(engine[i].response["output_ids"]) :
            ]
        )
        for i in range(len(engine) - 1)
    ]
    base = len(write_cassette(events, sample)) / prompt_tokens
    print(f"sglang /generate: {base:.3f} bytes/prompt token ({prompt_tokens} prompt tokens over {len(engine)} calls)")
    worst, worst_name = 0.0, ""
    for dialect, stream in (
        ("vllm-openai", False),
        ("vllm-openai", True),
        ("vllm-completions", False),
        ("sglang-openai", False),
        ("vllm-generate", False),
    ):
        calls = iter(restated(dialect, stream, engine, tool_texts, tokenizer))
        data = write_cassette([(k, next(calls) if k == "engine" else e) for k, e in events], sample)
        with CassetteReader(io.BytesIO(data)) as reader:  # read back whole: the size is not bought with loss
            views = [record_view(r) for r in reader.records() if isinstance(r, EngineRecord)]
        assert [v.prompt_ids for v in views] == [e.request["input_ids"] for e in engine], dialect
        assert [v.output_ids for v in views] == [e.response["output_ids"] for e in engine], dialect
        ratio = len(data) / prompt_tokens / base
        label = f"{dialect}{' streamed' if stream else ''}"
        print(f"{label}: {len(data) / prompt_tokens:.3f} bytes/prompt token, {ratio:.2f}x /generate")
        if ratio > worst:
            worst, worst_name = ratio, label
    print(f"worst ratio to /generate: {worst:.2f}x ({worst_name}); goal <= {GOAL:.1f}x")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
