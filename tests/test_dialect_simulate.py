"""A scenario recorded through a target in each engine dialect, and replayed from the cassette with no engine.

`tito simulate --target tests.gateway_double:<factory> --engine-dialect D` records `tests/scenarios/dialect_chat.yaml`
(two scripted chat sessions, SSE and JSON, tool loops) through the gateway double calling the fake engine in dialect
D: `sglang` (`/generate`, the double's default), `sglang-openai` (`/v1/chat/completions` with `input_ids`),
`vllm-openai` (`/v1/completions` with a token-id prompt, streamed) and `vllm-generate` (`/inference/v1/generate`,
streamed). The double trains on what it reads from each dialect's own fields; tito's normalized view must read the
same ids and logprobs back out of the cassette. Then `tito replay` through the same target: clean twice with
byte-identical samples, and failing, with the field or the first differing token named, once the gateway's engine
request changes. rllm's messages-in `vllm-openai` chat is tests/test_rllm_cassettes.py's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway_double import EXTRA_ENV
from tests.test_targets_record_replay import replay
from tito_rl.cassette.format.records import EngineRecord
from tito_rl.cassette.reader import Cassette, read_cassette
from tito_rl.trajectory.dialects.registry import record_view
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

# One worker runs this module (tests/xdist_groups.py): its module-scoped fixture is made once.
pytestmark = pytest.mark.xdist_group("dialect_simulate")

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "scenarios" / "dialect_chat.yaml"
# dialect -> (the double's factory, the engine path it calls, whether it streams that call)
DIALECTS = {
    "sglang": ("create", "/generate", False),
    "sglang-openai": ("create_sglang_openai", "/v1/chat/completions", False),  # SGLang refuses ids on a stream
    "vllm-openai": ("create_vllm_completions", "/v1/completions", True),
    "vllm-generate": ("create_vllm_generate", "/inference/v1/generate", True),
}
# the JSON session's system prompt: the one session the failing replays run
JSON_SESSION_PROMPT = "working in /work/env"


def target(dialect: str) -> str:
    return f"tests.gateway_double:{DIALECTS[dialect][0]}"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each dialect's cassette (and golden), recorded by `tito simulate` as a user runs it."""
    folder = tmp_path_factory.mktemp("dialects")
    out = {}
    for dialect in DIALECTS:
        cassette = folder / f"{dialect}.tito"
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "tito_rl",
                "simulate",
                "--scenario",
                str(SCENARIO),
                "--out",
                str(cassette),
                "--target",
                target(dialect),
                "--engine-dialect",
                dialect,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, f"{dialect}: {run.stdout[-2000:]}{run.stderr[-4000:]}"
        out[dialect] = cassette
    return out


def engine_calls(cassette: Cassette) -> dict[str, list[EngineRecord]]:
    return {name: [e for e in log.engine if isinstance(e, EngineRecord)] for name, log in cassette.sessions.items()}


def json_session(cassette: Cassette) -> str:
    """The JSON session's name (a digest of its id: the id was the agent's bearer token), told by its prompt."""
    tokenizer = load_tokenizer()
    (name,) = [
        name
        for name, calls in engine_calls(cassette).items()
        if JSON_SESSION_PROMPT in tokenizer.decode(record_view(calls[0]).prompt_ids or [])
    ]
    return name


@pytest.mark.parametrize("dialect", DIALECTS)
def test_each_dialect_records_its_engine_calls_under_that_dialect_on_its_path(
    recorded: dict[str, Path], dialect: str
) -> None:
    cassette = read_cassette(recorded[dialect])
    factory, path, streamed = DIALECTS[dialect]
    target_header = cassette.header.target
    assert target_header["ref"] == target(dialect) and target_header["settings"]["dialect"] == dialect
    calls = engine_calls(cassette)
    assert sorted(len(c) for c in calls.values()) == [2, 3]  # the JSON session's two turns, the SSE session's three
    for record in (r for rs in calls.values() for r in rs):
        assert (record.dialect, record.method, record.path, record.status) == (dialect, "POST", path, 200)
        assert record.headers.get("X-SMG-Routing-Key")  # routed as /generate is, in every dialect
        # a streamed OpenAI-style answer is kept chunk by chunk; the rest as the one body
        assert isinstance(record.response, list) is streamed, type(record.response)
    golden = recorded[dialect].with_suffix(".golden").read_text()
    assert f"stats (target {target(dialect)}): " in golden
    assert golden.count("== session ") == 2 and "live samples" in golden


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_view_reads_every_generation_as_the_gateway_trained_on_it(recorded: dict[str, Path], dialect: str) -> None:
    """Prompt ids, output ids and logprobs from `record_view`, for every call; each call's prompt + output is a
    prefix of one of the gateway's own samples, with the gateway's logprobs over its output: tito and the gateway
    read the same answer the same way, each from the dialect's own fields."""
    cassette = read_cassette(recorded[dialect])
    for name, calls in engine_calls(cassette).items():
        samples = cassette.sessions[name].samples
        assert samples and all(s["reward"] in (0.5, 1.0) for s in samples)
        for record in calls:
            view = record_view(record)
            assert view.dialect == dialect and not view.messages_in
            assert view.prompt_ids and view.output_ids and view.finish_reason in ("stop", "tool_calls")
            assert view.logprobs is not None and len(view.logprobs) == len(view.output_ids)
            assert all(isinstance(lp, float) and lp <= 0.0 for lp in view.logprobs)
            whole = view.prompt_ids + view.output_ids
            (sample,) = [s for s in samples if s["tokens"][: len(whole)] == whole]
            start = len(sample["tokens"]) - sample["response_length"]
            at = len(view.prompt_ids) - start
            assert sample["rollout_log_probs"][at : at + len(view.output_ids)] == view.logprobs
            assert sample["loss_mask"][at : at + len(view.output_ids)] == [1] * len(view.output_ids)


