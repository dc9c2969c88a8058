"""The engine leg served back from a cassette: matching rules, the first-divergence error, and a real
record -> replay loop (adapter app + fake engine over loopback HTTP, cassette written by the tap)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cassette_helpers import API_KEY, BEARER, capture_bodies, generate_body, serve
from tito_rl.cassette.format.records import EngineRecord, Header
from tito_rl.cassette.matching import EngineIndex, NoMatch
from tito_rl.cassette.reader import read_cassette
from tito_rl.cassette.redaction import session_digest
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.fake_engine.app import EngineOptions
from tito_rl.fake_engine.app import create_app as create_engine
from tito_rl.fake_engine.policies.cassette import CassettePolicy
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, load_scenario
from tito_rl.fake_engine.policy import GenerateRequest, PolicyError
from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.app import create_app as create_adapter
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.tokens.tokenizer import fingerprint

REPO = Path(__file__).resolve().parent.parent


def _record(seq: int, ids: list[int], out: list[int], session: str = "s", **sampling: Any) -> EngineRecord:
    request = {"rid": f"rid-{seq}", "input_ids": ids, "sampling_params": {"max_new_tokens": 64, **sampling}}
    return EngineRecord(session, seq, "POST", "/generate", request, 200, generate_body(out, f"rid-{seq}", len(ids)))


def test_matching_ignores_rid_and_cache_state_but_not_sampling(qwen_tokenizer: Any) -> None:
    ids = qwen_tokenizer.encode("Please list the files in the repository.")
    index = EngineIndex(decode=qwen_tokenizer.decode)
    index.add(_record(0, ids, [1, 2, 151645], temperature=0.0))
    found = index.match(ids, {"max_new_tokens": 64, "temperature": 0.0, "stream_interval": 4})
    assert not isinstance(found, NoMatch) and found.response["output_ids"] == [1, 2, 151645]
    # SGLang defaults are filled in: an explicit default equals an omitted one.
    index.add(_record(1, ids, [3, 151645]))
    assert index.match(ids, {"max_new_tokens": 64, "temperature": 1.0, "top_k": 1 << 30}).seq == 1
    miss = index.match(ids, {"max_new_tokens": 64, "temperature": 0.7})
    assert isinstance(miss, NoMatch) and miss.divergence_index is None
    assert miss.sampling_diff["temperature"][1] == 0.7 and "sampling params differ" in miss.message()


def test_repeated_identical_requests_are_served_in_recorded_order() -> None:
    index = EngineIndex()
    for seq, out in enumerate(([5, 151645], [6, 151645])):
        index.add(_record(seq, [10, 11, 12], out, session="a"))
    answers = [index.match([10, 11, 12], {"max_new_tokens": 64}, "a").response["output_ids"] for _ in range(3)]
    assert answers == [[5, 151645], [6, 151645], [6, 151645]]  # then the last answer repeats


def test_a_changed_prompt_names_the_closest_request_and_the_first_divergent_token(qwen_tokenizer: Any) -> None:
    base = qwen_tokenizer.encode("<|im_start|>user\nList the files in src and count them.<|im_end|>\n")
    index = EngineIndex(decode=lambda ids: qwen_tokenizer.decode(ids, skip_special_tokens=False))
    index.add(_record(0, qwen_tokenizer.encode("something unrelated entirely"), [1, 151645], session="other"))
    index.add(_record(3, base, [1, 151645], session="sid-1"))
    changed = qwen_tokenizer.encode("<|im_start|>user\nList the files in lib and count them.<|im_end|>\n")
    miss = index.match(changed, {"max_new_tokens": 64})
    assert isinstance(miss, NoMatch)
    first = next(i for i, (a, b) in enumerate(zip(base, changed, strict=False)) if a != b)
    assert miss.divergence_index == first and miss.closest is not None and miss.closest.seq == 3
    message = miss.message()
    assert f"first differ at token {first}" in message and "session 'sid-1' seq 3" in message
    assert "src" in message and "lib" in message and "List the files in" in message


def test_cassette_policy_refuses_with_the_divergence_as_an_http_400_message(
    tmp_path: Path, qwen_tokenizer: Any
) -> None:
    path = tmp_path / "c.tito"
    ids = qwen_tokenizer.encode("hello there, engine")
    with CassetteWriter(path, Header(tokenizer_fingerprint=fingerprint())) as writer:
        writer.write_engine(_record(0, ids, [9, 8, 151645], session="run"))
    policy = CassettePolicy.load(path)
    gen = policy.generate(GenerateRequest(ids, {"max_new_tokens": 64}, rid="fresh-rid", routing_key="run"))
    assert gen.output_ids == [9, 8, 151645] and gen.finish == "stop" and gen.matched == 151645
    assert gen.logprobs == [-0.015625, -0.03125, -0.046875]
    with pytest.raises(PolicyError, match="first differ at token") as err:
        policy.generate(GenerateRequest(ids[:-1] + [1234], {"max_new_tokens": 64}, rid="x"))
    assert err.value.status == 400


async def _send_agent_leg(url: str, bodies: list[bytes], token: str, api_key: str | None = None) -> list[str]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if api_key:
        headers["x-api-key"] = api_key
    texts = []
    async with aiohttp.ClientSession() as client:
        for body in bodies:
            async with client.post(url + "/v1/messages?beta=true", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
                texts.append(await r.text())
    return texts


async def test_record_then_replay_through_the_adapter_and_fake_engine(tmp_path: Path, qwen_tokenizer: Any) -> None:
    """Record: agent -> adapter (cassette tap) -> scripted fake engine. Replay: the cassette's agent leg
    re-sent to a fresh adapter whose engine is `CassettePolicy`: same requests, same tokens."""
    path = tmp_path / "loop.tito"
    scenario = load_scenario(REPO / "fake_engine" / "examples" / "claude_tool_loop.yaml")
    bodies = capture_bodies("claude_baseline")
    options = EngineOptions(tokenizer=qwen_tokenizer)
    writer = CassetteWriter(
        path,
        Header(
            tokenizer_fingerprint=fingerprint(),
            created="2026-01-01T00:00:00Z",
            agent={"client": "claude-code", "version": "2.1.330"},
        ),
    )
    async with serve(create_engine(ScriptedPolicy(scenario, qwen_tokenizer), options)) as engine_url:
        adapter = create_adapter(AdapterSettings(engine_url=engine_url), TrajectoryManager(), writer)
        async with serve(adapter) as url:
            live_replies = await _send_agent_leg(url, bodies, BEARER, API_KEY)
            async with (
                aiohttp.ClientSession() as client,
                client.post(f"{url}/tito/sessions/{BEARER}/finish", json={"reward": 1.0}) as r,
            ):
                live_samples = (await r.json())["samples"]
    writer.close()

    data = path.read_bytes()
    assert BEARER.encode() not in data and API_KEY.encode() not in data
    cassette = read_cassette(path, fingerprint())
    name = session_digest(BEARER)
    log = cassette.sessions[name]
    assert not cassette.truncated and len(log.agent) == 2 and len(log.engine) == 2
    # Samples come back exact, except that the live session id (the bearer token) is now the session's name.
    assert live_samples and all(s["metadata"]["session"] == BEARER for s in live_samples)
    assert log.samples == [{**s, "metadata": {**s["metadata"], "session": name}} for s in live_samples]
    events = log.agent[0].reply_events
    assert events is not None and "tool_use" in events[0] + "".join(events)

    replay_tap = _EngineTap()
    policy = CassettePolicy.load(path)
    async with serve(create_engine(policy, options)) as engine_url:
        adapter = create_adapter(AdapterSettings(engine_url=engine_url), TrajectoryManager(), replay_tap)
        async with serve(adapter) as url:
            replayed = await _send_agent_leg(url, [r.body for r in log.agent], name)
    assert [e.response["output_ids"] for e in replay_tap.engine] == [r.response["output_ids"] for r in log.engine]
    assert [e.request["input_ids"] for e in replay_tap.engine] == [r.request["input_ids"] for r in log.engine]
    assert [_content(t) for t in replayed] == [_content(t) for t in live_replies]

    # A changed prompt: the replay engine answers 400 with the first divergence, decoded.
    changed = list(log.engine[1].request["input_ids"])
    changed[-20] = qwen_tokenizer.encode(" banana")[0]
    async with serve(create_engine(policy, options)) as engine_url, aiohttp.ClientSession() as client:
        body = {"input_ids": changed, "sampling_params": log.engine[1].request["sampling_params"]}
        async with client.post(engine_url + "/generate", json=body) as r:
            assert r.status == 400
            message = (await r.json())["error"]["message"]
    assert f"first differ at token {len(changed) - 20}" in message and "banana" in message


class _EngineTap:
    def __init__(self) -> None:
        self.engine: list[Any] = []

    def agent_request(self, session: str, source: str, headers: dict[str, str]) -> None:
        pass

    def agent_exchange(self, session: str, source: str, exchange: Any) -> None:
        pass

    def engine_exchange(self, session: str, source: str, exchange: Any) -> None:
        if exchange.path == "/generate":
            self.engine.append(exchange)

    def session_finished(self, session: str, source: str, reward: float, samples: list[dict[str, Any]]) -> None:
        pass

    def session_dropped(self, session: str, source: str) -> None:
        pass


def _content(sse: str) -> list[Any]:
    """What the agent sees, minus ids the adapter makes up per reply."""
    out = []
    for line in sse.splitlines():
        if line.startswith("data: "):
            event = json.loads(line[6:])
            for key in ("message", "content_block"):
                if isinstance(event.get(key), dict):
                    event[key] = {k: v for k, v in event[key].items() if k != "id"}
            out.append(event)
    return out
