"""verifiers' own reading of vLLM's expert routes, run on what tito's fake engine sends as vLLM 0.32 (issue 46).

verifiers 0.4.0 (with `renderers` 0.1.12) asks `/inference/v1/generate` for a bridged turn's routes from
`sampling_params.routed_experts_prompt_start = max(path_len - 1, 0)` (`verifiers/v1/clients/train.py`), takes
`choices[0].routed_experts` as the answer gives it (`renderers/client.py` `parse_generate_response`, `generate`), and at
the turn's commit slices it over the message graph's new nodes (`verifiers/v1/graph.py` `_attribute_routed_experts`):
it reads the value as a dict `{"data": base64 of the raw array bytes, "shape", "dtype" (default uint8), "start"}`,
puts row `i` at position `start + i`, replaces the previous turn's last row (a placeholder: that token was never
forwarded) with the one this turn's prefill routed, and pads the turn's own last token with a copy of the row before.
A branch's routes (`Trace.branches[i].routed_experts`) are what prime-rl trains with.

vLLM 0.32 writes `routed_experts` as a string, base64 of `.npy` bytes (`entrypoints/.../protocol.py`, typed
`str | None`; `numpy2base64`), which the fake engine sends byte for byte as vLLM's serializer would
(tests/test_fake_engine_vllm_routes.py). Run in verifiers' own Python (`~/.cache/tito/verifiers-venv`), its code on
the fake's answers: as sent, the commit fails on the string (`TypeError`); decoded with numpy and handed over in the
dict verifiers reads, what its branch keeps is what the fake routed for those tokens, with and without the prompt
start, but for the final token's placeholder. Skipped, saying why, where verifiers' Python is absent.
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

from tests.fake_engine_helpers import first_prompt, tokenizer
from tito_rl.fake_engine.app import EngineOptions, create_app
from tito_rl.fake_engine.channels.moe import MoeShape, routes
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.recorder.targets.base import TargetUnavailable
from tito_rl.recorder.targets.own_python.envs import gateway_python

SHAPE = MoeShape(3, 2, 8)
TWO_TURNS: dict[str, Any] = {"turns": ["Let me look at the files first.", "Done: two files."]}
NEXT_USER = "\n<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n"

# In verifiers' Python. stdin: per case the turns (raw answer bytes as text, prompt ids, reply text, the start asked)
# and how to hand the routes over; stdout: what its trace keeps.
PROBE = r"""
import base64, io, json, sys
import numpy as np
from renderers.client import parse_generate_response
from verifiers.v1.graph import prepare_turn
from verifiers.v1.trace import AgentInfo, Trace, TraceTask
from verifiers.v1.types import AssistantMessage, Response, SystemMessage, TurnTokens, UserMessage

