"""The real SGLang as a test tool: its stand-in for the compiled CPU ops, its pins and its start command (always, no
build needed), and, marked real_engine, the engine itself: `/generate` with logprobs, `tito check-engine` naming it
token-faithful, a tiny Qwen3-MoE's expert routes (shape, range, prefix-stable, `routed_experts_start_len`), and the
stand-in's hash held to SGLang's own triton kernel.

The marked tests run only under `make test-real-sglang` or `make test-real-engine` (TITO_REAL_ENGINE=1); elsewhere
they skip saying so.
"""

from __future__ import annotations

import ast
import base64
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
from array import array
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.real_engine_support import RealEngines
from tito_rl.recorder.engine_contract.answers import Recording, load_recording
from tito_rl.recorder.engine_contract.check import check_engine
from tito_rl.recorder.engine_contract.exchange import send
from tito_rl.recorder.engine_contract.generated import all_requests
from tito_rl.recorder.engine_contract.runner import drift
from tito_rl.recorder.real_engine import sglang_build
from tito_rl.recorder.real_engine.build import weights_digest
from tito_rl.recorder.real_engine.server import RealEngineError
from tito_rl.recorder.real_engine.sglang_answers import (
    CONTRACT_START,
    NEW_TOKENS,
    RANDOM_SEED,
    ROUTES,
    ROUTES_VERSION,
    record_contract,
    route_requests,
)
from tito_rl.recorder.real_engine.sglang_answers import record as record_routes
from tito_rl.recorder.real_engine.sglang_paths import (
    HOME_ENV,
    REQUIREMENTS,
    ROUTED_EXPERTS_FLAG,
    SERVED_NAMES,
    SGLANG_VERSION,
    STANDIN,
    TORCH_PINS,
    ReadySglang,
    SglangStart,
    model_dir,
    read_ready,
    requirement_pins,
    server_command,
    server_env,
    shell_start_command,
    venv_dir,
)
from tito_rl.recorder.real_engine.sglang_server import RealSglangServer
from tito_rl.trajectory.dialects.view import SGLANG
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

STANDIN_FILE = STANDIN / "sgl_kernel.py"
MOE = SglangStart(moe=True)
LAYERS, TOP_K, EXPERTS = 2, 2, 8  # the tiny Qwen3-MoE (recorder/real_engine/tiny_qwen3.py)
# SGLang's modules that import compiled CPU ops at module load on the serving path (dense and MoE, no speculation).
CPU_IMPORTERS = (
    "kernels/ops/kvcache/cache_move.py",
    "srt/mem_cache/allocation.py",
    "kernels/ops/speculative/spec_tree.py",
    "kernels/ops/speculative/cache_locs.py",
    "kernels/ops/speculative/eagle.py",
    "kernels/ops/speculative/multi_layer_eagle.py",
)
# SGLang's declared dependencies that are GPU builds or GPU-only: none may be in the pins.
GPU_PACKAGES = {
    "cuda-python",
    "flash-attn-4",
    "flashinfer-python",
    "humming-kernels",
    "kernels",
    "nvidia-cutlass-dsl",
    "nvidia-mathdx",
    "nvidia-ml-py",
    "nvshmem4py-cu13",
    "quack-kernels",
    "sgl-deep-ep",
    "sgl-deep-gemm",
    "sgl-flash-mla",
    "sgl-kernel",
    "sglang-kernel",
    "tilelang",
    "torch-memory-saver",
    "torchaudio",
    "torchcodec",
}


def standin() -> ModuleType:
    """The stand-in as tito's Python reads it (no torch here: the op is not registered, the arithmetic is there)."""
    return importlib.import_module("tito_rl.recorder.real_engine.sgl_kernel_standin.sgl_kernel")


