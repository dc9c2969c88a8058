"""Every engine field tito's dialects read or send, pinned to the engines' own source: the table of
`docs/engine-dialects.md` as data, so the tests and the fake engine can pin their bodies against the same rows.

`name` is a path from the body's root (`choices[].message.reasoning`; `[]` is every item). `place` says where the
engine puts it: root, choice, message, delta (a streamed choice's `delta`), meta_info (SGLang's), sampling_params
(inside the request's object). `streamed` says what a streamed answer does with it. `since` is the first release
that has it, with the pull request where known. `source` is the file (as of the newest release read, named in the
docs' sources) that defines or fills it. `view` names the `EngineView` attribute the normalizer fills from it;
empty where the view does not read it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tito_rl.trajectory.dialects.view import SGLANG, SGLANG_OPENAI, VLLM_GENERATE, VLLM_OPENAI


@dataclass(frozen=True)
class Field:
    """One field of one engine endpoint, as the engine's source defines it."""

    dialect: str
    endpoint: str  # the path the engine serves it on
    direction: str  # "request" or "response"
    name: str
    place: str  # root, choice, message, delta, meta_info, sampling_params
    streamed: str  # what a streamed answer does with it
    since: str
    source: str
    view: str = ""  # the EngineView attribute it feeds ("" when the view does not read it)


CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
GENERATE, TOKENS, CHAT_TOKENS = "/generate", "/inference/v1/generate", "/v1/chat/completions/tokens"
REQ, RESP = "request", "response"
ALL = "same when streamed"
NOT_STREAMED = "not streamed"

# Source files: vLLM 0.33.0 layout (0.14 and before: vllm/entrypoints/openai/protocol.py, serving_chat.py,
# serving_completion.py; /inference/v1/generate: openai/serving_tokens.py to 0.12, serve/disagg/ 0.13-0.22).
V_CHAT = "vllm/entrypoints/openai/chat_completion/protocol.py"
V_CHAT_SERVING = "vllm/entrypoints/openai/chat_completion/serving.py"
V_CMPL = "vllm/entrypoints/openai/completion/protocol.py"
V_CMPL_SERVING = "vllm/entrypoints/openai/completion/serving.py"
V_DELTA = "vllm/entrypoints/generate/base/protocol.py"
V_FINISH = "vllm/entrypoints/serve/utils/tool_calls_utils.py"
V_TOKENS = "vllm/entrypoints/scale_out/token_in_token_out/protocol.py"
V_TOKENS_SERVING = "vllm/entrypoints/scale_out/token_in_token_out/serving.py"
S_PROTO = "python/sglang/srt/entrypoints/openai/protocol.py"
S_CHAT = "python/sglang/srt/entrypoints/openai/serving_chat.py"
S_CMPL = "python/sglang/srt/entrypoints/openai/serving_completions.py"
S_IO = "python/sglang/srt/managers/io_struct.py"
S_TOKENIZER = "python/sglang/srt/managers/tokenizer_manager.py"
PRIME_TOKENS = "prime-rl: src/prime_rl/inference/vllm/serving_chat_with_tokens.py"

V_IDS = "vLLM 0.10.2 (PR #22587)"
V_OLD = "vLLM <= 0.9.2 (oldest read)"
S_CHAT_IDS = "SGLang 0.5.13"
S_OLD = "SGLang <= 0.4.9 (oldest read)"
S_ROUTES = "SGLang 0.5.x (--enable-return-routed-experts)"
S_KEPT = "slime's SGLang top-p patch (docker/patch/latest/sglang-top_p.patch)"
SLIME_TOP_P = "slime: docker/patch/latest/sglang-top_p.patch"


