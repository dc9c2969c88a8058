"""tito's adapter in front of vLLM: `--engine-dialect vllm-generate` (`/inference/v1/generate`) and `vllm-openai`
(`/v1/completions` with a token-id prompt), against the fake engine on loopback.

Corpus scenarios (a tool loop, both OpenAI wires with a drop, a 529 and its retry, drift splits on every reply, a
client that walks away mid-generation) are recorded through the adapter calling the fake engine in each vLLM dialect,
then replayed in-process with no engine: every replay is clean, and renders exactly the golden the committed SGLang
recording of the same scenario has (only the engine path named by a wire event differs). So splicing, drift, retries,
aborts, overload statuses and the manager's samples hold in each dialect, as the same training data. The model name the
calls carry is the one the engine lists (`GET /v1/models`), never assumed.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.cassette_helpers import serve
from tests.scripted_support import SCENARIOS, record_scenario
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import Cassette, read_cassette
from tito_rl.cassette.writer import CassetteWriter
from tito_rl.fake_engine.app import EngineOptions
from tito_rl.fake_engine.app import create_app as create_engine
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, load_scenario, parse_scenario
from tito_rl.recorder.scripted.client import run_script
from tito_rl.recorder.scripted.script import load_client_script
from tito_rl.recorder.taps.proxy import build_header, create_recording_app
from tito_rl.replayer.audit.runner import audit_cassette
from tito_rl.replayer.goldens.files import parse, section
from tito_rl.replayer.inspection.gather import inspect_cassette
from tito_rl.replayer.replay.cassette_replay import replay_cassette_async
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.trajectory.adapters.app import AdapterSettings, create_app
from tito_rl.trajectory.adapters.engine.generate import DROPPED
from tito_rl.trajectory.dialects.registry import endpoint_of, is_generation, record_view
from tito_rl.trajectory.golden import TokenizerNames
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

# One worker runs this module (tests/xdist_groups.py): its module-scoped fixture is made once.
pytestmark = pytest.mark.xdist_group("adapter_vllm_dialects")

ROOT = Path(__file__).resolve().parent.parent
PATHS = {"vllm-generate": "/inference/v1/generate", "vllm-openai": "/v1/completions"}
SCENARIO_NAMES = ("tool_loop", "openai_wires", "retry_529", "drift_spliced", "client_abort")
MODEL = "tiny-qwen3"  # the fake engine's served model name here: the adapter must learn it, not assume "tito"
Recorded = dict[tuple[str, str], Path]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """Every scenario recorded through the adapter in each vLLM dialect (in-process, as `tito record` does); once
    for the whole run: xdist workers share the folder, the first records under a lock and the others read."""
    base = tmp_path_factory.getbasetemp()  # under xdist, each worker's: their parent is this run's
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "vllm-dialect-recordings"
    folder.mkdir(exist_ok=True)
    out: Recorded = {(d, n): folder / f"{n}-{d}.tito" for d in PATHS for n in SCENARIO_NAMES}

    async def record_all() -> None:
        for (dialect, name), path in out.items():
            path.unlink(missing_ok=True)
            _, results = await record_scenario(
                SCENARIOS / f"{name}.yaml", path, EngineOptions(model_name=MODEL), engine_dialect=dialect
            )
            assert all(r.ok for r in results), [r.line() for r in results]

    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "done").exists():
            asyncio.run(record_all())
            (folder / "done").touch()
    return out


def engine_calls(cassette: Cassette) -> list[EngineRecord]:
    return [e for log in cassette.sessions.values() for e in log.engine if isinstance(e, EngineRecord)]


def replayed_sections(path: Path) -> tuple[dict[str, str], list[Any]]:
    """The golden section of each session as this replay renders it, and the sessions' results."""
    result = asyncio.run(replay_cassette_async(path))
    names = TokenizerNames(load_tokenizer())
    return {s.session: section(s, names) for s in result.sessions}, result.sessions


