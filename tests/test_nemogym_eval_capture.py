"""NeMo Gym's evaluation capture (`observability_enabled: true`, `model_call_capture_dir`): which of a rollout's
calls it writes, under the conditions a user hits. Issue 48 saw it write 6 of 13 calls with no warning; here the
real model server (`nemo-gym` 0.7.0, started by tito's driver with `TITO_NEMOGYM_CONFIG`) in front of the fake
engine (vLLM's OpenAI API, a seeded random policy) gets 13 calls of one rollout at once (JSON, with engine 529s; and
streamed), 13 under the training-capture prefix, Responses calls (JSON and SSE), and a second start on the same
capture folder. Every call is written there (a failed one with the engine's 529, though the client got 500). The
one loss found: a rollout call whose path ends in a slash is served (200) and written nowhere, the capture folder
marking nothing incomplete (docs/conformance.md, NeMo Gym's finding 4). And its own reply, echoed whole in the next
request, is refused (finding 8)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.process_helpers import free_port, tito
from tito_rl.recorder.targets.base import TargetOptions

CALLS = 13


def _nemogym() -> None:
    from tito_rl.recorder.targets.base import TargetUnavailable
    from tito_rl.recorder.targets.own_python.envs import gateway_python

    try:
        gateway_python("nemogym")
    except TargetUnavailable as exc:
        pytest.skip(str(exc))


def _chat(i: int, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": f"call {i}"}], "max_tokens": 8, "stream": stream}


def _written(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """The capture's records by rollout (`<rollout>.capture.jsonl`, one JSON object a line)."""
    return {
        p.name.removesuffix(".capture.jsonl"): [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        for p in folder.glob("*.capture.jsonl")
    }


async def _start(engine: str) -> tuple[Any, str]:
    from tito_rl.recorder.targets.own_python.nemogym import NemoGymTarget

    target = NemoGymTarget(TargetOptions())
    return target, await target.start(engine)


async def _session(engine: str) -> dict[str, list[int]]:
    """One start of NeMo Gym: every condition's calls; the statuses the client got, by rollout."""
    target, url = await _start(engine)
    got: dict[str, list[int]] = {}
    try:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:

            async def post(rollout: str, path: str, body: dict[str, Any]) -> None:
                reply = await client.post(path, json=body)
                if body.get("stream") and reply.status_code == 200:  # the whole stream, to its end event
                    end = "response.completed" if path.endswith("/responses") else "data: [DONE]"
                    assert end in reply.text, reply.text[-200:]
                got.setdefault(rollout, []).append(reply.status_code)

            await asyncio.gather(
                *(post("json", "/ng-rollout/json/v1/chat/completions", _chat(i)) for i in range(CALLS))
            )
            await asyncio.gather(
                *(post("sse", "/ng-rollout/sse/v1/chat/completions", _chat(i, True)) for i in range(CALLS))
            )
            training = "/ng-rollout/train/training-token-capture/v1/chat/completions"
            await asyncio.gather(*(post("train", training, _chat(i)) for i in range(CALLS)))
            responses = [{"model": "m", "input": f"r {i}", "max_output_tokens": 8, "stream": i == 1} for i in range(2)]
            await asyncio.gather(*(post("responses", "/ng-rollout/responses/v1/responses", b) for b in responses))
            for i in range(3):  # one after another: the engine fails at most one of three
                await post("slash", "/ng-rollout/slash/v1/chat/completions/", _chat(i))
    finally:
        await target.stop()
    return got


def test_the_evaluation_capture_writes_every_call_of_a_rollout_but_one_whose_path_ends_in_a_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _nemogym()
    folder = tmp_path / "eval"
    config = tmp_path / "config.yaml"
    config.write_text(f"observability_enabled: true\nmodel_call_capture_dir: {folder}\n")
    monkeypatch.setenv("TITO_NEMOGYM_CONFIG", str(config))
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    args = ["fake-engine", "--policy", "random", "--seed", "1", "--listen", f"127.0.0.1:{port}"]
    args += ["--openai-dialect", "vllm-openai", "--fault-status", "529", "--fault-every", "3"]
    with tito(*args, ready=f"{engine}/health"):
        first = asyncio.run(_session(engine))
        written = _written(folder)
        for rollout in ("json", "sse", "train", "responses"):
            statuses = first[rollout]
            assert len(written[rollout]) == len(statuses), rollout  # every call, the failed ones included
            failed = [r for r in written[rollout] if r["status_code"] != 200]
            assert len(failed) == len(statuses) - statuses.count(200) and set(statuses) <= {200, 500}, rollout
            # a failed call's record holds the engine's status, not the 500 the client got
            assert all((r["status_code"], r["error_category"]) == (529, "upstream_error") for r in failed), rollout
        assert 500 in first["json"] and 200 in first["json"]  # the engine's 529s reached it: answered 500, written
        assert {r["dialect"] for r in written["responses"]} == {"responses"}
        assert first["slash"].count(200) >= 2 and "slash" not in written  # served and written nowhere,
        assert not list(folder.glob("*.incomplete"))  # nor marked incomplete (as an unobserved training call is)
        second = asyncio.run(_session(engine))  # a second start on the same folder: appended, nothing lost
    again = _written(folder)
    for rollout in ("json", "sse", "train", "responses"):
        assert len(again[rollout]) == len(first[rollout]) + len(second[rollout]), rollout
    assert "slash" not in again


async def _echoes(engine: str) -> tuple[httpx.Response, httpx.Response]:
    """A reply's assistant message echoed whole in the next request, and echoed as role, content and token ids."""
    target, url = await _start(engine)
    path = "/ng-rollout/echo/training-token-capture/v1/chat/completions"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            first = await client.post(path, json=_chat(0))
            assert first.status_code == 200, first.text[:300]
            message = first.json()["choices"][0]["message"]
            kept = ("role", "content", "prompt_token_ids", "generation_token_ids", "generation_log_probs")

            def then(echoed: dict[str, Any]) -> dict[str, Any]:
                body = _chat(0)
                body["messages"] += [echoed, {"role": "user", "content": "and then?"}]
                return body

            whole = await client.post(path, json=then(message))
            trimmed = await client.post(path, json=then({k: message[k] for k in kept}))
    finally:
        await target.stop()
    return whole, trimmed


def test_its_own_reply_message_echoed_whole_is_refused(tmp_path: Path) -> None:
    """A client echoing the assistant message as it came (mini-swe-agent through litellm) gets 422: the reply's
    `annotations`, `reasoning` and `routed_experts` (null) are fields its request model forbids."""
    _nemogym()
    port = free_port()
    engine = f"http://127.0.0.1:{port}"
    args = ["fake-engine", "--policy", "random", "--seed", "1", "--listen", f"127.0.0.1:{port}"]
    with tito(*args, "--openai-dialect", "vllm-openai", ready=f"{engine}/health"):
        whole, trimmed = asyncio.run(_echoes(engine))
    assert whole.status_code == 422 and trimmed.status_code == 200, (whole.text[:300], trimmed.text[:300])
    forbidden = {
        str(d["loc"][-1])
        for d in whole.json()["detail"]
        if d["type"] == "extra_forbidden" and "Assistant" in str(d["loc"])
    }
    assert {"annotations", "reasoning", "routed_experts"} <= forbidden
