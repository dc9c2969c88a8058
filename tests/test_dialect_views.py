"""Each engine dialect read into its `EngineView`, from bodies shaped exactly as the engines' source writes them
(`docs/engine-dialects.md`, `trajectory/dialects/fields.py`): vLLM's `token_id:N` logprob tokens and empty-delta
chunks for the tokens a parser swallows, SGLang's `meta_info.output_token_logprobs` triples and
`response_token_ids`, prime-rl's `/v1/chat/completions/tokens`. The last tests check that every response field the
view reads (a `fields.py` row with `view`) is in at least one body here and reaches the view."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.channel_support import LAYERS, TOP_K, b64_int32, b64_npy, expert_rows
from tito_rl.trajectory.dialects.fields import FIELDS, Field
from tito_rl.trajectory.dialects.openai_compat import logprob_token_ids
from tito_rl.trajectory.dialects.registry import detect_dialect, endpoint_of, view_of
from tito_rl.trajectory.dialects.sglang import generate_view
from tito_rl.trajectory.dialects.streams import merged_chunks
from tito_rl.trajectory.dialects.view import DIALECTS, SGLANG, SGLANG_OPENAI, VLLM_GENERATE, VLLM_OPENAI

MODEL = "Qwen/Qwen3-8B"
# A Qwen3 prompt (system, user, generation prompt) and an answer that thinks, then calls a tool:
# <think>\nThe user wants a listing.\n</think>\n\n<tool_call>\n{...}\n</tool_call><|im_end|>
PROMPT = [
    151644,
    8948,
    198,
    2610,
    525,
    264,
    10950,
    17847,
    13,
    151645,
    198,
    151644,
    872,
    198,
    852,
    279,
    3542,
    13,
    151645,
    198,
    151644,
    77091,
    198,
]
THINK, END_THINK, TOOL, END_TOOL, EOS = 151667, 151668, 151657, 151658, 151645
REASONING_IDS = [198, 785, 1196, 6801, 264, 14838, 13, 198]
CALL_IDS = [198, 4913, 606, 788, 330, 41882, 497, 198]
OUTPUT = [THINK, *REASONING_IDS, END_THINK, 271, TOOL, *CALL_IDS, END_TOOL, EOS]
LOGPROBS = [round(-0.001 * (i + 1), 4) for i in range(len(OUTPUT))]
REASONING = "\nThe user wants a listing.\n"
ARGUMENTS = '{"command": "ls"}'
CALL = {"id": "chatcmpl-tool-9f1c2e", "type": "function", "function": {"name": "Bash", "arguments": ARGUMENTS}}
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "List the files."},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
USAGE = {
    "prompt_tokens": len(PROMPT),
    "total_tokens": len(PROMPT) + len(OUTPUT),
    "completion_tokens": len(OUTPUT),
    "prompt_tokens_details": None,
}


def text_of(token: int) -> str:
    """A stand-in decoding: what the test needs is one string per id."""
    return {
        THINK: "<think>",
        END_THINK: "</think>",
        TOOL: "<tool_call>",
        END_TOOL: "</tool_call>",
        EOS: "<|im_end|>",
        198: "\n",
        271: "\n\n",
    }.get(token, f"t{token}")


def vllm_entry(token: int, logprob: float, as_ids: bool = True) -> dict[str, Any]:
    """One `ChatCompletionLogProbsContent`: with `return_tokens_as_token_ids` the token is `token_id:N` and the
    bytes are still the decoded text's (`_create_chat_logprobs`)."""
    decoded = text_of(token)
    return {
        "token": f"token_id:{token}" if as_ids else decoded,
        "logprob": logprob,
        "bytes": list(decoded.encode()),
        "top_logprobs": [],
    }


def chat_logprobs(ids: list[int], lps: list[float], as_ids: bool = True) -> dict[str, Any]:
    return {"content": [vllm_entry(t, lp, as_ids) for t, lp in zip(ids, lps, strict=True)]}


def slices(ids: list[int]) -> list[float]:
    return [LOGPROBS[OUTPUT.index(t)] if t in (THINK, END_THINK, TOOL, END_TOOL, EOS) else -0.01 for t in ids]


@dataclass(frozen=True)
class Case:
    """One recorded engine call and what its view must read."""

    name: str
    dialect: str
    path: str
    request: dict[str, Any]
    response: Any
    expect: dict[str, Any] = field(default_factory=dict)


# --- sglang: POST /generate (shared/notes/sglang-http.md) -------------------------------------------------------
SGLANG_GENERATE_BODY = {
    "text": "Let me list the files.",
    "output_ids": OUTPUT,
    "meta_info": {
        "id": "a" * 32,
        "finish_reason": {"type": "stop", "matched": EOS},
        "prompt_tokens": len(PROMPT),
        "weight_version": "default",
        "input_token_logprobs": [],
        "output_token_logprobs": [[lp, t, None] for t, lp in zip(OUTPUT, LOGPROBS, strict=True)],
        "completion_tokens": len(OUTPUT),
        "cached_tokens": 0,
    },
}
SGLANG_GENERATE_REQUEST = {
    "rid": "a" * 32,
    "input_ids": PROMPT,
    "return_logprob": True,
    "sampling_params": {
        "max_new_tokens": 512,
        "temperature": 1.0,
        "top_p": 1.0,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    },
}

