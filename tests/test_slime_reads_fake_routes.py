"""slime's own decoding of SGLang's per-token channels, run on what tito's fake engine sends (issue 46, point 1).

slime builds a sample's routes in `Sample._apply_meta_info` (`slime/utils/types.py`): `decode_int32_meta_array`
(`slime/utils/misc.py`) reads `meta_info.routed_experts` as raw int32, expects `len(tokens) - 1 - start` rows of
`num_layers x moe_router_topk`, where `start` is `meta_info.routed_experts_start_len` (default 0), and appends them at
`start` onto the rows it holds. Its rollouts (`slime/rollout/sglang_rollout.py`, `sglang_streaming_rollout.py`) call
`Sample.append_response_tokens` with each answer's `meta_info` (a stream: each chunk's, from the state before the
call); a multi-turn rollout adds the turns' tool tokens untrained (`trainable=False`). That code needs torch, so it
runs here in the real SGLang's venv (`make real-sglang`), slime imported from its checkout (`TITO_SLIME_PATH`, as
the slime target finds it), never copied: the probe below drives slime's `Sample` exactly as those rollouts do.

The session: one recorded through tito's adapter in front of the fake engine (`--enable-return-routed-experts
--moe 2,2,8`, top_p 0.9), whose engine calls are then sent again to a fresh fake engine as JSON and as SSE, each with
the start tito asked (`routed_experts_start_len` from the turn before's last token) and without (every turn from 0).
slime's sample must hold what tito's sample holds and what the fake routed: same tokens, same rows.

Skipped, saying why, where the SGLang venv or slime's checkout is absent.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer

from tests.fake_engine_helpers import sse_events
from tests.target_support import slime_missing
from tests.test_channels_fake_engine import SHAPE, record, scenario
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import CassetteReader
from tito_rl.fake_engine.app import EngineOptions
from tito_rl.fake_engine.app import create_app as engine_app
from tito_rl.fake_engine.channels.moe import routes
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.recorder.real_engine.sglang_paths import real_sglang_home, venv_python
from tito_rl.recorder.targets import slime_env
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

# Run in the SGLang venv with slime's checkout on PYTHONPATH; stdin: the cases, stdout: what slime's Sample holds.
PROBE = r"""
import json, sys
from types import SimpleNamespace
import torch
from slime.utils.types import Sample
from slime.observability.rollout_data_utils import validate_rollout_routed_experts_for_replay

def as_list(value):
    return None if value is None else torch.as_tensor(value).tolist()

