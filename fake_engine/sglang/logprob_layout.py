"""What /generate's meta_info holds beside the output logprobs, as SGLang 0.5.23 lays it out (seen live):

- `logprob_start_len` N >= 0: `input_token_logprobs` for the prompt from position N, one `[logprob, id, text|null]`
  triple each, the prompt's first token `[null, id, null]` (nothing predicts it); -1 (the default): `[]`.
- `top_logprobs_num` K > 0: `input_top_logprobs` (`[]` unless the prompt's are asked) and `output_top_logprobs`, one
  list of K triples per output token, the sampled token first.
- `return_text_in_logprobs`: the token's text as each triple's third item.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tito_rl.fake_engine.logprobs import token_logprob


@dataclass(frozen=True)
class LogprobLayout:
    start_len: int = -1
    top_num: int = 0
    with_text: bool = False

    @classmethod
    def of(cls, body: dict[str, Any]) -> LogprobLayout:
        start = body.get("logprob_start_len")
        top = body.get("top_logprobs_num")
        return cls(
            start_len=start if isinstance(start, int) and not isinstance(start, bool) else -1,
            top_num=top if isinstance(top, int) and not isinstance(top, bool) and top > 0 else 0,
            with_text=bool(body.get("return_text_in_logprobs")),
        )


def _text(tokenizer: Any, token_id: int, with_text: bool) -> str | None:
    if not with_text or tokenizer is None:
        return None
    text: str = tokenizer.decode([token_id], skip_special_tokens=False)
    return text


def input_entries(layout: LogprobLayout, prompt: list[int], seed: str, tokenizer: Any) -> list[list[Any]]:
    if layout.start_len < 0:
        return []
    out: list[list[Any]] = []
    for position in range(min(layout.start_len, len(prompt)), len(prompt)):
        token = prompt[position]
        logprob = None if position == 0 else token_logprob(seed, "prompt", 0, position, token)
        out.append([logprob, token, _text(tokenizer, token, layout.with_text)])
    return out


def top_entries(layout: LogprobLayout, entries: list[list[Any]], tokenizer: Any) -> list[list[list[Any]]]:
    """K alternatives per output position: the sampled token first, then lower ones (ids that are not it)."""
    out: list[list[list[Any]]] = []
    for logprob, token, _ in entries:
        row = [[logprob, token, _text(tokenizer, token, layout.with_text)]]
        for k in range(1, layout.top_num):
            other = (token + k) % 151643
            row.append([float(logprob) - k, other, _text(tokenizer, other, layout.with_text)])
        out.append(row)
    return out


def laid_out(
    meta: dict[str, Any], layout: LogprobLayout, prompt: list[int], seed: str, tokenizer: Any
) -> dict[str, Any]:
    """`meta` (a meta_info with logprobs) with the layout's fields, in SGLang's key order."""
    if "output_token_logprobs" not in meta:
        return meta
    output = meta["output_token_logprobs"]
    if layout.with_text and tokenizer is not None:
        output = [[lp, tid, _text(tokenizer, tid, True)] for lp, tid, _ in output]
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if key == "input_token_logprobs":
            out[key] = input_entries(layout, prompt, seed, tokenizer)
        elif key == "output_token_logprobs":
            out[key] = output
        elif key == "output_token_logprobs_length":
            out[key] = value
            if layout.top_num:
                out["input_top_logprobs"] = []
                out["output_top_logprobs"] = top_entries(layout, output, tokenizer)
        else:
            out[key] = value
    return out