def _vllm_chat(endpoint: str, dialect: str = VLLM_OPENAI) -> tuple[Field, ...]:
    """vLLM's chat request and answer; prime-rl's `/v1/chat/completions/tokens` is the same body plus `tokens`."""
    f = [
        Field(dialect, endpoint, REQ, "messages", "root", ALL, "OpenAI API", V_CHAT),
        Field(dialect, endpoint, REQ, "tools", "root", ALL, "OpenAI API", V_CHAT),
        Field(dialect, endpoint, REQ, "logprobs", "root", ALL, "OpenAI API (bool)", V_CHAT),
        Field(dialect, endpoint, REQ, "top_logprobs", "root", ALL, "OpenAI API (0 = the sampled token's only)", V_CHAT),
        Field(dialect, endpoint, REQ, "return_token_ids", "root", ALL, V_IDS, V_CHAT),
        Field(dialect, endpoint, REQ, "return_tokens_as_token_ids", "root", ALL, V_OLD, V_CHAT),
        Field(
            dialect,
            endpoint,
            REQ,
            "include_reasoning",
            "root",
            ALL,
            "vLLM 0.10.1 (false also hides token_ids and logprobs: 0.28)",
            V_CHAT,
        ),
        Field(
            dialect,
            endpoint,
            REQ,
            "max_tokens",
            "root",
            ALL,
            "OpenAI API (or max_completion_tokens)",
            V_CHAT,
            "sampling",
        ),
        Field(dialect, endpoint, REQ, "temperature", "root", ALL, "OpenAI API", V_CHAT, "sampling"),
        Field(
            dialect,
            endpoint,
            REQ,
            "stream",
            "root",
            "true: SSE `data: {chunk}` lines, then `data: [DONE]`",
            "OpenAI API",
            V_CHAT_SERVING,
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "prompt_token_ids",
            "root",
            "first chunk only (null on it when not asked)",
            V_IDS,
            V_CHAT,
            "prompt_ids",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].token_ids",
            "choice",
            "every chunk: that chunk's ids; control "
            "tokens come as chunks with delta {} (0.13, PR #29074: dropped before)",
            V_IDS,
            V_CHAT,
            "output_ids",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].logprobs.content[].logprob",
            "choice",
            "every chunk: that chunk's entries",
            "OpenAI API",
            V_CHAT,
            "logprobs",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].logprobs.content[].token",
            "choice",
            "every chunk",
            "`token_id:N` with return_tokens_as_token_ids: " + V_OLD,
            V_CHAT_SERVING,
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].finish_reason",
            "choice",
            "last choice chunk; null before",
            "OpenAI API; tool_calls when calls were parsed (0.33: only on a stop, a length cut stays length)",
            V_FINISH,
            "finish_reason",
        ),
        Field(dialect, endpoint, RESP, "choices[].stop_reason", "choice", "last choice chunk", V_OLD, V_CHAT),
        Field(
            dialect, endpoint, RESP, "choices[].message.content", "message", NOT_STREAMED, "OpenAI API", V_CHAT, "text"
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].message.reasoning",
            "message",
            NOT_STREAMED,
            "vLLM 0.11.1 (PR #27752)",
            V_CHAT,
            "reasoning",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].message.reasoning_content",
            "message",
            NOT_STREAMED,
            "vLLM <= 0.11.0; 0.11.1-0.15.1 a copy of reasoning; gone in 0.16.0 (PR #33402)",
            V_CHAT,
            "reasoning",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].message.tool_calls",
            "message",
            NOT_STREAMED,
            "OpenAI API (`{id: chatcmpl-tool-..., type, function: {name, arguments}}`; key absent when none)",
            V_DELTA,
            "tool_calls",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].delta.content",
            "delta",
            'every chunk (first: role + "")',
            "OpenAI API",
            V_DELTA,
            "text",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].delta.reasoning",
            "delta",
            "every chunk",
            "vLLM 0.11.1 (PR #27752)",
            V_DELTA,
            "reasoning",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].delta.reasoning_content",
            "delta",
            "every chunk",
            "vLLM <= 0.11.0; 0.11.1-0.15.1 a copy; gone in 0.16.0",
            V_DELTA,
            "reasoning",
        ),
        Field(
            dialect,
            endpoint,
            RESP,
            "choices[].delta.tool_calls",
            "delta",
            "fragments keyed by index; the first has id, type, function.name",
            "OpenAI API",
            V_DELTA,
            "tool_calls",
        ),
    ]
    if endpoint == CHAT_TOKENS:
        f.insert(
            0,
            Field(
                dialect,
                endpoint,
                REQ,
                "tokens",
                "root",
                ALL,
                "prime-rl PR #1422 (2025-12); replaced by /inference/v1/generate in PR #2408 (2026-05)",
                PRIME_TOKENS,
                "prompt_ids",
            ),
        )
    return tuple(f)