out = []
for case in json.loads(sys.stdin.read()):
    args = SimpleNamespace(num_layers=case["layers"], moe_router_topk=case["top_k"], sglang_speculative_algorithm=False)
    sample = Sample()
    try:
        for turn in case["turns"]:
            prompt = turn["prompt"]
            if not sample.tokens:  # sglang_rollout.generate: the first call's prompt
                sample.tokens = list(prompt)
            else:  # the tool and template tokens the agent added since, untrained
                assert prompt[: len(sample.tokens)] == sample.tokens, "the next prompt does not extend the sample"
                sample.append_response_tokens(args, tokens=prompt[len(sample.tokens):], trainable=False)
            if turn["chunks"] is None:  # sglang_rollout.generate
                meta = turn["meta"]
                pairs = meta["output_token_logprobs"]
                sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                              trainable=True, meta_info=meta, text=turn["text"])
                continue
            # sglang_streaming_rollout.generate: every chunk rebuilt from the state before the call
            base = (list(sample.tokens), sample.response, sample.response_length,
                    None if sample.rollout_log_probs is None else list(sample.rollout_log_probs),
                    sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets,
                    None if sample.loss_mask is None else list(sample.loss_mask))
            for chunk in turn["chunks"]:
                meta = chunk.get("meta_info") or {}
                pairs = meta.get("output_token_logprobs", [])
                (tokens, sample.response, sample.response_length, lps, sample.rollout_top_p_token_ids,
                 sample.rollout_top_p_token_offsets, mask) = base
                sample.tokens, sample.loss_mask = list(tokens), None if mask is None else list(mask)
                sample.rollout_log_probs = None if lps is None else list(lps)
                sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs],
                                              trainable=True, meta_info=meta, text=chunk.get("text", ""),
                                              update_terminal_info=bool(meta.get("finish_reason")))
        rows = sample.rollout_routed_experts
        validate_rollout_routed_experts_for_replay([torch.as_tensor(rows)], args)  # slime/ray/rollout.py's check
        out.append({"error": None, "tokens": sample.tokens, "rows": as_list(rows), "dtype": str(rows.dtype),
                    "top_p_ids": as_list(sample.rollout_top_p_token_ids),
                    "top_p_offsets": as_list(sample.rollout_top_p_token_offsets),
                    "weight_versions": sample.weight_versions, "response_length": sample.response_length})
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def slime_python() -> tuple[str, Path]:
    """The real SGLang venv's Python (it has torch) and slime's checkout."""
    python = venv_python(real_sglang_home())
    if not python.is_file():
        pytest.skip(f"no real SGLang venv here ({python}; make real-sglang): slime's decoder needs its torch")
    if slime_missing() is not None:
        pytest.skip(f"needs slime: {slime_missing()}")
    return str(python), slime_env.locate()


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One session through tito's adapter on the MoE fake engine: its engine calls (requests) and tito's sample."""
    path = tmp_path_factory.mktemp("slime") / "moe.tito"
    statuses, [sample] = record(path)
    assert statuses == [200, 200, 200]
    with CassetteReader(path) as reader:
        calls = [r.request for r in reader.records() if isinstance(r, EngineRecord) and r.request]
    assert [c["routed_experts_start_len"] > 0 for c in calls] == [False, True, True]
    return calls, sample


def resend(calls: list[dict[str, Any]], *, stream: bool, with_start: bool) -> list[dict[str, Any]]:
    """The session's engine calls sent again to a fresh fake engine; per turn the prompt, the start asked, and the
    answer (JSON: its meta_info and text; SSE: every chunk)."""
    tokenizer = load_tokenizer()

    async def main() -> list[dict[str, Any]]:
        policy = ScriptedPolicy(parse_scenario(scenario()), tokenizer)
        options = EngineOptions(tokenizer=tokenizer, return_routed_experts=True, moe=SHAPE)
        server = TestServer(engine_app(policy, options), host="127.0.0.1")
        await server.start_server()
        turns = []
        try:
            async with aiohttp.ClientSession() as http:
                for call in calls:
                    body = {**call, "stream": stream}
                    if not with_start:
                        body.pop("routed_experts_start_len")
                    async with http.post(str(server.make_url("/generate")), json=body) as r:
                        assert r.status == 200, await r.text()
                        if stream:
                            chunks = [e for e in await sse_events(r) if e != "[DONE]"]
                            turn = {"chunks": chunks, "meta": chunks[-1]["meta_info"], "text": chunks[-1]["text"]}
                        else:
                            answer = await r.json()
                            turn = {"chunks": None, "meta": answer["meta_info"], "text": answer["text"]}
                    turns.append(
                        {"prompt": call["input_ids"], "start": body.get("routed_experts_start_len", 0), **turn}
                    )
        finally:
            await server.close()
        return turns

    return asyncio.run(main())


def run_slime(slime: tuple[str, Path], cases: list[dict[str, Any]], cwd: Path) -> list[dict[str, Any]]:
    python, root = slime
    run = subprocess.run(
        [python, "-c", PROBE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answers: list[dict[str, Any]] = json.loads(run.stdout.strip().splitlines()[-1])
    return answers


def case(turns: list[dict[str, Any]], *, echo_start: bool = False) -> dict[str, Any]:
    """A probe case; `echo_start`: copy the start asked into each answer's meta_info, where slime reads it (SGLang
    0.5.23 does not echo it, and the fake does not either)."""
    if echo_start:
        turns = [
            {
                **t,
                "meta": {**t["meta"], "routed_experts_start_len": t["start"]},
                "chunks": None
                if t["chunks"] is None
                else [
                    {**c, "meta_info": {**c["meta_info"], "routed_experts_start_len": t["start"]}} for c in t["chunks"]
                ],
            }
            for t in turns
        ]
    return {"layers": SHAPE.layers, "top_k": SHAPE.top_k, "turns": turns}


def test_slimes_sample_holds_the_routes_the_fake_sent_and_titos_sample_holds(
    slime_python: tuple[str, Path], session: tuple[list[dict[str, Any]], dict[str, Any]], tmp_path: Path
) -> None:
    calls, tito = session
    variants = {
        (stream, start): resend(calls, stream=stream, with_start=start)
        for stream in (False, True)
        for start in (False, True)
    }
    for turns in variants.values():  # the same answers each time: the fake is deterministic
        assert [t["meta"]["output_token_logprobs"] for t in turns] == [
            t["meta"]["output_token_logprobs"] for t in variants[(False, False)]
        ]
    names = [f"{'sse' if s else 'json'}, {'from the start asked' if w else 'every turn from 0'}" for s, w in variants]
    cases = [case(t, echo_start=w) for (_, w), t in variants.items()]
    answers = run_slime(slime_python, cases, tmp_path)

    tokens = tito["tokens"]
    reference = routes(tokens, SHAPE)[:-1]  # the fake's router over the whole sample, every token but the last
    titos = np.asarray(tito["rollout_routed_experts"])
    assert titos.shape == (len(tokens) - 1, 1, SHAPE.layers * SHAPE.top_k)  # flat rows: no config.json to split by
    assert (titos.reshape(reference.shape) == reference).all()
    for name, answer in zip(names, answers, strict=True):
        assert answer["error"] is None, f"{name}: {answer['error']}"
        assert answer["tokens"] == tokens, name
        rows = np.asarray(answer["rows"])
        assert answer["dtype"] == "torch.int32" and rows.shape == reference.shape, name
        assert (rows == reference).all(), name
        # the other channels slime reads from the same meta_info agree with tito's sample too
        assert answer["response_length"] == tito["response_length"], name
        assert answer["top_p_ids"] == list(tito["rollout_top_p_token_ids"]), name
        assert answer["top_p_offsets"] == list(tito["rollout_top_p_token_offsets"]), name
        assert answer["weight_versions"] == tito["weight_versions"], name


def test_slime_refuses_routes_asked_from_a_start_it_is_not_told(
    slime_python: tuple[str, Path], session: tuple[list[dict[str, Any]], dict[str, Any]], tmp_path: Path
) -> None:
    """SGLang 0.5.23 answers `routed_experts_start_len`'s rows without echoing the start, and slime reads the start
    from meta_info only: a rollout that asks from a start and hands slime the answer as it comes fails on the second
    turn, counting the rows against the whole sample (JSON and SSE alike)."""
    calls, _ = session
    turns = {stream: resend(calls, stream=stream, with_start=True) for stream in (False, True)}
    answers = run_slime(slime_python, [case(t) for t in turns.values()], tmp_path)
    per_row = SHAPE.layers * SHAPE.top_k
    for sent, answer in zip(turns.values(), answers, strict=True):
        second = sent[1]
        total = len(second["prompt"]) + len(second["meta"]["output_token_logprobs"])  # the sample's tokens then
        assert answer["error"] == (
            "ValueError: SGLang routed_experts element count does not match sample tokens: "
            f"got={(total - 1 - second['start']) * per_row}, expected={(total - 1) * per_row} "
            f"(tokens={total}, routed_experts_start_len=0, num_layers={SHAPE.layers}, moe_router_topk={SHAPE.top_k})."
        )
