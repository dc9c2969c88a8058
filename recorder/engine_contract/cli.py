"""The contract's make targets and its live form for any engine (docs/engine-dialects.md, "The contract").

    python -m tito_rl.recorder.engine_contract.cli check-fake [--engine sglang]   # make engine-contract (no engine)
      (SGLang: the dense model's answers, then the MoE's with expert routes, `sglang-0.5.23-routes.json`)
    python -m tito_rl.recorder.engine_contract.cli record [--engine sglang] --check-drift  # engine-contract-live
    python -m tito_rl.recorder.engine_contract.cli live --url URL [--mode full|bare]
    python -m tito_rl.recorder.engine_contract.cli live --engine sglang --url URL    # any running SGLang

`record` starts the real vLLM once per start mode (the real SGLang once, `--engine sglang`; `recorder/real_engine`),
sends the requests (listed, the field's, the options: `generated.py`) and writes the answers (`--check-drift`:
compares them with the committed ones first and fails on any structural difference, writing nothing). `live`
holds the fake engine to an engine already running at URL: the user's own vLLM started with the flags of one mode,
or an SGLang (`--engine sglang`, e.g. on a GPU machine); exit 0 when the fake engine answers every request with the
real one's structure (differences left out on purpose are counted, not failed), 1 on a difference, 2 when the
engine cannot be used. `--save FILE` keeps that engine's answers.
"""

from __future__ import annotations

import argparse
import sys

from tito_rl.recorder.engine_contract.answers import Recording, answers_path, load_recording
from tito_rl.recorder.engine_contract.exchange import Unreachable
from tito_rl.recorder.engine_contract.generated import all_requests
from tito_rl.recorder.engine_contract.requests import BARE, FULL, SGLANG, TOOLS
from tito_rl.recorder.engine_contract.runner import Verdict, base_values, check_fake, drift, record_live, served_model
from tito_rl.recorder.real_engine.paths import VLLM_VERSION
from tito_rl.recorder.real_engine.server import RealEngineError, RealVllmServer, StartFlags
from tito_rl.recorder.real_engine.sglang_paths import SGLANG_VERSION

MODE_FLAGS = {
    FULL: StartFlags(scale_out=True, tools=True, reasoning=True),
    TOOLS: StartFlags(scale_out=True, tools=True, reasoning=False),
    BARE: StartFlags(scale_out=False, tools=False, reasoning=False),
}


def say(line: str) -> None:
    print(line, flush=True)


def report(verdict: Verdict, against: str) -> int:
    for lines in verdict.differences.values():
        for line in lines:
            say(f"  {line}")
    for key, lines in verdict.left_out.items():
        say(f"  left out on purpose ({key}, docs/engine-dialects.md): {len(lines)} difference(s)")
    bad = len(verdict.differences)
    say(
        f"engine contract: {verdict.checked} requests sent, {bad} differ, {verdict.checked - bad} answered by the "
        f"fake engine with {against}'s structure"
    )
    return 0 if verdict.ok else 1


def record_recording(url: str | None, modes: list[str], engine: str = "vllm", version: str = VLLM_VERSION) -> Recording:
    """The contract's answers from the engine at `url` (one start mode), or from the real vLLM started per mode."""
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    tokenizer = load_tokenizer()
    requests = all_requests(engine)
    # The engine tap's dialect (as `--engine-dialect`): the engine's OpenAI one, for the paths that do not say theirs
    # (a model list, a completion with prompt ids, which SGLang and vLLM both serve).
    dialect = "sglang-openai" if engine == SGLANG else "vllm-openai"
    recording = Recording(
        engine=engine,
        version=version,
        start_flags={m: MODE_FLAGS[m].arguments() if m in MODE_FLAGS else [] for m in modes},
        values={},
    )
    for mode in modes:
        chosen = [r for r in requests if r.mode == mode]
        if url is not None:
            recording.values = recording.values or base_values(tokenizer, *served_model(url))
            recording.exchanges += record_live(url, chosen, recording.values, say, dialect)
            continue
        flags = " ".join(MODE_FLAGS[mode].arguments()) or "no flags"
        say(f"engine contract: starting the real vLLM ({mode}: {flags})")
        with RealVllmServer(MODE_FLAGS[mode]) as server:
            recording.values = recording.values or base_values(tokenizer, *served_model(server.url))
            recording.exchanges += record_live(server.url, chosen, recording.values, say, dialect)
    return recording