VLLM_COMPLETIONS = (
    Field(
        VLLM_OPENAI,
        COMPLETIONS,
        REQ,
        "prompt",
        "root",
        ALL,
        "OpenAI API (a list of ids: token-id prompt)",
        V_CMPL,
        "prompt_ids",
    ),
    Field(
        VLLM_OPENAI, COMPLETIONS, REQ, "logprobs", "root", ALL, "OpenAI API (int: 0 = the sampled token only)", V_CMPL
    ),
    Field(VLLM_OPENAI, COMPLETIONS, REQ, "return_token_ids", "root", ALL, V_IDS, V_CMPL),
    Field(VLLM_OPENAI, COMPLETIONS, REQ, "return_tokens_as_token_ids", "root", ALL, V_OLD, V_CMPL),
    Field(VLLM_OPENAI, COMPLETIONS, REQ, "max_tokens", "root", ALL, "OpenAI API", V_CMPL, "sampling"),
    Field(
        VLLM_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].prompt_token_ids",
        "choice",
        "first chunk of each choice",
        V_IDS,
        V_CMPL,
        "prompt_ids",
    ),
    Field(
        VLLM_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].token_ids",
        "choice",
        "every chunk: that chunk's ids",
        V_IDS,
        V_CMPL,
        "output_ids",
    ),
    Field(
        VLLM_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].logprobs.token_logprobs",
        "choice",
        "every chunk",
        "OpenAI API",
        V_CMPL,
        "logprobs",
    ),
    Field(
        VLLM_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].logprobs.tokens",
        "choice",
        "every chunk",
        "`token_id:N` with return_tokens_as_token_ids: " + V_OLD,
        V_CMPL_SERVING,
    ),
    Field(
        VLLM_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].text",
        "choice",
        "every chunk: that chunk's text",
        "OpenAI API",
        V_CMPL,
        "text",
    ),
    Field(
        VLLM_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].finish_reason",
        "choice",
        "last choice chunk",
        "OpenAI API (the engine's: stop, length, abort)",
        V_CMPL_SERVING,
        "finish_reason",
    ),
    Field(
        VLLM_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].stop_reason",
        "choice",
        "every chunk (null until the last)",
        V_OLD,
        V_CMPL,
    ),
)