# --- sglang-openai: SGLang's /v1/chat/completions (0.5.23 serving_chat._build_chat_response) -------------------
SGLANG_CHAT_REQUEST = {
    "model": MODEL,
    "messages": MESSAGES,
    "tools": TOOLS,
    "input_ids": PROMPT,
    "logprobs": True,
    "return_meta_info": True,
    "return_prompt_token_ids": True,
    "return_token_ids": True,
    "no_stop_trim": True,
    "max_completion_tokens": 512,
    "temperature": 1.0,
    "skip_special_tokens": False,
}


def sglang_meta() -> dict[str, Any]:
    """The meta_info a chat choice carries with `return_meta_info`: /generate's, with text in each triple (the chat
    server asks for `return_text_in_logprobs`)."""
    return {
        "id": "b" * 32,
        "finish_reason": {"type": "stop", "matched": EOS},
        "prompt_tokens": len(PROMPT),
        "weight_version": "default",
        "completion_tokens": len(OUTPUT),
        "cached_tokens": 0,
        "output_token_logprobs": [[lp, t, text_of(t)] for t, lp in zip(OUTPUT, LOGPROBS, strict=True)],
    }


def sglang_chat_body(
    ids_key: str | None = "response_token_ids",
    meta: bool = True,
    prompt: bool = True,
    sglext: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": {
            "role": "assistant",
            "content": "",
            "reasoning_content": REASONING,
            "tool_calls": [
                {
                    "id": "call_5b1a",
                    "index": 0,
                    "type": "function",
                    "function": {"name": "Bash", "arguments": ARGUMENTS},
                }
            ],
        },
        "logprobs": chat_logprobs(OUTPUT, LOGPROBS, as_ids=False),
        "finish_reason": "tool_calls",
        "matched_stop": EOS,
    }
    if prompt:
        choice["prompt_token_ids"] = PROMPT
    if ids_key:
        choice[ids_key] = OUTPUT
    if meta:
        choice["meta_info"] = sglang_meta()
    body = {
        "id": "b" * 32,
        "object": "chat.completion",
        "created": 1764000000,
        "model": MODEL,
        "choices": [choice],
        "usage": USAGE,
        "metadata": {"weight_version": "default"},
    }
    if sglext is not None:
        body["sglext"] = sglext
    return body


def sglang_chat_chunks() -> list[dict[str, Any]]:
    """A streamed SGLang chat answer: no ids, no meta_info (both refused with stream), `matched_stop` on every
    choice, tool calls parsed into fragments."""

    def chunk(delta: dict[str, Any], finish: str | None = None, matched: int | None = None) -> dict[str, Any]:
        return {
            "id": "c" * 32,
            "object": "chat.completion.chunk",
            "created": 1764000000,
            "model": MODEL,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
            ],
        }

    return [
        chunk({"role": "assistant", "content": ""}),
        chunk({"role": None, "content": None, "reasoning_content": REASONING[:9]}),
        chunk({"role": None, "content": None, "reasoning_content": REASONING[9:]}),
        chunk(
            {
                "role": None,
                "content": None,
                "reasoning_content": None,
                "tool_calls": [
                    {"id": "call_5b1a", "index": 0, "type": "function", "function": {"name": "Bash", "arguments": ""}}
                ],
            }
        ),
        chunk(
            {
                "role": None,
                "content": None,
                "reasoning_content": None,
                "tool_calls": [
                    {"id": None, "index": 0, "type": "function", "function": {"name": None, "arguments": ARGUMENTS}}
                ],
            }
        ),
        chunk({"role": None, "content": None, "reasoning_content": None}, "tool_calls", EOS),
    ]


# --- sglang-openai: SGLang's /v1/completions with return_token_ids (0.5.17+) --------------------------------------
SGLANG_COMPLETION_REQUEST = {
    "model": MODEL,
    "prompt": PROMPT,
    "max_tokens": 512,
    "temperature": 1.0,
    "logprobs": 0,
    "return_token_ids": True,
    "no_stop_trim": True,
}


def sglang_completion_body() -> dict[str, Any]:
    return {
        "id": "d" * 32,
        "object": "text_completion",
        "created": 1764000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "text": "".join(text_of(t) for t in OUTPUT),
                "logprobs": {
                    "text_offset": list(range(len(OUTPUT))),
                    "token_logprobs": LOGPROBS,
                    "tokens": [text_of(t) for t in OUTPUT],
                    "top_logprobs": [None] * len(OUTPUT),
                },
                "finish_reason": "stop",
                "matched_stop": EOS,
                "token_ids": OUTPUT,
                "prompt_token_ids": PROMPT,
            }
        ],
        "usage": USAGE,
    }


def sglang_completion_chunks() -> list[dict[str, Any]]:
    """Streamed: `token_ids` a delta on each chunk, `prompt_token_ids` on the first (serving_completions)."""
    parts = [OUTPUT[:5], OUTPUT[5:12], OUTPUT[12:]]
    chunks = []
    for i, part in enumerate(parts):
        lps = LOGPROBS[len(sum(parts[:i], [])) :][: len(part)]
        choice = {
            "index": 0,
            "text": "".join(text_of(t) for t in part),
            "logprobs": {
                "text_offset": [0] * len(part),
                "token_logprobs": lps,
                "tokens": [text_of(t) for t in part],
                "top_logprobs": [None] * len(part),
            },
            "finish_reason": "stop" if i == 2 else None,
            "matched_stop": EOS if i == 2 else None,
            "token_ids": part,
        }
        if i == 0:
            choice["prompt_token_ids"] = PROMPT
        chunks.append(
            {
                "id": "e" * 32,
                "object": "text_completion",
                "created": 1764000000,
                "model": MODEL,
                "choices": [choice],
                "usage": None,
            }
        )
    return chunks