out = []
for case in json.loads(sys.stdin.read()):
    trace = Trace(task=TraceTask(type="tito", data={}), agent=AgentInfo(config={}))
    messages = [SystemMessage(content="You are a coding agent."), UserMessage(content="list the files")]
    seen, path_lens = [], []
    try:
        for n, turn in enumerate(case["turns"]):
            if n:
                messages += [UserMessage(content="thanks")]
            pending = prepare_turn(trace, list(messages))
            path_lens.append(pending.path_len)
            choice = parse_generate_response(turn["raw"].encode())["choices"][0]  # renderers' own parsing
            sent = choice["routed_experts"]
            seen.append(type(sent).__name__)
            if case["hand_over"] == "as sent":
                payload = sent
            else:  # the dict verifiers reads, from numpy's reading of vLLM's .npy
                arr = np.load(io.BytesIO(base64.b64decode(sent)), allow_pickle=False)
                payload = {"data": base64.b64encode(arr.tobytes()).decode(), "shape": list(arr.shape),
                           "dtype": str(arr.dtype), "start": turn["start"]}
            tokens = TurnTokens.model_construct(
                prompt_ids=turn["prompt"], completion_ids=choice["token_ids"],
                completion_logprobs=[e["logprob"] for e in choice["logprobs"]["content"]], routed_experts=payload)
            reply = AssistantMessage(content=turn["text"])
            pending.commit(Response(id=str(n), created=0, model="m", message=reply, finish_reason="stop",
                                    tokens=tokens))
            messages.append(reply)
        [branch] = trace.branches
        rows = branch.routed_experts
        out.append({"error": None, "seen": seen, "path_lens": path_lens, "tokens": list(branch.token_ids),
                    "rows": None if rows is None else rows.tolist(), "dtype": None if rows is None else str(rows.dtype),
                    "node_rows": [None if n.routed_experts is None else len(n.routed_experts) for n in branch.nodes
                                  if n.token_ids]})
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}", "seen": seen})
print(json.dumps(out))
"""


def _verifiers_python() -> str | None:
    try:
        return str(gateway_python("verifiers"))
    except TargetUnavailable:
        return None


def fake_turns(with_start: bool) -> list[dict[str, Any]]:
    """Two turns on the fake engine as vLLM 0.32 started with `--enable-return-routed-experts`: the second extends
    the first's prompt and output with a user turn and asks, as verifiers does, from `path_len - 1` (or from 0)."""
    prompt = first_prompt()
    tail = list(tokenizer().encode(NEXT_USER, add_special_tokens=False))

    async def main() -> list[dict[str, Any]]:
        policy = ScriptedPolicy(parse_scenario(TWO_TURNS), tokenizer())
        options = EngineOptions(
            tokenizer=tokenizer(), openai_dialect="vllm-openai", return_routed_experts=True, moe=SHAPE
        )
        server = TestServer(create_app(policy, options), host="127.0.0.1")
        await server.start_server()
        turns: list[dict[str, Any]] = []
        ids = prompt
        try:
            async with aiohttp.ClientSession() as http:
                for n in range(2):
                    start = len(ids) - len(tail) - 1 if n and with_start else 0
                    params = {"max_tokens": 64, "temperature": 1.0, "logprobs": 1, "routed_experts_prompt_start": start}
                    body = {"token_ids": ids, "sampling_params": params}
                    async with http.post(str(server.make_url("/inference/v1/generate")), json=body) as r:
                        assert r.status == 200, await r.text()
                        raw = (await r.read()).decode()
                    choice = json.loads(raw)["choices"][0]
                    text = tokenizer().decode(choice["token_ids"], skip_special_tokens=True)
                    turns.append({"raw": raw, "prompt": ids, "start": start, "text": text, "out": choice["token_ids"]})
                    ids = ids + choice["token_ids"] + tail
        finally:
            await server.close()
        return turns

    return asyncio.run(main())


def run_verifiers(cases: list[dict[str, Any]], cwd: Path) -> list[dict[str, Any]]:
    python = _verifiers_python()
    if python is None:
        pytest.skip("needs verifiers' Python (make test builds ~/.cache/tito/verifiers-venv, or TITO_VERIFIERS_PYTHON)")
    run = subprocess.run(
        [python, "-c", PROBE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    answers: list[dict[str, Any]] = json.loads(run.stdout.strip().splitlines()[-1])
    return answers


def test_verifiers_keeps_what_the_engine_routed_for_its_tokens(tmp_path: Path) -> None:
    variants = {with_start: fake_turns(with_start) for with_start in (True, False)}
    cases = [
        {"turns": turns, "hand_over": how} for turns in variants.values() for how in ("as sent", "as verifiers reads")
    ]
    as_sent_start, read_start, as_sent_zero, read_zero = run_verifiers(cases, tmp_path)
    first, second = variants[True]
    # verifiers' turn 2 starts where turn 1's prompt and output end (the message graph's path), and asks from the
    # row before it: what the fake was asked here
    history = len(first["prompt"]) + len(first["out"])
    assert second["prompt"][:history] == first["prompt"] + first["out"]
    assert read_start["path_lens"] == [0, history] and second["start"] == history - 1

    # as vLLM 0.32 (and the fake) sends it, the string never reaches a branch: the first commit fails on it
    for answer in (as_sent_start, as_sent_zero):
        assert answer["seen"] == ["str"]
        assert answer["error"] == "TypeError: string indices must be integers, not 'str'"

    tokens = second["prompt"] + second["out"]
    reference = routes(tokens, SHAPE)
    for name, answer in (("from path_len - 1", read_start), ("from 0", read_zero)):
        assert answer["error"] is None, f"{name}: {answer['error']}"
        assert answer["tokens"] == tokens, name
        rows = np.asarray(answer["rows"])
        assert answer["dtype"] == "uint8" and rows.shape == (len(tokens), SHAPE.layers, SHAPE.top_k), name
        # every token's row is the engine's, the first turn's last token's included (from turn 2's prefill) ...
        assert (rows[:-1] == reference[:-1]).all(), name
        # ... but the final token's, never forwarded: verifiers pads it with a copy of the row before
        assert (rows[-1] == rows[-2]).all(), name
        assert answer["node_rows"] == [history, len(tokens) - history], name