SGLANG_CHAT_FIELDS = (
    Field(
        SGLANG_OPENAI,
        CHAT,
        REQ,
        "input_ids",
        "root",
        ALL,
        S_CHAT_IDS + " (bypasses the chat template; messages still give stops and tool constraints)",
        S_PROTO,
        "prompt_ids",
    ),
    Field(SGLANG_OPENAI, CHAT, REQ, "messages", "root", ALL, "OpenAI API", S_PROTO),
    Field(SGLANG_OPENAI, CHAT, REQ, "logprobs", "root", ALL, "OpenAI API", S_PROTO),
    Field(SGLANG_OPENAI, CHAT, REQ, "return_meta_info", "root", "stream: 400", S_CHAT_IDS, S_CHAT),
    Field(SGLANG_OPENAI, CHAT, REQ, "return_prompt_token_ids", "root", "stream: 400", S_CHAT_IDS, S_CHAT),
    Field(SGLANG_OPENAI, CHAT, REQ, "return_token_ids", "root", "stream: 400", "SGLang 0.5.17 (PR #30917)", S_CHAT),
    Field(
        SGLANG_OPENAI,
        CHAT,
        REQ,
        "return_input_ids_in_sglext",
        "root",
        ALL,
        "SGLang 0.5.20 (also header x-sglext-return-input-ids: 1)",
        S_CHAT,
    ),
    Field(SGLANG_OPENAI, CHAT, REQ, "no_stop_trim", "root", ALL, S_OLD, S_PROTO, "sampling"),
    Field(
        SGLANG_OPENAI,
        CHAT,
        REQ,
        "max_completion_tokens",
        "root",
        ALL,
        "OpenAI API (or max_tokens)",
        S_PROTO,
        "sampling",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].prompt_token_ids",
        "choice",
        NOT_STREAMED,
        S_CHAT_IDS + " (also with return_token_ids)",
        S_CHAT,
        "prompt_ids",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].token_ids",
        "choice",
        NOT_STREAMED,
        "SGLang 0.5.17 only (PR #30917); renamed response_token_ids in 0.5.18",
        S_PROTO,
        "output_ids",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].response_token_ids",
        "choice",
        NOT_STREAMED,
        "SGLang 0.5.18",
        S_PROTO,
        "output_ids",
    ),
    Field(SGLANG_OPENAI, CHAT, RESP, "sglext.input_ids", "root", "last chunk", "SGLang 0.5.20", S_PROTO, "prompt_ids"),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "sglext.output_ids",
        "root",
        "last chunk (one list per choice)",
        "SGLang 0.5.20",
        S_PROTO,
        "output_ids",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].meta_info.output_token_logprobs",
        "meta_info",
        NOT_STREAMED,
        S_CHAT_IDS + " ([logprob, id, text] triples, as /generate)",
        S_CHAT,
        "logprobs",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].meta_info.finish_reason",
        "meta_info",
        NOT_STREAMED,
        S_CHAT_IDS + " ({type, matched}, as /generate)",
        S_TOKENIZER,
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].logprobs.content[].logprob",
        "choice",
        "every chunk",
        "OpenAI API",
        S_PROTO,
        "logprobs",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].finish_reason",
        "choice",
        "last choice chunk",
        "OpenAI API (stop, length, tool_calls, abort)",
        S_PROTO,
        "finish_reason",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].matched_stop",
        "choice",
        "every chunk (null until the last)",
        S_OLD,
        S_PROTO,
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].message.content",
        "message",
        NOT_STREAMED,
        'OpenAI API ("" not null)',
        S_CHAT,
        "text",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].message.reasoning_content",
        "message",
        NOT_STREAMED,
        S_OLD + " (separate_reasoning, default true)",
        S_PROTO,
        "reasoning",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].message.tool_calls",
        "message",
        NOT_STREAMED,
        "OpenAI API (key absent when none)",
        S_PROTO,
        "tool_calls",
    ),
    Field(SGLANG_OPENAI, CHAT, RESP, "choices[].delta.content", "delta", "every chunk", "OpenAI API", S_PROTO, "text"),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].delta.reasoning_content",
        "delta",
        "every chunk",
        S_OLD,
        S_PROTO,
        "reasoning",
    ),
    Field(
        SGLANG_OPENAI,
        CHAT,
        RESP,
        "choices[].delta.tool_calls",
        "delta",
        "fragments keyed by index",
        "OpenAI API",
        S_PROTO,
        "tool_calls",
    ),
)

SGLANG_COMPLETIONS = (
    Field(
        SGLANG_OPENAI,
        COMPLETIONS,
        REQ,
        "prompt",
        "root",
        ALL,
        "OpenAI API (a list of ids: token-id prompt)",
        S_PROTO,
        "prompt_ids",
    ),
    Field(SGLANG_OPENAI, COMPLETIONS, REQ, "return_token_ids", "root", ALL, "SGLang 0.5.17 (PR #30917)", S_PROTO),
    Field(SGLANG_OPENAI, COMPLETIONS, REQ, "no_stop_trim", "root", ALL, S_OLD, S_PROTO, "sampling"),
    Field(
        SGLANG_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].prompt_token_ids",
        "choice",
        "first chunk",
        "SGLang 0.5.17 (PR #30917)",
        S_CMPL,
        "prompt_ids",
    ),
    Field(
        SGLANG_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].token_ids",
        "choice",
        "every chunk: that chunk's ids",
        "SGLang 0.5.17 (PR #30917)",
        S_CMPL,
        "output_ids",
    ),
    Field(
        SGLANG_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].logprobs.token_logprobs",
        "choice",
        "every chunk",
        "OpenAI API",
        S_PROTO,
        "logprobs",
    ),
    Field(SGLANG_OPENAI, COMPLETIONS, RESP, "choices[].text", "choice", "every chunk", "OpenAI API", S_PROTO, "text"),
    Field(
        SGLANG_OPENAI,
        COMPLETIONS,
        RESP,
        "choices[].finish_reason",
        "choice",
        "last choice chunk",
        "OpenAI API",
        S_PROTO,
        "finish_reason",
    ),
    Field(SGLANG_OPENAI, COMPLETIONS, RESP, "choices[].matched_stop", "choice", "every chunk", S_OLD, S_PROTO),
)