def record_sglang(url: str | None) -> Recording:
    """The real SGLang's answers to the contract: the dense tiny model started as the contract's SGLang mode."""
    from tito_rl.recorder.real_engine.sglang_answers import CONTRACT_START, record_contract
    from tito_rl.recorder.real_engine.sglang_server import RealSglangServer

    if url is not None:
        return record_contract(url, say)
    say(
        "engine contract: starting the real SGLang (the dense tiny Qwen3, --reasoning-parser qwen3 "
        "--tool-call-parser qwen25 --random-seed 7)"
    )
    with RealSglangServer(CONTRACT_START) as server:
        return record_contract(server.url, say)


def committed(engine: str) -> tuple[str, str]:
    """The engine and version of the committed answers `engine` names."""
    return (SGLANG, SGLANG_VERSION) if engine == SGLANG else ("vllm", VLLM_VERSION)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tito_rl.recorder.engine_contract.cli",
        description="Hold the fake engine to a real engine's answers.",
    )
    sub = parser.add_subparsers(dest="action", required=True)
    fake = sub.add_parser("check-fake", help="the fake engine against the committed real answers (no engine)")
    fake.add_argument("--engine", choices=("vllm", SGLANG), default="vllm", help="whose answers (default vllm)")
    fake.add_argument("--vllm-version", default=VLLM_VERSION, help="the recorded version to hold it to")
    rec = sub.add_parser("record", help="record the real engine's answers (starts it, once per start mode)")
    rec.add_argument("--engine", choices=("vllm", SGLANG), default="vllm", help="which real engine (default vllm)")
    rec.add_argument("--url", default=None, help="an engine already running (one mode; default: start the real one)")
    rec.add_argument("--mode", choices=(FULL, TOOLS, BARE), action="append", help="start modes (default: all)")
    rec.add_argument(
        "--check-drift",
        action="store_true",
        help="compare with the committed answers and fail on any structural difference; write nothing",
    )
    live = sub.add_parser("live", help="the fake engine against an engine running at URL")
    live.add_argument("--url", required=True)
    live.add_argument("--engine", choices=("vllm", SGLANG), default="vllm", help="what runs at URL (default vllm)")
    live.add_argument(
        "--mode",
        choices=(FULL, TOOLS, BARE),
        default=FULL,
        help="vLLM's start flags (full: scale-out, auto tool choice, qwen3 reasoning; tools: the same "
        "without reasoning; bare: none)",
    )
    live.add_argument("--save", default=None, metavar="FILE", help="also write that engine's answers to FILE")
    args = parser.parse_args(argv)
    try:
        if args.action == "check-fake":
            if args.engine == SGLANG:
                from tito_rl.recorder.real_engine.sglang_answers import ROUTES_VERSION

                dense = report(check_fake(load_recording(SGLANG, SGLANG_VERSION)), f"SGLang {SGLANG_VERSION}")
                moe = report(check_fake(load_recording(SGLANG, ROUTES_VERSION)), f"SGLang {SGLANG_VERSION}'s MoE")
                return max(dense, moe)
            return report(check_fake(load_recording("vllm", args.vllm_version)), f"vLLM {args.vllm_version}")
        if args.action == "live":
            mode = SGLANG if args.engine == SGLANG else args.mode
            recording = record_recording(args.url, [mode], args.engine, "live")
            if args.save:
                with open(args.save, "w", encoding="utf-8") as out:
                    out.write(recording.to_json())
            return report(check_fake(recording, vllm_version=VLLM_VERSION), args.url)
        if args.engine == SGLANG:
            recording = record_sglang(args.url)
        else:
            recording = record_recording(args.url, args.mode or [FULL, TOOLS, BARE])
        engine, version = committed(args.engine)
        if args.check_drift:
            held = load_recording(engine, version)
            recorded_modes = {e.request.mode for e in recording.exchanges}
            held.exchanges = [e for e in held.exchanges if e.request.mode in recorded_modes]  # `--mode`: those only
            found = drift(held, recording)
            for line in found:
                say(f"  {line}")
            say(
                f"engine contract: {len(recording.exchanges)} requests sent; "
                f"{'drift: ' + str(len(found)) + ' difference(s)' if found else 'no drift'} "
                f"from {answers_path(engine, version)}"
            )
            return 1 if found else 0
        path = answers_path(engine, version)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(recording.to_json(), encoding="utf-8")
        say(f"engine contract: {len(recording.exchanges)} answers written to {path}")
        return 0
    except (RealEngineError, FileNotFoundError, ValueError, Unreachable) as error:
        print(f"engine contract: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