def test_every_dialect_carries_the_same_generations_and_goldens(recorded: dict[str, Path]) -> None:
    """One scripted engine, four APIs: the same prompts, outputs and logprobs, so the same samples."""

    def generations(dialect: str) -> dict[str, list[tuple]]:
        cassette = read_cassette(recorded[dialect])
        return {
            name: [(v.prompt_ids, v.output_ids, v.logprobs) for v in map(record_view, calls)]
            for name, calls in engine_calls(cassette).items()
        }

    def body(dialect: str) -> str:
        text = recorded[dialect].with_suffix(".golden").read_text()
        lines = [line for line in text.splitlines() if not line.startswith("#")]
        return "\n".join(lines).replace(target(dialect), "TARGET")

    assert (
        generations("sglang-openai")
        == generations("vllm-openai")
        == generations("vllm-generate")
        == generations("sglang")
    )
    assert body("sglang-openai") == body("vllm-openai") == body("vllm-generate") == body("sglang")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_replays_through_the_target_with_no_engine_twice_byte_identical(
    recorded: dict[str, Path], dialect: str, tmp_path: Path
) -> None:
    exports = []
    for n in (1, 2):
        out = tmp_path / f"samples{n}.jsonl"
        run = replay(str(recorded[dialect]), "--target", target(dialect), "--export-samples", str(out))
        assert run.returncode == 0, run.stdout + run.stderr
        assert "2 session(s): 2 ok, 0 failed" in run.stdout, run.stdout
        exports.append(out.read_bytes())
    assert exports[0] == exports[1]
    rows = [json.loads(line) for line in exports[0].decode().splitlines()]
    live = read_cassette(recorded[dialect])
    assert sorted((r["session"], r["tokens"]) for r in rows) == sorted(
        (name, s["tokens"]) for name, log in live.sessions.items() for s in log.samples
    )


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_changed_sampling_parameter_fails_the_replay_naming_the_field(
    recorded: dict[str, Path], dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = recorded[dialect]
    monkeypatch.setenv(EXTRA_ENV, json.dumps({"sampling": {"temperature": 0.5}}))
    run = replay(str(path), "--target", target(dialect), "--session", json_session(read_cassette(path)))
    assert run.returncode == 1, run.stdout + run.stderr
    if dialect == "sglang":
        assert "engine request differs: sampling params" in run.stdout, run.stdout
        assert "temperature: recorded None, replayed 0.5" in run.stdout
    else:
        field = "sampling_params.temperature" if dialect == "vllm-generate" else "temperature"
        assert f"engine request differs at {field}: recorded '<absent>', replayed 0.5" in run.stdout, run.stdout
        assert f"POST {DIALECTS[dialect][1]} ({dialect})" in run.stdout


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_changed_prompt_fails_the_replay_naming_the_first_differing_token(
    recorded: dict[str, Path], dialect: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = recorded[dialect]
    monkeypatch.setenv(EXTRA_ENV, json.dumps({"system_suffix": " Mind the time."}))
    run = replay(str(path), "--target", target(dialect), "--session", json_session(read_cassette(path)))
    assert run.returncode == 1, run.stdout + run.stderr
    ids = "input_ids" if dialect == "sglang" else "prompt ids"
    found = re.search(
        rf"engine request differs: {ids} at token (\d+) \(recorded (\d+) tokens, replayed (\d+)\)", run.stdout
    )
    assert found, run.stdout
    assert int(found[3]) > int(found[2])  # the suffix's tokens
    replayed = next(line for line in run.stdout.splitlines() if line.strip().startswith("replayed:"))
    assert "Be brief' | '. Mind the time." in replayed  # the differing token, decoded, where it differs
    assert "in rendered message 0 (system)" in run.stdout
