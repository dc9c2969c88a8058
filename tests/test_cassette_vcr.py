"""vcrpy integration: an in-process aiohttp client's /generate calls recorded into, and replayed from,
a tito cassette, in each record mode. The engine is a real aiohttp server on loopback that answers
differently on every hit, so a replay and a re-recording are told apart by the tokens."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from vcr.errors import CannotOverwriteExistingCassetteException

from tests.cassette_helpers import BEARER, EOS, generate_body, header, serve
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import read_cassette, summarize
from tito_rl.cassette.redaction import session_digest
from tito_rl.replayer.pytest_plugin.vcr import configure_vcr

PROMPT_A = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
PROMPT_B = PROMPT_A[:-1] + [1000]


class Engine:
    def __init__(self) -> None:
        self.hits = 0

    def app(self) -> web.Application:
        async def generate(request: web.Request) -> web.Response:
            self.hits += 1
            body = await request.json()
            return web.json_response(generate_body([100 + self.hits, EOS], body["rid"], len(body["input_ids"])))

        app = web.Application()
        app.router.add_post("/generate", generate)
        return app


@pytest.fixture
async def engine() -> Any:
    e = Engine()
    async with serve(e.app()) as url:
        e.url = url  # type: ignore[attr-defined]
        yield e


async def generate(url: str, prompt: list[int], temperature: float = 0.0) -> list[int]:
    body = {
        "rid": uuid.uuid4().hex,
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 32, "temperature": temperature},
    }
    headers = {"X-SMG-Routing-Key": BEARER, "Authorization": f"Bearer {BEARER}"}
    async with aiohttp.ClientSession() as client, client.post(url + "/generate", json=body, headers=headers) as r:
        return (await r.json())["output_ids"]


def _vcr(mode: str) -> Any:
    return configure_vcr(record_mode=mode, header=header())


async def test_once_records_a_tito_cassette_then_replays_it_ignoring_rid(engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "engine.tito"
    with _vcr("once").use_cassette(str(path)):
        first = await generate(engine.url, PROMPT_A)
    assert engine.hits == 1 and first == [101, EOS]
    cassette = read_cassette(path)
    name = session_digest(BEARER)
    (record,) = cassette.sessions[name].engine
    assert isinstance(record, EngineRecord) and record.request["input_ids"] == PROMPT_A
    assert record.response["output_ids"] == [101, EOS] and record.status == 200
    assert BEARER.encode() not in path.read_bytes()
    assert summarize(path).sessions[0].engine_exchanges == 1
    with _vcr("once").use_cassette(str(path)):
        again = await generate(engine.url, PROMPT_A)  # a new random rid: still a match
    assert again == first and engine.hits == 1


async def test_none_only_plays_back(engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "engine.tito"
    with _vcr("once").use_cassette(str(path)):
        await generate(engine.url, PROMPT_A)
    with _vcr("none").use_cassette(str(path)):
        assert await generate(engine.url, PROMPT_A) == [101, EOS]
        with pytest.raises(CannotOverwriteExistingCassetteException):
            await generate(engine.url, PROMPT_B)
        with pytest.raises(CannotOverwriteExistingCassetteException):  # sampling params are part of the match
            await generate(engine.url, PROMPT_A, temperature=0.5)
    assert engine.hits == 1


async def test_new_episodes_replays_known_and_appends_new_requests(engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "engine.tito"
    with _vcr("once").use_cassette(str(path)):
        await generate(engine.url, PROMPT_A)
    with _vcr("new_episodes").use_cassette(str(path)):
        assert await generate(engine.url, PROMPT_A) == [101, EOS]
        assert await generate(engine.url, PROMPT_B) == [102, EOS]
    assert engine.hits == 2
    records = read_cassette(path).sessions[session_digest(BEARER)].engine
    assert [r.request["input_ids"] for r in records] == [PROMPT_A, PROMPT_B]
    assert read_cassette(path).header.created == header().created  # the header survives re-saving


async def test_all_always_re_records(engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "engine.tito"
    with _vcr("once").use_cassette(str(path)):
        await generate(engine.url, PROMPT_A)
    with _vcr("all").use_cassette(str(path)):
        assert await generate(engine.url, PROMPT_A) == [102, EOS]
    assert engine.hits == 2
    (record,) = read_cassette(path).sessions[session_digest(BEARER)].engine
    assert record.response["output_ids"] == [102, EOS]


def test_unknown_record_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="record_mode"):
        configure_vcr(record_mode="sometimes")


async def test_a_mismatch_names_the_first_differing_token_with_the_decoded_text(engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "engine.tito"
    with _vcr("once").use_cassette(str(path)):
        await generate(engine.url, PROMPT_A)
    with _vcr("none").use_cassette(str(path)):
        with pytest.raises(CannotOverwriteExistingCassetteException) as tokens:
            await generate(engine.url, PROMPT_B)
        with pytest.raises(CannotOverwriteExistingCassetteException) as sampling:
            await generate(engine.url, PROMPT_A, temperature=0.5)
    message = str(tokens.value)
    assert "input_ids differ at token 8 (recorded 9 tokens, request 9)" in message
    assert (
        "recorded: …'<|im_start|>user\\nHello<|im_end|>\\n<|im_start|>assistant' | '\\n'  (ids from 8: [198])"
        in message
    )
    assert (
        "request: …'<|im_start|>user\\nHello<|im_end|>\\n<|im_start|>assistant' | 'atus'  (ids from 8: [1000])"
        in message
    )
    assert "in rendered message 1 (assistant" in message, message
    assert "sampling params differ: temperature: recorded 0.0, request 0.5" in str(sampling.value)


async def test_rewrite_records_anew_and_drops_what_the_old_cassette_held(engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "engine.tito"
    with _vcr("once").use_cassette(str(path)):
        await generate(engine.url, PROMPT_A)
        await generate(engine.url, PROMPT_B)
    with _vcr("rewrite").use_cassette(str(path)):  # pytest-recording's mode, as tito_vcr follows it
        assert await generate(engine.url, PROMPT_A) == [103, EOS]
    (record,) = read_cassette(path).sessions[session_digest(BEARER)].engine
    assert record.request["input_ids"] == PROMPT_A and record.response["output_ids"] == [103, EOS]