VLLM_TOKENS = (
    Field(
        VLLM_GENERATE, TOKENS, REQ, "token_ids", "root", ALL, "vLLM 0.11.1 (non-empty: 0.22)", V_TOKENS, "prompt_ids"
    ),
    Field(
        VLLM_GENERATE,
        TOKENS,
        REQ,
        "sampling_params",
        "root",
        ALL,
        "vLLM 0.11.1 (vLLM's SamplingParams: max_tokens, temperature, logprobs: int, ...)",
        V_TOKENS,
        "sampling",
    ),
    Field(VLLM_GENERATE, TOKENS, REQ, "sampling_params.logprobs", "sampling_params", ALL, "vLLM 0.11.1", V_TOKENS),
    Field(
        VLLM_GENERATE,
        TOKENS,
        REQ,
        "stream",
        "root",
        "true: SSE, then data: [DONE]",
        "vLLM 0.11.1 (served from 0.20)",
        V_TOKENS_SERVING,
    ),
    Field(VLLM_GENERATE, TOKENS, REQ, "return_token_ids", "root", ALL, "vLLM 0.30", V_TOKENS),
    Field(VLLM_GENERATE, TOKENS, REQ, "output_mode", "root", ALL, "vLLM 0.32 (tokens | text | derender)", V_TOKENS),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "prompt_token_ids",
        "root",
        "first chunk only",
        "vLLM 0.30 (with return_token_ids)",
        V_TOKENS_SERVING,
        "prompt_ids",
    ),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "choices[].token_ids",
        "choice",
        "every chunk: that chunk's ids",
        "vLLM 0.11.1",
        V_TOKENS,
        "output_ids",
    ),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "choices[].logprobs.content[].logprob",
        "choice",
        "every chunk",
        "vLLM 0.11.1",
        V_TOKENS_SERVING,
        "logprobs",
    ),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "choices[].logprobs.content[].token",
        "choice",
        "every chunk",
        "vLLM 0.11.1-0.31 (`token_id:N`)",
        V_TOKENS_SERVING,
    ),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "choices[].logprobs.content[].token_id",
        "choice",
        "every chunk",
        "vLLM 0.32 (int, with rank)",
        V_TOKENS,
    ),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "choices[].finish_reason",
        "choice",
        "last choice chunk; null before",
        "vLLM 0.11.1 (stop, length, abort)",
        V_TOKENS_SERVING,
        "finish_reason",
    ),
    Field(VLLM_GENERATE, TOKENS, RESP, "choices[].stop_reason", "choice", "every chunk", "vLLM 0.32", V_TOKENS),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "choices[].routed_experts",
        "choice",
        "last choice chunk",
        "vLLM 0.32 (base64 .npy; engine started with --enable-return-routed-experts)",
        V_TOKENS_SERVING,
        "routes",
    ),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "choices[].weight_versions",
        "choice",
        "last choice chunk",
        "vLLM 0.32 ({version, start, end} spans, captured at admission)",
        V_TOKENS,
        "weight_versions",
    ),
    Field(
        VLLM_GENERATE,
        TOKENS,
        RESP,
        "choices[].text",
        "choice",
        "every chunk",
        "vLLM 0.32 (output_mode text)",
        V_TOKENS,
        "text",
    ),
    Field(
        VLLM_GENERATE,
        "/inference/v1/abort_requests",
        REQ,
        "request_ids",
        "root",
        "n/a",
        "vLLM 0.11.1 at /abort_requests; also under /inference/v1 from 0.30",
        V_TOKENS_SERVING,
    ),
)