# --- vllm-openai: vLLM's /v1/chat/completions (messages in) -----------------------------------------------------
VLLM_CHAT_REQUEST = {
    "model": MODEL,
    "messages": MESSAGES,
    "tools": TOOLS,
    "tool_choice": "auto",
    "logprobs": True,
    "top_logprobs": 0,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "max_tokens": 512,
    "temperature": 1.0,
    "top_p": 1.0,
    "skip_special_tokens": False,
}


def vllm_chat_text_logprobs() -> dict[str, Any]:
    """A vLLM chat answer with neither `return_token_ids` nor `return_tokens_as_token_ids`: its logprobs name text."""
    body = vllm_chat_body(token_ids=False)
    body["choices"][0]["logprobs"] = chat_logprobs(OUTPUT, LOGPROBS, as_ids=False)
    return body


def vllm_chat_body(
    reasoning_keys: tuple[str, ...] = ("reasoning",), token_ids: bool = True, content: str | None = None
) -> dict[str, Any]:
    """`ChatCompletionResponse.model_dump()` (every field, nulls included) as 0.33 writes it; `reasoning_keys` picks
    the era: ("reasoning_content",) up to 0.11.0, both 0.11.1-0.15.1, ("reasoning",) from 0.16."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [CALL],
    }
    for key in reasoning_keys:
        message[key] = REASONING
    return {
        "id": "chatcmpl-5e0c",
        "object": "chat.completion",
        "created": 1764000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": chat_logprobs(OUTPUT, LOGPROBS),
                "finish_reason": "tool_calls",
                "stop_reason": None,
                "token_ids": OUTPUT if token_ids else None,
                "routed_experts": None,
                "weight_versions": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": USAGE,
        "prompt_logprobs": None,
        "prompt_token_ids": PROMPT if token_ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def vllm_chat_chunks(reasoning_key: str = "reasoning", n: int = 1) -> list[dict[str, Any]]:
    """A streamed vLLM chat answer, each chunk `model_dump_json(exclude_unset=True)` (0.33
    `chat_completion_stream_generator`): role chunk with the prompt ids, then one chunk per engine step; the
    steps a parser swallows (<think>, </think>, <tool_call>, </tool_call>) come as `delta: {}` with their ids
    (return_token_ids, 0.13+); the finish on the last choice chunk; `include_usage` adds a `choices: []` chunk."""
    head = {"id": "chatcmpl-77aa", "object": "chat.completion.chunk", "created": 1764000000, "model": MODEL}

    def step(ids: list[int], delta: dict[str, Any], finish: str | None = None, index: int = 0) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": index,
            "delta": delta,
            "logprobs": chat_logprobs(ids, slices(ids)),
            "finish_reason": finish,
            "token_ids": ids,
        }
        if finish is not None:
            choice["stop_reason"] = None
            choice["weight_versions"] = None
        return {**head, "choices": [choice], "kv_transfer_params": None}

    chunks = [
        {
            **head,
            "choices": [
                {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            ],
            "prompt_token_ids": PROMPT,
            "prompt_text": None,
        }
        for i in range(n)
    ]
    chunks += [
        step([THINK], {}),
        step(REASONING_IDS[:4], {reasoning_key: REASONING[:9]}),
        step(REASONING_IDS[4:], {reasoning_key: REASONING[9:]}),
        step([END_THINK], {}),
        step([271], {"content": "\n\n"}),
        step([TOOL], {}),
        step(
            CALL_IDS[:4],
            {"tool_calls": [{"id": CALL["id"], "type": "function", "index": 0, "function": {"name": "Bash"}}]},
        ),
        step(CALL_IDS[4:], {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS}}]}),
        step([END_TOOL], {}),
    ]
    if n > 1:  # the second choice's steps, interleaved: never merged into choice 0
        chunks.insert(3, step([1, 2, 3], {"content": "other"}, index=1))
    chunks.append(step([EOS], {}, "tool_calls"))
    chunks.append({**head, "choices": [], "usage": USAGE})
    return chunks


# --- vllm-openai: vLLM's /v1/completions with a token-id prompt --------------------------------------------------
VLLM_COMPLETION_REQUEST = {
    "model": MODEL,
    "prompt": PROMPT,
    "max_tokens": 512,
    "temperature": 1.0,
    "logprobs": 0,
    "return_token_ids": True,
    "return_tokens_as_token_ids": True,
    "add_special_tokens": False,
}


def vllm_completion_logprobs(ids: list[int], lps: list[float]) -> dict[str, Any]:
    return {
        "text_offset": list(range(len(ids))),
        "token_logprobs": lps,
        "tokens": [f"token_id:{t}" for t in ids],
        "top_logprobs": [{f"token_id:{t}": lp} for t, lp in zip(ids, lps, strict=True)],
    }


def vllm_completion_body() -> dict[str, Any]:
    return {
        "id": "cmpl-1a2b",
        "object": "text_completion",
        "created": 1764000000,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "text": "".join(text_of(t) for t in OUTPUT[:-1]),
                "logprobs": vllm_completion_logprobs(OUTPUT, LOGPROBS),
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": OUTPUT,
                "prompt_logprobs": None,
                "prompt_token_ids": PROMPT,
                "routed_experts": None,
                "weight_versions": None,
            }
        ],
        "service_tier": None,
        "system_fingerprint": None,
        "usage": USAGE,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def vllm_completion_chunks() -> list[dict[str, Any]]:
    """Streamed completions: the prompt ids on each choice's first chunk, every chunk's `token_ids` a delta."""
    parts = [OUTPUT[:6], OUTPUT[6:13], OUTPUT[13:]]
    chunks, done = [], 0
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        chunks.append(
            {
                "id": "cmpl-3c4d",
                "object": "text_completion",
                "created": 1764000000,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "text": "".join(text_of(t) for t in part if t != EOS),
                        "logprobs": vllm_completion_logprobs(part, LOGPROBS[done : done + len(part)]),
                        "finish_reason": "stop" if last else None,
                        "stop_reason": None,
                        "prompt_token_ids": PROMPT if i == 0 else None,
                        "token_ids": part,
                        "weight_versions": None,
                    }
                ],
                "kv_transfer_params": None,
            }
        )
        done += len(part)
    return chunks


# --- vllm-generate: vLLM's /inference/v1/generate ------------------------------------------------------------------
VLLM_TOKENS_REQUEST = {
    "model": MODEL,
    "token_ids": PROMPT,
    "return_token_ids": True,
    "sampling_params": {
        "max_tokens": 512,
        "temperature": 1.0,
        "top_p": 1.0,
        "logprobs": 0,
        "skip_special_tokens": False,
    },
}


def tokens_body_old() -> dict[str, Any]:
    """0.11.1-0.31: `GenerateResponse.model_dump()`, logprob tokens `token_id:N` (`_create_tokens_logprobs`)."""
    return {
        "request_id": "f" * 32,
        "choices": [
            {
                "index": 0,
                "logprobs": {
                    "content": [
                        {
                            "token": f"token_id:{t}",
                            "logprob": lp,
                            "bytes": None,
                            "top_logprobs": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None}],
                        }
                        for t, lp in zip(OUTPUT, LOGPROBS, strict=True)
                    ]
                },
                "finish_reason": "stop",
                "token_ids": OUTPUT,
            }
        ],
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def tokens_body_new() -> dict[str, Any]:
    """0.32+: `GenerateTokensResponse.model_dump()`, integer `token_id` and `rank`, the prompt ids back with
    `return_token_ids` (0.30+), `stop_reason` on the choice."""
    return {
        "request_id": "f" * 32,
        "model": MODEL,
        "created": 1764000000,
        "usage": USAGE,
        "prompt_logprobs": None,
        "prompt_token_id_logprobs": None,
        "prompt_token_ids": PROMPT,
        "mm_placeholders": None,
        "metrics": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "output_mode": "tokens",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "stop_reason": None,
                "token_ids": OUTPUT,
                "routed_experts": None,
                "sampling_mask": None,
                "weight_versions": None,
                "logprobs": {
                    "content": [
                        {
                            "token_id": t,
                            "logprob": lp,
                            "rank": 1,
                            "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}],
                        }
                        for t, lp in zip(OUTPUT, LOGPROBS, strict=True)
                    ]
                },
            }
        ],
    }


def tokens_text_body() -> dict[str, Any]:
    """0.32+ `output_mode: "text"`: the detokenized text beside the ids, chat-shaped logprobs."""
    body = tokens_body_new()
    body["output_mode"] = "text"
    body["choices"][0].update(
        text="".join(text_of(t) for t in OUTPUT[:-1]), logprobs=chat_logprobs(OUTPUT, LOGPROBS, as_ids=False)
    )
    return body


def tokens_chunks() -> list[dict[str, Any]]:
    """0.33 `serve_tokens_stream_generator`: a chunk per step (empty steps skipped), the prompt ids on the first
    (return_token_ids), the finish on the last; `include_usage` adds a `choices: []` chunk."""
    parts, chunks, done = [OUTPUT[:1], OUTPUT[1:10], OUTPUT[10:]], [], 0
    for i, part in enumerate(parts):
        lps = LOGPROBS[done : done + len(part)]
        chunk: dict[str, Any] = {
            "request_id": "f" * 32,
            "usage": None,
            "output_mode": "tokens",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop" if i == 2 else None,
                    "stop_reason": None,
                    "token_ids": part,
                    "routed_experts": None,
                    "sampling_mask": None,
                    "weight_versions": None,
                    "logprobs": {
                        "content": [
                            {"token_id": t, "logprob": lp, "rank": 1, "top_logprobs": []}
                            for t, lp in zip(part, lps, strict=True)
                        ]
                    },
                }
            ],
        }
        if i == 0:
            chunk["prompt_token_ids"] = PROMPT
        chunks.append(chunk)
        done += len(part)
    chunks.append({"request_id": "f" * 32, "usage": USAGE, "output_mode": "tokens", "choices": []})
    return chunks


# --- vllm-generate: prime-rl's /v1/chat/completions/tokens (PR #1422): a vLLM chat request plus `tokens` ----------
PRIME_TOKENS_REQUEST = {**VLLM_CHAT_REQUEST, "tokens": PROMPT}
PRIME_TOKENS_REQUEST.pop("return_tokens_as_token_ids")

VIEW_OF_CALL = {  # the view every full answer above reads
    "prompt_ids": PROMPT,
    "output_ids": OUTPUT,
    "logprobs": LOGPROBS,
}

# The per-token channels (CHANNELS.md): routes from the request's start, kept sets, version spans.
ROUTES_START = 4
SGLANG_CHANNELS_REQUEST = {
    **SGLANG_GENERATE_REQUEST,
    "sampling_params": {**SGLANG_GENERATE_REQUEST["sampling_params"], "top_p": 0.9},  # type: ignore[dict-item]
    "return_routed_experts": True,
    "routed_experts_start_len": ROUTES_START,
}
SGLANG_CHANNELS_REQUEST["sampling_params"]["custom_params"] = {"return_top_p_token_ids": True}
SGLANG_CHANNELS_BODY = {
    **SGLANG_GENERATE_BODY,
    "meta_info": {
        **SGLANG_GENERATE_BODY["meta_info"],  # type: ignore[dict-item]
        "routed_experts": b64_int32(expert_rows(PROMPT + OUTPUT)[ROUTES_START:-1]),
        "top_p_token_ids": b64_int32(OUTPUT),
        "top_p_token_offsets": b64_int32(list(range(len(OUTPUT) + 1))),
        "weight_versions": [{"version": "default", "start": 0, "end": len(OUTPUT)}],
    },
}


def tokens_body_routed() -> dict[str, Any]:
    body = tokens_body_new()
    rows = expert_rows(PROMPT + OUTPUT)[:-1].reshape(-1, LAYERS, TOP_K).astype("uint8")
    body["choices"][0]["routed_experts"] = b64_npy(rows)
    body["choices"][0]["weight_versions"] = [{"version": "7", "start": 0, "end": len(OUTPUT)}]
    return body


CASES = [
    Case(
        "sglang /generate with channels",
        SGLANG,
        "/generate",
        SGLANG_CHANNELS_REQUEST,
        SGLANG_CHANNELS_BODY,
        {**VIEW_OF_CALL, "finish_reason": "stop", "routes_asked": True, "channel_error": ""},
    ),
    Case(
        "vllm-generate 0.32+ with routes",
        VLLM_GENERATE,
        "/inference/v1/generate",
        VLLM_TOKENS_REQUEST,
        tokens_body_routed(),
        {**VIEW_OF_CALL, "finish_reason": "stop", "channel_error": ""},
    ),
    Case(
        "sglang /generate",
        SGLANG,
        "/generate",
        SGLANG_GENERATE_REQUEST,
        SGLANG_GENERATE_BODY,
        {
            **VIEW_OF_CALL,
            "finish_reason": "stop",
            "text": "Let me list the files.",
            "sampling": {
                "max_tokens": 512,
                "temperature": 1.0,
                "top_p": 1.0,
                "skip_special_tokens": False,
                "no_stop_trim": True,
            },
        },
    ),
    Case(
        "sglang-openai chat 0.5.18+",
        SGLANG_OPENAI,
        "/v1/chat/completions",
        SGLANG_CHAT_REQUEST,
        sglang_chat_body(),
        {
            **VIEW_OF_CALL,
            "finish_reason": "tool_calls",
            "text": "",
            "reasoning": REASONING,
            "messages_in": False,
            "prompt_ids_asked": True,
            "sampling": {"max_tokens": 512, "temperature": 1.0, "no_stop_trim": True, "skip_special_tokens": False},
        },
    ),
    Case(
        "sglang-openai chat 0.5.17 token_ids",
        SGLANG_OPENAI,
        "/v1/chat/completions",
        SGLANG_CHAT_REQUEST,
        sglang_chat_body("token_ids"),
        {**VIEW_OF_CALL, "finish_reason": "tool_calls"},
    ),
    Case(
        "sglang-openai chat 0.5.13 prompt ids + meta_info only",
        SGLANG_OPENAI,
        "/v1/chat/completions",
        {k: v for k, v in SGLANG_CHAT_REQUEST.items() if k != "return_token_ids"},
        sglang_chat_body(None),
        {"prompt_ids": PROMPT, "output_ids": OUTPUT, "logprobs": LOGPROBS},
    ),  # the ids of meta_info's triples
    Case(
        "sglang-openai chat, messages in, sglext ids (0.5.20+)",
        SGLANG_OPENAI,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": MESSAGES,
            "logprobs": True,
            "return_input_ids_in_sglext": True,
            "return_output_ids_in_sglext": True,
        },
        sglang_chat_body(None, meta=False, prompt=False, sglext={"input_ids": PROMPT, "output_ids": [OUTPUT]}),
        {**VIEW_OF_CALL, "messages_in": True, "prompt_ids_asked": True},
    ),
    Case(
        "sglang-openai chat, messages in, known by matched_stop",
        SGLANG_OPENAI,
        "/v1/chat/completions",
        {"model": MODEL, "messages": MESSAGES, "logprobs": True},
        sglang_chat_body(None, meta=False, prompt=False),
        {
            "prompt_ids": None,
            "output_ids": None,
            "logprobs": LOGPROBS,
            "messages_in": True,
            "prompt_ids_asked": False,
            "reasoning": REASONING,
        },
    ),
    Case(
        "sglang-openai chat streamed",
        SGLANG_OPENAI,
        "/v1/chat/completions",
        {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "input_ids": PROMPT, "stream": True},
        sglang_chat_chunks(),
        {
            "prompt_ids": PROMPT,
            "output_ids": None,
            "logprobs": None,
            "finish_reason": "tool_calls",
            "reasoning": REASONING,
            "text": "",
            "stream": True,
            "tool_calls": [
                {"id": "call_5b1a", "type": "function", "function": {"name": "Bash", "arguments": ARGUMENTS}}
            ],
        },
    ),
    Case(
        "sglang-openai completions",
        SGLANG_OPENAI,
        "/v1/completions",
        SGLANG_COMPLETION_REQUEST,
        sglang_completion_body(),
        {**VIEW_OF_CALL, "finish_reason": "stop", "text": "".join(text_of(t) for t in OUTPUT)},
    ),
    Case(
        "sglang-openai completions streamed",
        SGLANG_OPENAI,
        "/v1/completions",
        {**SGLANG_COMPLETION_REQUEST, "stream": True},
        sglang_completion_chunks(),
        {**VIEW_OF_CALL, "finish_reason": "stop", "text": "".join(text_of(t) for t in OUTPUT)},
    ),
    Case(
        "vllm-openai chat 0.16+",
        VLLM_OPENAI,
        "/v1/chat/completions",
        VLLM_CHAT_REQUEST,
        vllm_chat_body(),
        {
            **VIEW_OF_CALL,
            "finish_reason": "tool_calls",
            "text": None,
            "reasoning": REASONING,
            "tool_calls": [CALL],
            "messages_in": True,
            "prompt_ids_asked": True,
            "sampling": {"max_tokens": 512, "temperature": 1.0, "top_p": 1.0, "skip_special_tokens": False},
        },
    ),
    Case(
        "vllm-openai chat 0.11.1-0.15.1",
        VLLM_OPENAI,
        "/v1/chat/completions",
        VLLM_CHAT_REQUEST,
        vllm_chat_body(("reasoning", "reasoning_content")),
        {**VIEW_OF_CALL, "reasoning": REASONING},
    ),
    Case(
        "vllm-openai chat 0.10.2-0.11.0",
        VLLM_OPENAI,
        "/v1/chat/completions",
        VLLM_CHAT_REQUEST,
        vllm_chat_body(("reasoning_content",)),
        {**VIEW_OF_CALL, "reasoning": REASONING},
    ),
    Case(
        "vllm-openai chat, a plain answer",
        VLLM_OPENAI,
        "/v1/chat/completions",
        VLLM_CHAT_REQUEST,
        vllm_chat_body((), content="Let me list the files."),
        {**VIEW_OF_CALL, "text": "Let me list the files.", "reasoning": None, "tool_calls": [CALL]},
    ),
    Case(  # NeMo Gym's call: the output named by the logprobs' `token_id:N` (the prompt by a `/tokenize` after it)
        "vllm-openai chat, ids not asked",
        VLLM_OPENAI,
        "/v1/chat/completions",
        {k: v for k, v in VLLM_CHAT_REQUEST.items() if k != "return_token_ids"},
        vllm_chat_body(token_ids=False),
        {
            "prompt_ids": None,
            "output_ids": OUTPUT,
            "logprobs": LOGPROBS,
            "messages_in": True,
            "prompt_ids_asked": False,
        },
    ),
    Case(
        "vllm-openai chat, no ids at all",
        VLLM_OPENAI,
        "/v1/chat/completions",
        {k: v for k, v in VLLM_CHAT_REQUEST.items() if k not in ("return_token_ids", "return_tokens_as_token_ids")},
        vllm_chat_text_logprobs(),
        {"prompt_ids": None, "output_ids": None, "logprobs": LOGPROBS, "messages_in": True, "prompt_ids_asked": False},
    ),
    Case(
        "vllm-openai chat streamed 0.33",
        VLLM_OPENAI,
        "/v1/chat/completions",
        {**VLLM_CHAT_REQUEST, "stream": True, "stream_options": {"include_usage": True}},
        vllm_chat_chunks(),
        {
            **VIEW_OF_CALL,
            "logprobs": slices(OUTPUT),
            "finish_reason": "tool_calls",
            "text": "\n\n",
            "reasoning": REASONING,
            "tool_calls": [CALL],
            "stream": True,
        },
    ),
    Case(
        "vllm-openai chat streamed <= 0.11.0",
        VLLM_OPENAI,
        "/v1/chat/completions",
        {**VLLM_CHAT_REQUEST, "stream": True},
        vllm_chat_chunks("reasoning_content"),
        {"output_ids": OUTPUT, "reasoning": REASONING},
    ),
    Case(
        "vllm-openai chat streamed n=2",
        VLLM_OPENAI,
        "/v1/chat/completions",
        {**VLLM_CHAT_REQUEST, "stream": True, "n": 2},
        vllm_chat_chunks(n=2),
        {"prompt_ids": PROMPT, "output_ids": OUTPUT, "text": "\n\n"},
    ),
    Case(
        "vllm-openai completions",
        VLLM_OPENAI,
        "/v1/completions",
        VLLM_COMPLETION_REQUEST,
        vllm_completion_body(),
        {
            **VIEW_OF_CALL,
            "finish_reason": "stop",
            "messages_in": False,
            "text": "".join(text_of(t) for t in OUTPUT[:-1]),
        },
    ),
    Case(
        "vllm-openai completions streamed",
        VLLM_OPENAI,
        "/v1/completions",
        {**VLLM_COMPLETION_REQUEST, "stream": True},
        vllm_completion_chunks(),
        {**VIEW_OF_CALL, "finish_reason": "stop"},
    ),
    Case(
        "vllm-generate 0.11.1-0.31",
        VLLM_GENERATE,
        "/inference/v1/generate",
        {k: v for k, v in VLLM_TOKENS_REQUEST.items() if k != "return_token_ids"},
        tokens_body_old(),
        {
            **VIEW_OF_CALL,
            "finish_reason": "stop",
            "prompt_ids_asked": True,
            "sampling": {
                "max_tokens": 512,
                "temperature": 1.0,
                "top_p": 1.0,
                "logprobs": 0,
                "skip_special_tokens": False,
            },
        },
    ),
    Case(
        "vllm-generate 0.32+",
        VLLM_GENERATE,
        "/inference/v1/generate",
        VLLM_TOKENS_REQUEST,
        tokens_body_new(),
        {**VIEW_OF_CALL, "finish_reason": "stop"},
    ),
    Case(
        "vllm-generate 0.32+ output_mode text",
        VLLM_GENERATE,
        "/inference/v1/generate",
        {**VLLM_TOKENS_REQUEST, "output_mode": "text"},
        tokens_text_body(),
        {**VIEW_OF_CALL, "text": "".join(text_of(t) for t in OUTPUT[:-1])},
    ),
    Case(
        "vllm-generate streamed 0.32+",
        VLLM_GENERATE,
        "/inference/v1/generate",
        {**VLLM_TOKENS_REQUEST, "stream": True},
        tokens_chunks(),
        {**VIEW_OF_CALL, "finish_reason": "stop", "stream": True},
    ),
    Case(
        "vllm-generate: prime-rl chat/completions/tokens",
        VLLM_GENERATE,
        "/v1/chat/completions/tokens",
        PRIME_TOKENS_REQUEST,
        vllm_chat_body(),
        {
            **VIEW_OF_CALL,
            "endpoint": "generate",
            "finish_reason": "tool_calls",
            "reasoning": REASONING,
            "tool_calls": [CALL],
            "messages_in": False,
        },
    ),
    Case(
        "vllm-generate: prime-rl chat/completions/tokens on vLLM <= 0.11.0",
        VLLM_GENERATE,
        "/v1/chat/completions/tokens",
        PRIME_TOKENS_REQUEST,
        vllm_chat_body(("reasoning_content",), content="Let me list the files."),
        {**VIEW_OF_CALL, "text": "Let me list the files.", "reasoning": REASONING},
    ),
    Case(
        "vllm-generate: prime-rl chat/completions/tokens streamed",
        VLLM_GENERATE,
        "/v1/chat/completions/tokens",
        {**PRIME_TOKENS_REQUEST, "stream": True},
        vllm_chat_chunks(),
        {**VIEW_OF_CALL, "logprobs": slices(OUTPUT), "text": "\n\n", "reasoning": REASONING, "tool_calls": [CALL]},
    ),
    Case(
        "vllm-generate: prime-rl chat/completions/tokens streamed, vLLM <= 0.11.0",
        VLLM_GENERATE,
        "/v1/chat/completions/tokens",
        {**PRIME_TOKENS_REQUEST, "stream": True},
        vllm_chat_chunks("reasoning_content"),
        {**VIEW_OF_CALL, "logprobs": slices(OUTPUT), "reasoning": REASONING},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_view_reads_each_dialect(case: Case) -> None:
    assert detect_dialect(case.path, case.request, case.response) == case.dialect
    view = view_of(None, case.path, case.request, case.response)
    assert view.dialect == case.dialect
    for name, expected in case.expect.items():
        assert getattr(view, name) == expected, name
    if view.output_ids is not None and view.logprobs is not None:
        assert len(view.logprobs) == len(view.output_ids)


def test_a_hint_wins_on_the_paths_both_engines_serve() -> None:
    body = vllm_chat_body()
    assert detect_dialect("/v1/chat/completions", VLLM_CHAT_REQUEST, body, hint=SGLANG_OPENAI) == SGLANG_OPENAI
    assert detect_dialect("/generate", SGLANG_GENERATE_REQUEST, None, hint=VLLM_OPENAI) == SGLANG


@pytest.mark.parametrize(
    "path,dialect,endpoint",
    [
        ("/abort_request", SGLANG, "abort"),
        ("/abort_requests", VLLM_GENERATE, "abort"),
        ("/inference/v1/abort_requests", VLLM_GENERATE, "abort"),
        ("/inference/v1/generate", VLLM_GENERATE, "generate"),
        ("/v1/chat/completions/tokens", VLLM_GENERATE, "generate"),
        ("/sessions/abc/v1/chat/completions?x=1", VLLM_OPENAI, "chat"),
    ],
)
def test_paths(path: str, dialect: str, endpoint: str) -> None:
    assert detect_dialect(path, {}, None) == dialect
    assert endpoint_of(path) == endpoint


def test_token_id_logprob_tokens_name_the_output_ids() -> None:
    """`return_tokens_as_token_ids`: chat entries' `token`, completion `tokens`, and 0.32's int `token_id`."""
    assert logprob_token_ids(vllm_chat_body()["choices"][0]) == OUTPUT
    assert logprob_token_ids(vllm_completion_body()["choices"][0]) == OUTPUT
    assert logprob_token_ids(tokens_body_old()["choices"][0]) == OUTPUT
    assert logprob_token_ids(tokens_body_new()["choices"][0]) == OUTPUT
    assert logprob_token_ids(sglang_chat_body()["choices"][0]) is None  # decoded text, not ids


def test_an_answer_aborted_before_its_first_token_has_no_output_ids_not_unknown_ones() -> None:
    body = vllm_chat_body()
    body["choices"][0].update(token_ids=[], finish_reason="abort", logprobs={"content": []})
    view = view_of(None, "/v1/chat/completions", VLLM_CHAT_REQUEST, body)
    assert view.output_ids == [] and view.finish_reason == "abort"


def test_streamed_control_token_chunks_carry_ids_and_an_empty_delta() -> None:
    """The empty-delta chunks hold ids the text never shows: dropping them (vLLM before 0.13) loses tokens."""
    chunks = vllm_chat_chunks()
    empty = [c for c in chunks if c["choices"] and c["choices"][0]["delta"] == {}]
    assert [c["choices"][0]["token_ids"] for c in empty] == [[THINK], [END_THINK], [TOOL], [END_TOOL], [EOS]]
    merged = merged_chunks(chunks)
    assert merged is not None and merged["choices"][0]["token_ids"] == OUTPUT
    assert merged["choices"][0]["finish_reason"] == "tool_calls"


# --- fields.py, against the bodies above ----------------------------------------------------------------------------
PLACES = {"root", "choice", "message", "delta", "meta_info", "sampling_params"}


def values_at(body: Any, path: str) -> list[Any]:
    """Every non-null value at `path` (`a.b[].c`: `[]` is each item) in a body or in any of its chunks."""
    items = body if isinstance(body, list) else [body]
    for part in path.split("."):
        key, many = (part[:-2], True) if part.endswith("[]") else (part, False)
        found: list[Any] = []
        for item in items:
            value = item.get(key) if isinstance(item, dict) else None
            if value is None:
                continue
            found.extend(value if many and isinstance(value, list) else [] if many else [value])
        items = found
    return items


def test_the_field_table_is_well_formed() -> None:
    keys = [(f.dialect, f.endpoint, f.direction, f.name) for f in FIELDS]
    assert len(keys) == len(set(keys))
    for f in FIELDS:
        assert f.dialect in DIALECTS and f.direction in ("request", "response") and f.place in PLACES, f
        assert f.since and f.source and f.streamed, f
        assert f.view in (
            "",
            "prompt_ids",
            "output_ids",
            "logprobs",
            "finish_reason",
            "sampling",
            "text",
            "reasoning",
            "tool_calls",
            "routes",
            "kept",
            "weight_versions",
        ), f
        if f.place == "delta":
            assert ".delta." in f.name, f
        if f.place == "message":
            assert ".message." in f.name, f
        if f.place == "meta_info":
            assert "meta_info." in f.name, f


def exercised(f: Field) -> list[Case]:
    """The cases of `f`'s dialect and endpoint whose body holds `f` and whose view reads something from it."""
    out = []
    for case in CASES:
        if case.dialect != f.dialect or case.path != f.endpoint:
            continue
        body = case.request if f.direction == "request" else case.response
        read = getattr(view_of(None, case.path, case.request, case.response), f.view)
        if values_at(body, f.name) and read is not None and read != {}:
            out.append(case)
    return out


