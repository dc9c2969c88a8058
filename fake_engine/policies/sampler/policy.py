"""`RandomPolicy`: tokens sampled from the pseudo-model (`model.py`) the way an engine's sampler draws them.

What it honours, as each engine does (`GenerateRequest.dialect` tells vLLM's routes from SGLang's):
- `max_new_tokens`/`max_tokens` (finish `length`); none: up to the context length. SGLang checks the length
  before the stop ids (a stop token drawn last finishes `length`), vLLM after them.
- `min_new_tokens`/`min_tokens`: the stop ids and both end tokens are banned while the output is shorter; vLLM
  also looks for stop strings only once the output is longer (SGLang at every token).
- stop ids: `stop_token_ids` and the end tokens `<|im_end|>`/`<|endoftext|>`; `matched` is the id. `ignore_eos`:
  the end tokens may still be drawn and generation goes on; in SGLang it turns off `stop_token_ids` too.
- stop strings (`stop`): found where the newest token's text completes one (vLLM's detokenizer window; SGLang
  stops at the same token); `matched` is the string, the ids keep the token that completed it. The text each
  engine then shows (cut before it, after it, or not) is the app's (`openai/tokens.visible_text`).
- `logit_bias` (token id -> added logit; -100 or less bans), `temperature` (0: greedy, the argmax),
  `seed`/`sampling_seed`: one request and seed give the same tokens on every start and in every dialect; without
  one the draws come from the server's `--seed` stream, so a server start sent the same requests in the same order
  repeats. Each of `n` choices (`GenerateRequest.choice_index`) is its own stream.
- Logprobs: the sampled token's under the distribution, as each engine reports it by default: vLLM's raw (before
  `logit_bias`, bans and temperature), SGLang's after them (greedy: after the bias and bans only).
- Not honoured: `top_p`, `top_k`, `min_p`, the penalties, grammars (accepted, without effect).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from tito_rl.fake_engine.policies.sampler.model import END_IDS, Distribution, PseudoModel
from tito_rl.fake_engine.policies.sampler.params import SamplerParams, read_params
from tito_rl.fake_engine.policy import GenerateRequest, Generation, PolicyError
from tito_rl.trajectory.dialects.view import VLLM_GENERATE, VLLM_OPENAI

VLLM_DIALECTS = (VLLM_OPENAI, VLLM_GENERATE)  # the rest are SGLang's


def _uniform(stream: str, position: int) -> float:
    digest = hashlib.blake2b(f"{stream}|{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def _draw(dist: Distribution, temperature: float, u: float, fallback: np.ndarray) -> int:
    """Inverse CDF over the named tokens, then the floor's rest (a pool token by `u`)."""
    scaled = dist.logits / temperature
    log_z = dist.log_normalizer(temperature)
    probs = np.exp(scaled - log_z)
    cdf = np.cumsum(probs)
    i = int(np.searchsorted(cdf, u, side="right"))
    if i < len(dist.ids):
        return int(dist.ids[i])
    return int(fallback[int(u * 2**32) % len(fallback)])


class RandomPolicy:
    def __init__(self, tokenizer: Any, seed: int = 0, context_length: int = 40960) -> None:
        self.tokenizer = tokenizer
        self.model = PseudoModel(tokenizer)
        self.seed = seed
        self.context_length = context_length
        self.unseeded = 0  # requests served from the server's stream so far

    def _stream(self, params: SamplerParams, choice: int) -> str:
        if params.seed is not None:
            return f"seed|{params.seed}|{choice}"
        self.unseeded += 1
        return f"server|{self.seed}|{self.unseeded}"

    def _stop_hit(self, ids: list[int], stops: tuple[str, ...]) -> str | None:
        """The stop string the newest token's text completes (vLLM's detokenizer window: it may start up to
        len(stop) - 1 characters before that text), the earliest-starting one if several. Only the output's tail is
        decoded, as many tokens as hold the longest stop string's length in text before the newest one."""
        longest, size = max(map(len, stops)), max(map(len, stops)) + 2
        while True:
            tail = ids[-size:]
            before = len(self.tokenizer.decode(tail[:-1], skip_special_tokens=True))
            if before >= longest or size >= len(ids):
                break
            size *= 2
        text = self.tokenizer.decode(tail, skip_special_tokens=True)
        found: tuple[int, str] | None = None
        for stop in stops:
            at = text.find(stop, max(0, before - len(stop) + 1))
            if at >= 0 and (found is None or at < found[0]):
                found = (at, stop)
        return None if found is None else found[1]

    def generate(self, req: GenerateRequest) -> Generation:
        try:
            params = read_params(req.sampling_params)
        except ValueError as exc:
            raise PolicyError(str(exc)) from None
        stream = self._stream(params, req.choice_index)
        limit = params.max_new_tokens
        if limit is None:
            limit = max(0, self.context_length - len(req.input_ids))
        vllm = req.dialect in VLLM_DIALECTS
        held = params.stop_token_ids | frozenset(END_IDS)  # banned while the output is shorter than min tokens
        # ignore_eos: in vLLM only the end tokens stop no more; in SGLang no stop id does.
        stop_ids = held if not params.ignore_eos else params.stop_token_ids if vllm else frozenset()
        digest = self.model.prompt_digest(req.input_ids)
        ids: list[int] = []
        lps: list[float] = []
        while len(ids) < limit:
            pos = len(ids)
            dist = self.model.distribution(digest, pos)
            used = dist.adjusted(params.logit_bias, held if pos < params.min_new_tokens else frozenset())
            if params.greedy:
                if float(np.max(used.logits)) < -1e30:
                    raise PolicyError("every token is banned (logit_bias and min tokens)")
                token = int(used.ids[int(np.argmax(used.logits))])
                lp = dist.logprob(token) if vllm else used.logprob(token)
            else:
                token = _draw(used, params.temperature, _uniform(stream, pos), self.model.pool)
                lp = dist.logprob(token) if vllm else used.logprob(token, params.temperature)
            ids.append(token)
            lps.append(round(max(lp, -9999.0), 6))
            digest = self.model.next_digest(digest, token)
            if not vllm and len(ids) >= limit:
                break  # SGLang checks the length first: a stop token drawn last still finishes `length`
            if len(ids) >= params.min_new_tokens and token in stop_ids:
                return Generation(ids, lps, "stop", token)
            # vLLM looks for stop strings once the output is longer than min tokens; SGLang at every token.
            if params.stop and (not vllm or len(ids) > params.min_new_tokens):
                hit = self._stop_hit(ids, params.stop)
                if hit is not None:
                    return Generation(ids, lps, "stop", hit)
        return Generation(ids, lps, "length")