def sglang_source() -> Path:
    spec = importlib.util.find_spec("sglang")  # installed beside tito for its parsers, at the same version
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def routes_of(answer: dict) -> list[list[list[int]]]:
    """`meta_info.routed_experts`: base64 of raw little-endian int32, rows of [layers][top_k]."""
    flat = array("i", base64.b64decode(answer["meta_info"]["routed_experts"]))
    assert sys.byteorder == "little"
    per_row = LAYERS * TOP_K
    assert len(flat) % per_row == 0
    return [
        [list(flat[r + layer * TOP_K : r + (layer + 1) * TOP_K]) for layer in range(LAYERS)]
        for r in range(0, len(flat), per_row)
    ]


def generate(url: str, ids: list[int], max_new: int, **extra: object) -> dict:
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True},
        **extra,
    }
    answer = send(url, "POST", "/generate", body)
    assert answer.status == 200, answer.body or answer.text
    assert isinstance(answer.body, dict)
    return answer.body


def ready_at(home: Path) -> ReadySglang:
    python = home / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    models = {}
    for kind in ("dense", "moe"):
        folder = home / kind
        folder.mkdir()
        (folder / "config.json").write_text("{}")
        models[kind] = str(folder)
    ready = ReadySglang(
        python=str(python),
        standin=str(STANDIN),
        models=models,
        model_sha256={kind: "0" * 64 for kind in models},
        sglang_version=SGLANG_VERSION,
        env={},
    )
    (home / "READY").write_text(ready.to_json())
    return ready


# ---- always: the stand-in, the pins, the commands -----------------------------------------------------------------


def test_the_standin_defines_every_op_sglang_imports_on_the_cpu():
    """Each module SGLang loads while serving imports its CPU ops from sgl_kernel at load, with no fallback: every
    name so imported (under an `is_cpu` test) is one the stand-in defines."""
    tree = ast.parse(STANDIN_FILE.read_text())
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    defined |= {
        t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)
    }
    wanted: dict[str, str] = {}
    for relative in CPU_IMPORTERS:
        module = ast.parse((sglang_source() / relative).read_text())
        found = [
            alias.name
            for branch in module.body
            for node in ast.walk(branch)
            if isinstance(node, ast.If) and "cpu" in ast.unparse(node.test)
            for statement in node.body
            if isinstance(statement, ast.ImportFrom) and statement.module == "sgl_kernel"
            for alias in statement.names
        ]
        assert found, f"{relative} no longer imports CPU ops from sgl_kernel at load"
        wanted |= dict.fromkeys(found, relative)
    missing = sorted(f"{name} ({where})" for name, where in wanted.items() if name not in defined)
    assert not missing, missing
    murmur = (sglang_source() / "kernels/ops/sampling/murmur_hash.py").read_text()
    assert "torch.ops.sgl_kernel.murmur_hash32_cpu.default(" in murmur
    assert (
        '"murmur_hash32_cpu(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor"' in STANDIN_FILE.read_text()
    )


def test_the_hash_is_murmurhash3_x86_32():
    """MurmurHash3's published vectors, then SGLang's message: seed low and high words, position, column."""
    module = standin()
    word = int.from_bytes(b"test", "little")
    assert module.murmur3_32([]) == 0 and module.murmur3_32([], seed=1) == 0x514E28B7
    assert module.murmur3_32([0]) == 0x2362F9DE and module.murmur3_32([0xFFFFFFFF]) == 0x76293B50
    assert module.murmur3_32([word]) == 0xBA6BD213 and module.murmur3_32([word], seed=0x9747B28C) == 0x704B81DC
    seed = 0x0123456789ABCDEF
    assert module.murmur_hash32_value(seed, 7, 151000) == module.murmur3_32([0x89ABCDEF, 0x01234567, 7, 151000])
    # A negative int64 seed hashes as its unsigned bits, as the kernel's cast to uint64 reads it.
    assert module.murmur_hash32_value(-2, 0, 0) == module.murmur3_32([0xFFFFFFFE, 0xFFFFFFFF, 0, 0])


def test_speculative_ops_refuse_in_one_line_and_host_memory_calls_succeed():
    module = standin()
    assert module.torch is None  # tito's environment: nothing registered, nothing patched
    for name in module.SPECULATIVE_OPS:
        with pytest.raises(NotImplementedError) as refused:
            getattr(module, name)(1, 2)
        assert str(refused.value).startswith(f"sgl_kernel.{name}: ") and "\n" not in str(refused.value)
    calls = module.HostMemoryCalls()
    assert (calls.cudaHostRegister(4096, 64, 0), calls.cudaHostUnregister(4096)) == (0, 0)


