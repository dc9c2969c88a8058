"""Small cassettes for `tito audit`'s tests, written with the cassette writer: one session's engine calls, agent
exchanges and finish, each call's output and logprobs chosen by the test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tito_rl.cassette.format.records import EngineRecord, Header
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.trajectory.adapters.tap import AgentExchange
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

S = "sid-test"
SYSTEM = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nWhat is in a.txt?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
FIRST = "<think>\nRead it.\n</think>\n\nHello there.<|im_end|>"
USER = "\n<|im_start|>user\nThanks, and b.txt?<|im_end|>\n<|im_start|>assistant\n"
SECOND = "Done.<|im_end|>"


def ids(text: str) -> list[int]:
    return load_tokenizer().encode(text, add_special_tokens=False)


def logprobs(output: list[int], base: float = -0.5) -> list[float]:
    return [base - i / 100 for i in range(len(output))]


class Recording:
    """A cassette being written: `engine`, `agent`, `finish`, then `close` (or use it as a context manager)."""

    def __init__(self, path: Path, **header: Any) -> None:
        self.path = path
        self.writer = CassetteWriter(
            path, Header(tokenizer_fingerprint="test", created="2026-01-01T00:00:00Z", **header)
        )

    def engine(
        self,
        prompt: list[int],
        output: list[int],
        *,
        session: str = S,
        status: int = 200,
        lps: list[float] | None | bool = True,
        max_new_tokens: int | None = 1000,
        finish: str = "stop",
        text: str | None = None,
        error: str | None = None,
    ) -> None:
        params: dict[str, Any] = {"skip_special_tokens": False}
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        request = {"input_ids": prompt, "sampling_params": params, "return_logprob": True}
        response: Any = {"error": {"message": "overloaded"}}
        if status == 200:
            meta: dict[str, Any] = {"finish_reason": {"type": finish}}
            if lps is True:
                lps = logprobs(output)
            if lps:
                meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(lps, output, strict=True)]
            response = {
                "text": load_tokenizer().decode(output, skip_special_tokens=False) if text is None else text,
                "output_ids": output,
                "meta_info": meta,
            }
        self.writer.write_engine(EngineRecord(session, 0, "POST", "/generate", request, status, response, error))

    def agent(
        self,
        reply: dict[str, Any] | str,
        *,
        session: str = S,
        body: dict[str, Any] | None = None,
        status: int = 200,
        path: str = "/v1/messages",
        side: bool = False,
        retry_of: int | None = None,
    ) -> None:
        body = body if body is not None else {"model": "m", "max_tokens": 1000, "messages": []}
        raw = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
        self.writer.agent_exchange(
            session,
            "named",
            AgentExchange(
                "POST",
                path,
                "",
                {},
                json.dumps(body).encode(),
                status,
                {},
                reply_body=raw,
                side=side,
                retry_of=retry_of,
            ),
        )

    def finish(self, samples: list[dict[str, Any]], session: str = S) -> None:
        self.writer.session_finished(session, "named", 1.0, samples)

    def close(self) -> Path:
        self.writer.close()
        return self.path

    def __enter__(self) -> Recording:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def text_reply(text: str, calls: list[tuple[str, dict[str, Any]]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """An Anthropic Messages reply: a text block (when any) and tool_use blocks."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": f"t{i}", "name": n, "input": a} for i, (n, a) in enumerate(calls)]
    return {
        "type": "message",
        "role": "assistant",
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
    }


def sample(prompt: list[int], parts: list[tuple[list[int], int, list[float] | None]]) -> dict[str, Any]:
    """A sample: `prompt`, then each part's ids with its loss (1 trained, 0 not) and logprobs (None: zeros)."""
    tokens, mask, lps = list(prompt), [], []
    for part, loss, part_lps in parts:
        tokens += part
        mask += [loss] * len(part)
        lps += part_lps if part_lps is not None else [0.0] * len(part)
    return {
        "tokens": tokens,
        "response_length": len(mask),
        "loss_mask": mask,
        "rollout_log_probs": lps,
        "reward": 1.0,
        "metadata": {},
    }


def two_turns(
    path: Path,
    *,
    first: str = FIRST,
    second: str = SECOND,
    reply0: dict[str, Any] | None = None,
    samples: Any = None,
    second_prompt: list[int] | None = None,
    **header: Any,
) -> Path:
    """A clean two-turn session (the second prompt extends the first prompt and output), trained once each;
    `samples(p0, o0, ctx, o1)` may give other samples, `second_prompt` another second prompt."""
    p0, o0 = ids(SYSTEM), ids(first)
    ctx = ids(USER)
    p1 = second_prompt if second_prompt is not None else p0 + o0 + ctx
    o1 = ids(second)
    with Recording(path, **header) as rec:
        rec.engine(p0, o0)
        rec.agent(reply0 if reply0 is not None else text_reply("Hello there."))
        rec.engine(p1, o1)
        rec.agent(text_reply("Done."))
        made = (
            samples(p0, o0, ctx, o1)
            if samples is not None
            else [sample(p0, [(o0, 1, logprobs(o0)), (ctx, 0, None), (o1, 1, logprobs(o1))])]
        )
        rec.finish(made)
    return path