@pytest.mark.parametrize("f", [f for f in FIELDS if f.view], ids=lambda f: f"{f.dialect} {f.endpoint} {f.name}")
def test_every_field_the_view_reads_is_exercised(f: Field) -> None:
    assert exercised(f), f"no case carries {f.name} into view.{f.view}"


def test_each_field_feeds_the_view_alone() -> None:
    """Removing a read response field from a body that holds only that source of the attribute empties it: the
    view reads the field named, not a neighbour."""
    body = vllm_chat_body(("reasoning_content",))
    assert view_of(None, "/v1/chat/completions", VLLM_CHAT_REQUEST, body).reasoning == REASONING
    del body["choices"][0]["message"]["reasoning_content"]
    assert view_of(None, "/v1/chat/completions", VLLM_CHAT_REQUEST, body).reasoning is None
    body = sglang_chat_body(meta=False)
    del body["choices"][0]["response_token_ids"]
    assert view_of(None, "/v1/chat/completions", SGLANG_CHAT_REQUEST, body).output_ids is None


_ENTRY = st.one_of(
    st.lists(st.one_of(st.floats(allow_nan=False), st.integers(), st.booleans(), st.none(), st.text()), max_size=3),
    st.tuples(st.floats(allow_nan=False), st.integers()),
    st.none(),
    st.integers(),
)


@given(st.lists(_ENTRY, max_size=6))
def test_sglang_logprob_entries_read_as_each_was_read_one_by_one(triples: list) -> None:
    """The view reads `output_token_logprobs` by the set of its entries' types first (a reply holds thousands):
    the same logprobs as reading each entry, empty entries, bools and non-numbers included."""
    expected = None
    if all(isinstance(t, list | tuple) and t for t in triples):
        expected = [t[0] if isinstance(t[0], int | float) else None for t in triples]
    view = generate_view({"input_ids": [1]}, {"output_ids": [2], "meta_info": {"output_token_logprobs": triples}})
    assert view.logprobs == expected
    assert [type(v) for v in view.logprobs or []] == [type(v) for v in expected or []]