def test_the_pins_cover_sglangs_runtime_dependencies_and_no_gpu_package():
    """Every dependency SGLang 0.5.23 declares for Linux x86_64 (no extra) is pinned exactly, at a version it
    accepts, unless it is a GPU package or torch's (installed first, with its own dependencies)."""
    pins = {}
    for line in requirement_pins(REQUIREMENTS):
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", line), f"not an exact pin: {line}"
        name, version = line.split("==")
        assert canonicalize_name(name) not in pins, f"pinned twice: {name}"
        pins[canonicalize_name(name)] = version
    assert not GPU_PACKAGES & set(pins), sorted(GPU_PACKAGES & set(pins))
    torch_side = {canonicalize_name(pin.split("==")[0]) for pin in TORCH_PINS}
    assert not torch_side & set(pins) and "sglang" not in pins
    assert importlib.metadata.version("sglang") == SGLANG_VERSION
    environment = {"sys_platform": "linux", "platform_machine": "x86_64", "extra": ""}
    unmet = []
    for text in importlib.metadata.requires("sglang") or []:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        if name in GPU_PACKAGES or name in torch_side:
            continue
        if name not in pins or not requirement.specifier.contains(pins[name], prereleases=True):
            unmet.append(f"{text} (pinned: {pins.get(name)})")
    assert not unmet, unmet
    assert len(pins) > 100  # their own dependencies too: --no-deps installs nothing else