SGLANG_GENERATE = (  # pinned in shared/notes/sglang-http.md; the rows the view reads
    Field(SGLANG, GENERATE, REQ, "input_ids", "root", ALL, S_OLD, S_IO, "prompt_ids"),
    Field(SGLANG, GENERATE, REQ, "sampling_params", "root", ALL, S_OLD, S_IO, "sampling"),
    Field(SGLANG, GENERATE, REQ, "return_logprob", "root", ALL, S_OLD, S_IO),
    Field(
        SGLANG,
        GENERATE,
        RESP,
        "output_ids",
        "root",
        "cumulative per chunk (deltas with --incremental-streaming-output)",
        S_OLD,
        S_TOKENIZER,
        "output_ids",
    ),
    Field(SGLANG, GENERATE, RESP, "text", "root", "cumulative per chunk", S_OLD, S_TOKENIZER, "text"),
    Field(
        SGLANG,
        GENERATE,
        RESP,
        "meta_info.output_token_logprobs",
        "meta_info",
        "cumulative per chunk",
        S_OLD,
        S_TOKENIZER,
        "logprobs",
    ),
    Field(
        SGLANG,
        GENERATE,
        RESP,
        "meta_info.finish_reason",
        "meta_info",
        "null until the last chunk",
        S_OLD,
        S_TOKENIZER,
        "finish_reason",
    ),
    # Per-token channels (CHANNELS.md, `dialects/channel_reads.py`): routes only when asked of an engine started
    # with --enable-return-routed-experts; kept sets with slime's top-p patch; versions always (0.5.23).
    Field(SGLANG, GENERATE, REQ, "return_routed_experts", "root", ALL, S_ROUTES, S_IO),
    Field(SGLANG, GENERATE, REQ, "routed_experts_start_len", "root", ALL, S_ROUTES, S_IO),
    Field(
        SGLANG,
        GENERATE,
        REQ,
        "sampling_params.custom_params.return_top_p_token_ids",
        "sampling_params",
        ALL,
        S_KEPT,
        SLIME_TOP_P,
    ),
    Field(
        SGLANG,
        GENERATE,
        RESP,
        "meta_info.routed_experts",
        "meta_info",
        "cumulative per chunk; only when asked",
        S_ROUTES,
        S_TOKENIZER,
        "routes",
    ),
    Field(
        SGLANG,
        GENERATE,
        RESP,
        "meta_info.top_p_token_ids",
        "meta_info",
        "cumulative per chunk; only when asked",
        S_KEPT,
        SLIME_TOP_P,
        "kept",
    ),
    Field(
        SGLANG,
        GENERATE,
        RESP,
        "meta_info.top_p_token_offsets",
        "meta_info",
        "cumulative per chunk; only when asked",
        S_KEPT,
        SLIME_TOP_P,
        "kept",
    ),
    Field(SGLANG, GENERATE, RESP, "meta_info.weight_version", "meta_info", ALL, S_OLD, S_TOKENIZER, "weight_versions"),
    Field(
        SGLANG,
        GENERATE,
        RESP,
        "meta_info.weight_versions",
        "meta_info",
        "cumulative per chunk",
        "SGLang 0.5.23 ({version, start, end} spans over the output)",
        S_TOKENIZER,
        "weight_versions",
    ),
)

FIELDS: tuple[Field, ...] = (
    SGLANG_GENERATE
    + SGLANG_CHAT_FIELDS
    + SGLANG_COMPLETIONS
    + _vllm_chat(CHAT)
    + VLLM_COMPLETIONS
    + VLLM_TOKENS
    + _vllm_chat(CHAT_TOKENS, VLLM_GENERATE)
)


def fields_of(dialect: str, endpoint: str | None = None, direction: str | None = None) -> tuple[Field, ...]:
    """The rows of one dialect (and endpoint, and direction)."""
    return tuple(
        f
        for f in FIELDS
        if f.dialect == dialect and endpoint in (None, f.endpoint) and direction in (None, f.direction)
    )