@pytest.mark.parametrize("dialect", PATHS)
def test_every_generation_goes_to_the_dialects_route_with_the_served_model(recorded: Recorded, dialect: str) -> None:
    """vLLM's names and fields, never SGLang's; ids in, ids and one logprob per id out; the header keeps the
    dialect and the model the engine listed, so a replay calls the same way without asking."""
    for name in SCENARIO_NAMES:
        cassette = read_cassette(recorded[(dialect, name)])
        assert cassette.header.adapter["engine_dialect"] == dialect
        assert cassette.header.adapter["engine_model"] == MODEL
        generations = [e for e in engine_calls(cassette) if is_generation(e.path)]
        assert generations, name
        for record in generations:
            assert (record.dialect, record.path) == (dialect, PATHS[dialect])
            body = record.request or {}
            assert body["model"] == MODEL and body["request_id"] and "rid" not in body
            params = body["sampling_params"] if dialect == "vllm-generate" else body
            assert params["max_tokens"] > 0 and params["logprobs"] == 0
            assert params["skip_special_tokens"] is False and params["spaces_between_special_tokens"] is False
            assert "max_new_tokens" not in params and "no_stop_trim" not in params
            if dialect == "vllm-openai":
                assert body["return_token_ids"] is True and isinstance(body["prompt"], list)
            else:
                assert isinstance(body["token_ids"], list)
            if record.status == 200:
                view = record_view(record)
                assert view.output_ids is not None and view.logprobs is not None
                assert len(view.logprobs) == len(view.output_ids)


@pytest.mark.parametrize("name", SCENARIO_NAMES)
@pytest.mark.parametrize("dialect", PATHS)
def test_replays_clean_to_the_sglang_recordings_golden(recorded: Recorded, dialect: str, name: str) -> None:
    """The replay serves the engine leg from the cassette and compares every engine request, reply and sample; its
    golden is the committed SGLang recording's, word for word, but for the engine route a wire event names."""
    sections, results = replayed_sections(recorded[(dialect, name)])
    assert all(r.ok and not r.differences for r in results), [(r.session, r.differences) for r in results]
    assert all(r.exchanges for r in results if r.skipped is None)
    _, committed = parse((ROOT / "cassettes" / f"{name}.golden").read_text(encoding="utf-8"))
    assert set(sections) == set(committed)
    for session, text in sections.items():
        expected = committed[session].replace("engine /generate ", f"engine {PATHS[dialect]} ")
        if name == "client_abort":  # the partial output's length is the live abort's timing
            expected, text = (
                re.sub(r"(side\(kept out of the tree\)) tokens=\d+", r"\1 tokens=N", t) for t in (expected, text)
            )
        if name == "client_abort" and dialect == "vllm-openai":  # dropped, no partial output: see the abort test
            expected = expected.replace(
                "client gone mid-generation, engine request aborted",
                "client gone mid-generation, engine /v1/completions call dropped",
            )
            expected = expected.replace("side(kept out of the tree) tokens=N", "side(kept out of the tree)")
        assert text.rstrip("\n") == expected.rstrip("\n"), f"{name} {session}"


@pytest.mark.parametrize("dialect", PATHS)
def test_a_replay_whose_engine_request_changed_fails_naming_the_field_or_the_token(
    recorded: Recorded, dialect: str
) -> None:
    """The engine leg is compared, not only served: another seed is a difference at its JSON path; another chat
    template (a system prompt rendered otherwise) at the first differing prompt token, decoded."""
    path = recorded[(dialect, "tool_loop")]
    where = "sampling_params.seed" if dialect == "vllm-generate" else "seed"
    result = asyncio.run(replay_cassette_async(path, options=ReplayOptions(adapter={"engine_seed": 3})))
    (session,) = result.sessions
    (difference,) = session.differences
    assert difference.kind == "engine-request" and (difference.exchange, difference.turn) == (0, 0)
    assert difference.summary == f"engine request differs at {where}: recorded '<absent>', replayed 3"
    template = load_tokenizer().chat_template.replace("<|im_start|>system", "<|im_start|>system ", 1)
    result = asyncio.run(replay_cassette_async(path, options=ReplayOptions(adapter={"chat_template": template})))
    (difference,) = result.sessions[0].differences
    assert difference.kind == "engine-request" and difference.summary.startswith(
        "engine request differs: prompt ids at token 2 "
    )


@pytest.mark.parametrize("dialect", PATHS)
def test_a_529_reaches_the_agent_as_overloaded_and_its_retry_generates_once_more(
    recorded: Recorded, dialect: str
) -> None:
    cassette = read_cassette(recorded[(dialect, "retry_529")])
    (log,) = cassette.sessions.values()
    statuses = [a.status for a in log.agent]
    assert statuses == [200, 529, 200, 200]  # Anthropic's overloaded status, which Claude Code retries
    overloaded = json.loads(log.agent[1].reply_body or b"")
    assert overloaded["error"]["type"] == "overloaded_error"
    assert log.agent[2].retry_of == 1  # the identical body, generated again: the failed attempt recorded nothing
    assert [e.status for e in log.engine if is_generation(e.path)] == [200, 529, 200, 200]