def test_the_server_command_serves_a_tiny_model_on_loopback_with_the_standin(tmp_path):
    ready = ready_at(tmp_path)
    argv = server_command(ready, 30123, MOE)
    assert argv[:3] == [ready.python, "-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == ready.models["moe"]
    assert argv[argv.index("--served-model-name") + 1] == SERVED_NAMES["moe"]
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "30123"
    pairs = dict(zip(argv[::2], argv[1::2], strict=False)) | dict(zip(argv[1::2], argv[2::2], strict=False))
    assert pairs["--device"] == "cpu" and pairs["--attention-backend"] == "torch_native"
    assert pairs["--sampling-backend"] == "pytorch" and pairs["--dtype"] == "bfloat16"
    assert argv[-1] == "--enable-return-routed-experts" and "--random-seed" not in argv
    dense = server_command(ready, 30123, SglangStart(random_seed=4))
    assert "--enable-return-routed-experts" not in dense and dense[-2:] == ["--random-seed", "4"]
    parsers = server_command(ready, 30123, SglangStart(parsers=True))
    assert parsers[-4:] == ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25"]
    assert SglangStart(moe=True, random_seed=7, parsers=True).label() == "moe-seed7-parsers"
    env = server_env(ready)
    assert env["PYTHONPATH"] == str(STANDIN) and env["SGLANG_USE_CPU_ENGINE"] == "1" and env["OMP_NUM_THREADS"] == "1"
    line = shell_start_command(ready)
    assert line.startswith("env ") and f"PYTHONPATH={STANDIN}" in line and "--port 30000" in line


def test_ready_names_a_built_engine_and_nothing_else(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    assert read_ready() is None
    ready = ready_at(tmp_path)
    assert read_ready() == ready
    (Path(ready.models["moe"]) / "config.json").unlink()
    assert read_ready() is None  # READY naming a model that is gone
    (tmp_path / "READY").write_text("[]")
    assert read_ready() is None


def test_an_unbuilt_sglang_skips_in_one_line_and_cannot_start(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    with pytest.raises(pytest.skip.Exception) as skipped:
        RealEngines().sglang(MOE)
    assert str(skipped.value) == f"the real SGLang is not built in {tmp_path}: run `make real-sglang`"
    with pytest.raises(RealEngineError, match="run `make real-sglang`"):
        RealSglangServer(MOE)


def test_a_server_that_dies_while_starting_says_why_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    ready = ready_at(tmp_path)
    Path(ready.python).write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named sgl_kernel' >&2\nexit 1\n")
    Path(ready.python).chmod(0o755)
    with pytest.raises(RealEngineError) as failed:
        RealSglangServer(MOE, start_timeout_s=30).start()
    message = str(failed.value)
    assert "\n" not in message and "the real SGLang exited with 1 while starting: ModuleNotFoundError" in message


def test_build_writes_ready_once_and_then_reuses_it(tmp_path, monkeypatch):
    """The build's bookkeeping with its slow steps stood in for: READY names both models, and a second build runs
    no step at all."""
    steps: list[str] = []

    def venv(home: Path, quiet: bool) -> Path:
        steps.append("venv")
        python = home / "venv" / "bin" / "python"
        python.parent.mkdir(parents=True, exist_ok=True)
        python.write_text("")
        stamp = venv_dir(home) / sglang_build.INSTALLED_STAMP
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text("\n".join(sglang_build.install_lines()) + "\n")
        return python

    def model(home: Path, python: Path, kind: str, seed: int, quiet: bool) -> Path:
        steps.append(f"{kind} {seed}")
        folder = model_dir(home, kind, seed)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text("{}")
        (folder / "model.safetensors").write_bytes(kind.encode())
        return folder

    monkeypatch.setattr(sglang_build, "ensure_venv", venv)
    monkeypatch.setattr(sglang_build, "ensure_model", model)
    ready = sglang_build.build(tmp_path, seed=5, quiet=True)
    assert steps == ["venv", "dense 5", "moe 5"]
    assert read_ready(tmp_path) == ready and ready.models["moe"] == str(tmp_path / "tiny-qwen3-moe-seed5")
    assert ready.model_sha256["dense"] == weights_digest(tmp_path / "tiny-qwen3-seed5")
    assert ready.start_command.endswith("--mem-fraction-static 0.05")
    assert sglang_build.build(tmp_path, seed=5, quiet=True) == ready and len(steps) == 3


# ---- the real SGLang (make test-real-sglang) ------------------------------------------------------------------


@pytest.mark.real_engine
def test_generate_answers_with_logprobs(real_engines):
    server = real_engines.sglang()
    prompt = list(load_tokenizer().encode("The capital of France is", add_special_tokens=False))
    answer = generate(server.url, prompt, 6, return_logprob=True, logprob_start_len=0)
    meta = answer["meta_info"]
    assert len(answer["output_ids"]) == 6 and meta["completion_tokens"] == 6 and meta["prompt_tokens"] == len(prompt)
    assert [entry[1] for entry in meta["output_token_logprobs"]] == answer["output_ids"]
    assert all(entry[0] <= 0.0 for entry in meta["output_token_logprobs"])
    assert meta["input_token_logprobs"][0] == [None, prompt[0], None]
    assert [entry[1] for entry in meta["input_token_logprobs"]] == prompt
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    again = generate(server.url, prompt, 6, return_logprob=True)
    assert again["output_ids"] == answer["output_ids"]  # greedy repeats


@pytest.mark.real_engine
def test_check_engine_names_sglang_token_faithful(real_engines):
    server = real_engines.sglang()
    report = check_engine(server.url)
    assert "sglang" in report.faithful, [check.line() for check in report.checks]
    assert report.model == SERVED_NAMES["dense"]


@pytest.mark.real_engine
def test_a_real_moe_returns_its_expert_routes(real_engines):
    """Rows for every token but the last sampled one, top-2 of 8 experts at each of 2 layers; the same prefix routes
    the same in a longer request (cached or recomputed after /flush_cache); `routed_experts_start_len` drops rows."""
    server = real_engines.sglang(MOE)
    prompt = list(load_tokenizer().encode("Route these ten tokens through the experts now", add_special_tokens=False))
    first = generate(server.url, prompt, 5, return_routed_experts=True)
    routes = routes_of(first)
    assert len(routes) == len(prompt) + 5 - 1
    assert all(0 <= e < EXPERTS for row in routes for layer in row for e in layer)
    assert all(len(set(layer)) == TOP_K for row in routes for layer in row)
    assert len({tuple(map(tuple, row)) for row in routes}) > 1  # the routes depend on the token
    extended = prompt + first["output_ids"] + prompt[:3]
    longer = generate(server.url, extended, 4, return_routed_experts=True)
    assert routes_of(longer)[: len(routes)] == routes and len(routes_of(longer)) == len(extended) + 4 - 1
    assert send(server.url, "POST", "/flush_cache").status == 200
    assert routes_of(generate(server.url, prompt, 5, return_routed_experts=True)) == routes
    for start in (3, len(prompt)):
        cut = generate(server.url, prompt, 5, return_routed_experts=True, routed_experts_start_len=start)
        assert routes_of(cut) == routes[start:]
    assert "routed_experts" not in generate(server.url, prompt, 2)["meta_info"]  # only when asked


@pytest.mark.real_engine
def test_the_standins_hash_equals_sglangs_triton_kernel(tmp_path):
    """The stand-in's murmur_hash32_cpu against SGLang's own triton kernel, run by triton's interpreter on the CPU."""
    ready = read_ready()
    if ready is None:
        pytest.skip("the real SGLang is not built: run `make real-sglang`")
    script = tmp_path / "compare.py"
    script.write_text(
        "import torch, sgl_kernel\n"
        "from sglang.kernels.ops.sampling.murmur_hash import murmur_hash32_kernel\n"
        "seed = torch.tensor([0, 1, 2**40 + 7, -5, 2**63 - 1], dtype=torch.int64)\n"
        "pos = torch.tensor([0, 3, 17, 8191, 123456], dtype=torch.int64)\n"
        "cols = torch.arange(0, 151669, 997, dtype=torch.int64)\n"
        "mine = torch.ops.sgl_kernel.murmur_hash32_cpu.default(seed, pos, cols)\n"
        "theirs = torch.empty((5, cols.numel()), dtype=torch.uint32)\n"
        "murmur_hash32_kernel[(5, 1)](seed, pos, cols, theirs, 5, cols.numel(), BLOCK_SIZE=256)\n"
        "print(mine.dtype, tuple(mine.shape), torch.equal(mine.to(torch.int64), theirs.to(torch.int64)))\n"
    )
    run = subprocess.run(
        [ready.python, str(script)],
        env={**server_env(ready), "TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["torch.uint32", "(5,", "153)", "True"]


@pytest.mark.real_engine
def test_the_moe_model_rebuilds_byte_for_byte_from_its_seed(tmp_path):
    ready = read_ready()
    if ready is None:
        pytest.skip("the real SGLang is not built: run `make real-sglang`")
    script = Path(sglang_build.__file__).with_name("tiny_qwen3.py")
    seed = int((Path(ready.models["moe"]) / ".tito-model-complete").read_text().split()[1])  # "seed N moe"
    tokenizer = Path(ready.models["moe"])  # its tokenizer files are the embedded ones
    subprocess.run(
        [ready.python, str(script), str(tmp_path), str(tokenizer), str(seed), "moe"],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert weights_digest(tmp_path) == ready.model_sha256["moe"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["num_hidden_layers"]) == (8, 2, 2)


def routes_answers() -> Recording:
    return load_recording(SGLANG, ROUTES_VERSION)


def test_the_committed_route_answers_are_what_sglang_sent():
    """The committed answers (make real-sglang-answers) as the fake engine's routes will be held to them: every
    request answered 200 through tito's tap, routes of the documented shape where asked, none where not."""
    recording = routes_answers()
    assert [e.request.name for e in recording.exchanges] == [r.name for r in route_requests()]
    assert all(e.answer.status == 200 for e in recording.exchanges)
    assert ROUTED_EXPERTS_FLAG in recording.start_flags[ROUTES]
    by_name = {e.request.name: e.answer for e in recording.exchanges}
    prompt = recording.values["$prompt_ids"]
    full = routes_of(by_name["generate routes"].body)
    assert len(full) == len(prompt) + NEW_TOKENS - 1
    assert routes_of(by_name["generate routes from 3"].body) == full[3:]
    assert routes_of(by_name["generate routes longer prompt"].body)[: len(prompt)] == full[: len(prompt)]
    chunks = by_name["generate routes sse"].chunks
    assert chunks[-1] == "[DONE]" and routes_of(chunks[-2]) == full
    # Streamed, only the last chunk carries the routes (not cumulatively in every chunk, as the other fields are).
    assert not any("routed_experts" in chunk["meta_info"] for chunk in chunks[:-2])
    assert "routed_experts" not in by_name["generate routes not asked"].body["meta_info"]
    # The OpenAI route: at the answer's root, `sglext.routed_experts`, over the rendered chat prompt and the output.
    chat = by_name["chat routes"].body
    rows = routes_of({"meta_info": chat["sglext"]})
    assert len(rows) == chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"] - 1
    # miles' chat calls (return_meta_info with routes, token ids in): the routes in the choice's meta_info instead,
    # none at the root, over miles' own prompt ids (taken over its messages) and the output.
    miles = [e for e in recording.exchanges if e.request.name.startswith("field miles_moe ")]
    assert miles
    for exchange in miles:
        body, prompt_ids = exchange.answer.body, (exchange.request.body or {})["input_ids"]
        meta = body["choices"][0]["meta_info"]
        assert "sglext" not in body and meta["prompt_tokens"] == len(prompt_ids)
        assert len(routes_of(body["choices"][0])) == len(prompt_ids) + meta["completion_tokens"] - 1
        assert len(meta["output_token_logprobs"]) == meta["completion_tokens"] and "weight_version" in meta


@pytest.mark.real_engine
def test_the_committed_route_answers_repeat_live(real_engines):
    """Re-recorded live, the MoE answers as committed: the same structure, token ids and routes."""
    server = real_engines.sglang(SglangStart(moe=True, random_seed=RANDOM_SEED))
    committed = routes_answers()
    live = record_routes(server.url)
    assert drift(committed, live) == []
    for old, new in zip(committed.exchanges, live.exchanges, strict=True):
        if isinstance(old.answer.body, dict) and "meta_info" in old.answer.body:
            assert new.answer.body["output_ids"] == old.answer.body["output_ids"], old.request.name
            assert new.answer.body["meta_info"].get("routed_experts") == old.answer.body["meta_info"].get(
                "routed_experts"
            ), old.request.name
        elif old.request.name.startswith("field miles_moe "):  # the chat choice's meta_info (return_meta_info)
            was, now = old.answer.body["choices"][0]["meta_info"], new.answer.body["choices"][0]["meta_info"]
            assert [t[1] for t in now["output_token_logprobs"]] == [t[1] for t in was["output_token_logprobs"]]
            assert now["routed_experts"] == was["routed_experts"], old.request.name


def contract_answers() -> Recording:
    return load_recording(SGLANG, SGLANG_VERSION)


def test_the_committed_contract_answers_are_the_real_sglangs():
    """The engine contract's SGLang requests (listed, the field's, the options) as the real SGLang answered them
    (make real-sglang-answers): every request answered, the errors where the contract asks for them, and the ids of
    a greedy /generate known."""
    recording = contract_answers()
    assert [e.request.name for e in recording.exchanges] == [r.name for r in all_requests(SGLANG)]
    status = {e.request.name: e.answer.status for e in recording.exchanges}
    errors = {"generate empty input_ids", "generate over-long", "generate unknown sampling key"}
    assert all(status[name] == 400 for name in errors), status
    assert all(status[name] == 200 for name in ("models", "generate json", "generate sse", "completions ids"))
    generate = next(e.answer.body for e in recording.exchanges if e.request.name == "generate json")
    assert len(generate["output_ids"]) == len(generate["meta_info"]["output_token_logprobs"])
    assert recording.values["$model"] == SERVED_NAMES["dense"]


@pytest.mark.real_engine
def test_no_drift_from_the_committed_contract_answers(real_engines):
    server = real_engines.sglang(CONTRACT_START)
    assert drift(contract_answers(), record_contract(server.url)) == []