@pytest.mark.parametrize("dialect", PATHS)
async def test_a_retry_of_a_completed_request_is_answered_from_the_first_reply(dialect: str) -> None:
    """The identical body again (a client that lost the reply) gets the same bytes, with no engine call and no new
    turn, so the tree stays one chain."""
    from tests.adapter_support import RecordingTap
    from tito_rl.trajectory.manager import TrajectoryManager

    tokenizer = load_tokenizer()
    engine = create_engine(
        ScriptedPolicy(parse_scenario({"name": "r", "turns": [{"text": "Once."}]}), tokenizer),
        EngineOptions(tokenizer=tokenizer, model_name=MODEL),
    )
    tap, manager = RecordingTap(), TrajectoryManager()
    body = json.dumps(
        {"model": "m", "max_tokens": 64, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    async with (
        serve(engine) as engine_url,
        serve(
            create_app(AdapterSettings(engine_url=engine_url, engine_dialect=dialect), manager, tap, warm=False)
        ) as url,
        aiohttp.ClientSession() as http,
    ):
        replies = []
        for _ in range(2):
            async with http.post(
                f"{url}/v1/chat/completions",
                data=body,
                headers={"Authorization": "Bearer again", "Content-Type": "application/json"},
            ) as resp:
                assert resp.status == 200
                replies.append(await resp.read())
    assert replies[0] == replies[1] and b"Once." in replies[0]
    assert [e[2].path for e in tap.engine] == [PATHS[dialect]]
    assert [(a[2].turn_index, a[2].retry_of) for a in tap.agent] == [(0, None), (0, 0)]
    assert manager.stats("again").turns == 1


def test_aborts_in_each_dialect(recorded: Recorded) -> None:
    """vLLM's generate route is aborted by name (`/inference/v1/abort_requests`, the engine's id for the request) and
    answers with its partial output, kept as an aborted side turn; `/v1/completions` has no abort route, so the call
    is dropped, which vLLM takes as an abort, and no partial output comes back."""
    calls = {}
    for dialect in PATHS:
        cassette = read_cassette(recorded[(dialect, "client_abort")])
        (log,) = cassette.sessions.values()
        assert [a.status for a in log.agent] == [200, 499, 200, 200]
        calls[dialect] = list(log.engine)
    generate = calls["vllm-generate"]
    aborts = [e for e in generate if endpoint_of(e.path) == "abort"]
    assert [(e.path, e.status) for e in aborts] == [("/inference/v1/abort_requests", 200)]
    aborted = [e for e in generate if is_generation(e.path) and record_view(e).finish_reason == "abort"]
    assert len(aborted) == 1
    rid = aborted[0].request["request_id"]
    assert aborts[0].request == {"request_ids": [f"generate-tokens-{rid}", rid]}
    assert 0 < len(record_view(aborted[0]).output_ids or []) < 40  # cut by the abort, mid-reply
    completions = calls["vllm-openai"]
    assert not [e for e in completions if endpoint_of(e.path) == "abort"]
    dropped = [e for e in completions if e.status == 0]
    assert [(e.path, e.error) for e in dropped] == [("/v1/completions", DROPPED)]


@pytest.mark.parametrize("dialect", PATHS)
def test_audit_finds_nothing_and_inspect_reads_every_exchange(recorded: Recorded, dialect: str) -> None:
    for name in SCENARIO_NAMES:
        audit = audit_cassette(recorded[(dialect, name)])
        fired = {rule: result.total for rule, result in audit.findings.rules.items() if result.fired}
        assert fired == {}, f"{name}: {fired}"
        assert audit.coverage == 1.0
    inspection = inspect_cassette(recorded[(dialect, "tool_loop")])
    (session,) = inspection.sessions
    assert not session.differences
    assert [row.finish for row in session.exchanges] == ["stop"] * 7  # each turn's engine finish, via the view
    assert all(row.prompt_tokens and row.output_tokens for row in session.exchanges)


@pytest.mark.parametrize("dialect", PATHS)
async def test_served_model_asked_before_the_first_generation_when_not_known(tmp_path: Path, dialect: str) -> None:
    """An adapter started before its engine (no model in the settings) asks `/v1/models` on the first turn; that
    lookup is no session's call, so the cassette has none, and a replay sends the name the recorded calls carry."""
    scenario = SCENARIOS / "retry_529.yaml"
    tokenizer = load_tokenizer()
    engine = create_engine(
        ScriptedPolicy(load_scenario(scenario), tokenizer), EngineOptions(tokenizer=tokenizer, model_name=MODEL)
    )
    settings = AdapterSettings(engine_dialect=dialect)
    out = tmp_path / "lazy.tito"
    writer = CassetteWriter(out, build_header(settings, None, {"client": "scripted"}))
    async with serve(engine) as engine_url:
        settings.engine_url = engine_url
        async with serve(create_recording_app(settings, writer)) as url:
            results = await run_script(load_client_script(scenario), url)
    assert all(r.ok for r in results)
    cassette = read_cassette(out)
    assert cassette.header.adapter["engine_model"] is None
    calls = engine_calls(cassette)
    assert not [e for e in calls if e.path.endswith("/v1/models")]
    assert {(e.request or {}).get("model") for e in calls if is_generation(e.path)} == {MODEL}
    result = await replay_cassette_async(out)
    assert all(s.ok and s.exchanges == 4 for s in result.sessions), [s.differences for s in result.sessions]


async def test_engine_errors_map_to_the_agents_statuses_and_a_missing_route_says_which_flag(tmp_path: Path) -> None:
    """A 4xx from the engine is the agent's 400, a 5xx its 502; vLLM without `--enable-scale-out` refuses the
    generate route (403), and the message names the fix."""
    tokenizer = load_tokenizer()
    scenario = parse_scenario(
        {
            "name": "errors",
            "after_last": "error",
            "turns": [{"text": "ok", "faults": {"status": 503, "message": "engine restarting"}, "fault_attempts": 1}],
        }
    )
    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    for dialect, wanted in (("vllm-generate", 502), ("vllm-openai", 502)):
        engine = create_engine(ScriptedPolicy(scenario, tokenizer), EngineOptions(tokenizer=tokenizer))
        async with (
            serve(engine) as engine_url,
            serve(create_app(AdapterSettings(engine_url=engine_url, engine_dialect=dialect), warm=False)) as url,
            aiohttp.ClientSession() as http,
        ):
            async with http.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer s"}
            ) as resp:
                assert resp.status == wanted
                assert "engine restarting" in (await resp.json())["error"]["message"]
            async with http.post(
                f"{url}/v1/chat/completions", json={**body, "max_tokens": 10**6}, headers={"Authorization": "Bearer s"}
            ) as resp:
                assert resp.status == 200  # capped at the context left, as on /generate
    # vLLM started without --enable-scale-out: its generate route is a 403 (the fake engine's `vllm_scale_out`)
    engine = create_engine(
        ScriptedPolicy(scenario, tokenizer), EngineOptions(tokenizer=tokenizer, vllm_scale_out=False)
    )
    async with (
        serve(engine) as engine_url,
        serve(create_app(AdapterSettings(engine_url=engine_url, engine_dialect="vllm-generate"), warm=False)) as url,
        aiohttp.ClientSession() as http,
        http.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": "Bearer s"}) as resp,
    ):
        assert resp.status == 400
        message = (await resp.json())["error"]["message"]
        assert "/inference/v1/generate failed (403)" in message and "--enable-scale-out" in message


def tito(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def test_tito_record_refuses_a_dialect_the_adapter_does_not_call_and_an_engine_it_cannot_ask(tmp_path: Path) -> None:
    run = tito(
        "record",
        "--engine",
        "http://127.0.0.1:9",
        "--engine-dialect",
        "sglang-openai",
        "--out",
        str(tmp_path / "x.tito"),
    )
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "tito record: --engine-dialect sglang-openai: tito's adapter calls the engine in "
        "sglang, vllm-generate, vllm-openai"
    )
    run = tito(
        "record", "--engine", "http://127.0.0.1:9", "--engine-dialect", "vllm-openai", "--out", str(tmp_path / "x.tito")
    )
    assert run.returncode == 2 and "cannot learn the engine's served model" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.tito").exists()
    run = tito("serve", "--engine", "http://127.0.0.1:9", "--engine-dialect", "sglang-openai")
    assert run.returncode == 2 and "invalid choice: 'sglang-openai'" in run.stderr


def test_tito_simulate_through_tito_in_a_vllm_dialect_then_replay_and_audit(tmp_path: Path) -> None:
    """As a user runs it: `tito simulate --target tito --engine-dialect vllm-generate` records through the adapter
    calling the fake engine's generate route, writes a golden equal to the SGLang recording's, and the cassette
    replays (exit 0) and audits clean with no engine."""
    out = tmp_path / "retry_529.tito"
    run = tito(
        "simulate",
        "--scenario",
        str(SCENARIOS / "retry_529.yaml"),
        "--out",
        str(out),
        "--target",
        "tito",
        "--engine-dialect",
        "vllm-generate",
    )
    assert run.returncode == 0, run.stderr[-3000:]
    header = read_cassette(out).header
    assert header.adapter["engine_dialect"] == "vllm-generate" and header.adapter["engine_model"] == "Qwen/Qwen3-8B"
    golden = out.with_suffix(".golden").read_text(encoding="utf-8")
    committed = (ROOT / "cassettes" / "retry_529.golden").read_text(encoding="utf-8")
    assert parse(golden)[1] == {
        k: v.replace("engine /generate ", "engine /inference/v1/generate ") for k, v in parse(committed)[1].items()
    }
    replay = tito("replay", str(out))
    assert replay.returncode == 0, replay.stdout + replay.stderr
    audit = tito("audit", str(out))
    assert audit.returncode == 0, audit.stdout + audit.stderr


def test_tito_serve_in_front_of_vllm_generate_names_the_model_it_learned() -> None:
    """`tito serve --engine-dialect vllm-generate` asks the engine for its model at start and says so."""
    import urllib.request

    from tests import process_helpers

    engine_port, port = process_helpers.free_port(), process_helpers.free_port()
    with (
        process_helpers.tito(
            "fake-engine",
            "--demo",
            "--listen",
            f"127.0.0.1:{engine_port}",
            ready=f"http://127.0.0.1:{engine_port}/health",
        ),
        process_helpers.tito(
            "serve",
            "--engine",
            f"http://127.0.0.1:{engine_port}",
            "--engine-dialect",
            "vllm-generate",
            "--listen",
            f"127.0.0.1:{port}",
            ready=f"http://127.0.0.1:{port}/health",
        ) as adapter,
    ):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            data=json.dumps({"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}]}).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer s"},
        )
        reply = json.load(urllib.request.urlopen(request, timeout=60))
        assert reply["choices"][0]["message"]["content"]
        code, output = process_helpers.stop(adapter)
    assert code == 0
    assert f"-> http://127.0.0.1:{engine_port} (vllm-generate, model Qwen/Qwen3-8B)" in output


@pytest.mark.parametrize(
    ("dialect", "answer", "says"),
    [
        ("vllm-generate", {"choices": []}, "returned a malformed body"),
        ("vllm-generate", {"choices": [{"logprobs": {"content": []}}]}, "returned no output token ids"),
        ("vllm-openai", {"choices": [{"text": "hi"}]}, "no output token ids (return_token_ids needs vLLM >= 0.10.2)"),
        (
            "vllm-generate",
            {"choices": [{"token_ids": [5, 6], "finish_reason": "length"}]},
            "returned no logprobs for 2 output ids",
        ),
        (
            "vllm-generate",
            {
                "choices": [
                    {
                        "token_ids": [5, 6],
                        "logprobs": {"content": [{"token_id": 5, "logprob": -0.5}, {"token_id": 7, "logprob": -0.1}]},
                    }
                ]
            },
            "token_ids disagree with the ids its logprobs name",
        ),
        (
            "vllm-openai",
            {"choices": [{"token_ids": [5], "prompt_token_ids": [0, 1, 2, 3], "logprobs": {"token_logprobs": [-0.5]}}]},
            "generated from other prompt ids than it was sent (4 returned, 3 sent)",
        ),
    ],
)
def test_an_answer_that_cannot_train_is_the_agents_502_saying_why(
    dialect: str, answer: dict[str, Any], says: str
) -> None:
    from tito_rl.trajectory.adapters.engine import vllm
    from tito_rl.trajectory.adapters.engine.generation import EngineError

    path, body = vllm.request(dialect, "r" * 32, [1, 2, 3], {"max_new_tokens": 2, "no_stop_trim": True}, MODEL)
    assert "no_stop_trim" not in json.dumps(body) and "max_new_tokens" not in json.dumps(body)
    with pytest.raises(EngineError) as failed:
        vllm.parse_answer(dialect, path, "r" * 32, body, answer)
    assert failed.value.status == 502 and says in failed.value.message


def test_a_good_answer_reads_as_the_generation_trained_on() -> None:
    from tito_rl.trajectory.adapters.engine import vllm

    path, body = vllm.request("vllm-generate", "r" * 32, [1, 2, 3], {"max_new_tokens": 2}, MODEL)
    generation = vllm.parse_answer(
        "vllm-generate",
        path,
        "r" * 32,
        body,
        {
            "choices": [
                {
                    "token_ids": [5, 6],
                    "finish_reason": "length",
                    "logprobs": {
                        "content": [
                            {"token_id": 5, "logprob": -0.5, "rank": 1},
                            {"token_id": 6, "logprob": -0.25, "rank": 2},
                        ]
                    },
                }
            ],
            "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
        },
    )
    assert (generation.output_ids, generation.output_log_probs, generation.finish_reason) == (
        [5, 6],
        [-0.5, -0.25],
        "length",
    )
    assert (generation.prompt_tokens, generation.cached_tokens) == (3, 2)
