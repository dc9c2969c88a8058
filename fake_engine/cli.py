"""`tito fake-engine`: start the SGLang-compatible fake engine in one line.

tito fake-engine --demo
tito fake-engine --script fake_engine/examples/claude_tool_loop.yaml --port 30000
tito fake-engine --policy random --seed 7
"""

from __future__ import annotations

import argparse
import sys

import msgspec

from tito_rl.fake_engine.channels.moe import DEFAULT_MOE, MoeShape, config_shape
from tito_rl.fake_engine.faults import ALLOWED_STATUSES, FaultSchedule, FaultSpec
from tito_rl.fake_engine.openai.vllm_versions import VLLM_DEFAULT_VERSION, VLLM_PROFILES
from tito_rl.fake_engine.scenario_model import ScenarioError, validate
from tito_rl.fake_engine.sglang.responses import DEFAULT_PROFILE, PROFILES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--demo", action="store_true", help="answer every /generate with a short scripted reply")
    src.add_argument("--script", metavar="FILE", help="scenario file (YAML or JSON) for the scripted policy")
    src.add_argument("--cassette", metavar="FILE", help="serve the engine leg recorded in a cassette")
    src.add_argument(
        "--policy",
        choices=("random",),
        help="random: sample seeded tokens over the real vocabulary, honouring the sampling parameters",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="--policy random: the sampler's stream for requests without a seed"
    )
    parser.add_argument(
        "--listen",
        metavar="HOST:PORT",
        default=None,
        help="address to serve on, as for every tito server (default 127.0.0.1:30000)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (alias; default: loopback only)")
    parser.add_argument("--port", type=int, default=30000, help="port (alias)")
    parser.add_argument("--model-name", default="Qwen/Qwen3-8B", help="served model name")
    parser.add_argument(
        "--model-path",
        metavar="PATH",
        default=None,
        help="the model folder (or Hub id) /get_server_info and /get_model_info name, as SGLang's flag (default: "
        "the model name); a folder whose config.json states an MoE shape routes by it, as a real SGLang does",
    )
    parser.add_argument("--context-length", type=int, default=40960)
    parser.add_argument(
        "--version-profile",
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        help="SGLang release whose wire shapes to mimic",
    )
    parser.add_argument(
        "--router",
        action="store_true",
        help="act as the SGLang router: GET /workers, no /abort_request (worker at /worker0)",
    )
    parser.add_argument(
        "--incremental-streaming", action="store_true", help="stream deltas instead of cumulative chunks"
    )
    parser.add_argument("--max-running-requests", type=int, default=0, help="queue beyond this (0: no limit)")
    parser.add_argument("--tokenizer", default=None, help="Hugging Face tokenizer folder (default: Qwen3)")
    parser.add_argument(
        "--openai-dialect",
        choices=("sglang-openai", "vllm-openai"),
        default=None,
        help="answer /v1/chat/completions and /v1/completions as this engine (default: told by "
        "each request's SGLang-only fields); also picks GET /v1/models' shape",
    )
    v = parser.add_argument_group("vLLM as started (the vLLM dialects; docs/engine-dialects.md)")
    v.add_argument(
        "--vllm-version",
        choices=sorted(VLLM_PROFILES),
        default=VLLM_DEFAULT_VERSION,
        help="vLLM release whose wire shapes to mimic (default: the one the engine contract checked live)",
    )
    v.add_argument(
        "--no-scale-out",
        action="store_true",
        help="as vLLM started without --enable-scale-out: /inference/v1/generate answers 403",
    )
    v.add_argument(
        "--no-auto-tool-choice",
        action="store_true",
        help="as vLLM started without --enable-auto-tool-choice: tool_choice auto/required/named is a 400",
    )
    v.add_argument(
        "--no-reasoning-parser",
        action="store_true",
        help="as vLLM started without --reasoning-parser: the message's reasoning stays null",
    )
    c = parser.add_argument_group("per-token channels (docs/fake-engine.md)")
    c.add_argument(
        "--enable-return-routed-experts",
        action="store_true",
        help="as both engines' start flag: expert routes in answers (SGLang: when asked; vLLM: on every choice)",
    )
    c.add_argument(
        "--moe",
        metavar="LAYERS,TOP_K,EXPERTS",
        default=None,
        help="the model's MoE shape for the routes (default: the scenario's `moe:`, else the --model-path "
        "folder's config.json, else 2,2,8); it must agree with that config.json where both say",
    )
    c.add_argument("--weight-version", default="default", help="the weight version at start (SGLang's flag)")
    f = parser.add_argument_group("faults (applied to every /generate unless --fault-first/--fault-every)")
    f.add_argument("--fault-latency-ms", type=float, default=0.0)
    f.add_argument("--fault-token-delay-ms", type=float, default=0.0)
    f.add_argument("--fault-status", type=int, choices=sorted(ALLOWED_STATUSES))
    f.add_argument("--fault-drop-connection", action="store_true")
    f.add_argument("--fault-cut-stream-after", type=int, metavar="N")
    f.add_argument("--fault-finish-length", type=int, metavar="N")
    f.add_argument("--fault-abort-after", type=int, metavar="N")
    f.add_argument("--fault-restart-s", type=float, metavar="SECONDS")
    f.add_argument("--fault-drift", action="store_true", help="emit a non-canonical token split")
    f.add_argument(
        "--fault-drift-splits",
        type=int,
        default=1,
        metavar="N",
        help="with --fault-drift: split N tokens, spread over the output",
    )
    f.add_argument("--fault-routes-missing", action="store_true", help="routes asked and enabled: none sent")
    f.add_argument("--fault-routes-ignore-start", action="store_true", help="every route row, start_len ignored")
    f.add_argument("--fault-routes-dummy-row", action="store_true", help="the last generated token's row all 0")
    f.add_argument("--fault-routes-zero-padding", action="store_true", help="a padding row of expert 0, not -1")
    f.add_argument("--fault-routes-extra-rows", type=int, metavar="N", help="N route rows past the tokens")
    f.add_argument("--fault-stale-weight-version", action="store_true", help="answer an older weight version")
    f.add_argument("--fault-pause-after", type=int, metavar="N", help="pause the engine after N output tokens")
    f.add_argument("--fault-first", type=int, default=0, metavar="N", help="only the first N requests")
    f.add_argument("--fault-every", type=int, default=1, metavar="K", help="only every K-th request")


def fault_schedule(args: argparse.Namespace) -> FaultSchedule:
    """The --fault-* flags as a FaultSpec, checked by the model a scenario's `faults:` is (one-line errors)."""
    flags = {
        f.name: getattr(args, f"fault_{f.name}")
        for f in msgspec.structs.fields(FaultSpec)
        if hasattr(args, f"fault_{f.name}")
    }
    try:
        spec = validate(flags, FaultSpec)
    except ScenarioError as exc:
        flag, _, problem = str(exc).partition(": ")
        raise ScenarioError(f"--fault-{flag.replace('_', '-')}: {problem}") from None
    return FaultSchedule(spec=spec, first=args.fault_first, every=max(1, args.fault_every))


def model_moe(model_path: str | None, moe: MoeShape | None) -> MoeShape | None:
    """The shape to route by: as told, else as the `--model-path` folder's config.json states; a ValueError where
    both say and disagree (a real SGLang routes by its model's config, so the fake would answer what none could)."""
    stated = config_shape(model_path) if model_path else None
    if moe is not None and stated is not None and moe != stated:
        raise ValueError(f"--moe {moe} disagrees with {model_path}/config.json, which states {stated}")
    return moe or stated


def served_routes_shape(argv: list[str], scenario_moe: MoeShape | None = None) -> MoeShape | None:
    """The MoE shape a fake engine started with `argv` (its command line) routes by, `scenario_moe` being its
    scenario's `moe:`; None where it serves no routes (no `--enable-return-routed-experts`). For a caller that starts
    the fake and knows no model folder to tell its adapter the split by (`tito simulate`); a ValueError as `run`'s."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    add_arguments(parser)
    try:
        args, _ = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise ValueError(str(exc)) from None
    if not args.enable_return_routed_experts:
        return None
    return model_moe(args.model_path, MoeShape.parse(args.moe) if args.moe else scenario_moe) or DEFAULT_MOE


def run(args: argparse.Namespace) -> int:
    from tito_rl.trajectory.runtime.server_process import start_up_without_gc

    start_up_without_gc()
    from aiohttp import web

    from tito_rl.cassette.format.errors import CassetteError
    from tito_rl.fake_engine.app import EngineOptions, create_app
    from tito_rl.fake_engine.policies.cassette import CassettePolicy
    from tito_rl.fake_engine.policies.demo import demo_policy
    from tito_rl.fake_engine.policies.sampler.policy import RandomPolicy
    from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, load_scenario
    from tito_rl.fake_engine.policy import Policy
    from tito_rl.trajectory.adapters.serve import parse_listen
    from tito_rl.trajectory.runtime.server_process import new_event_loop, prepare_to_serve
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    if args.listen:
        args.host, args.port = parse_listen(args.listen)

    try:  # the engine's script, checked before the tokenizer loads: the same errors as tito record and simulate
        faults = fault_schedule(args)
        scenario = load_scenario(args.script) if args.script else None
        moe = MoeShape.parse(args.moe) if args.moe else scenario.moe_shape if scenario else None
        moe = model_moe(args.model_path, moe)
    except (OSError, ValueError) as e:
        print(f"tito fake-engine: {e}", file=sys.stderr)
        return 2
    tokenizer = load_tokenizer(args.tokenizer)
    policy: Policy
    try:
        if args.cassette:
            policy = CassettePolicy.load(args.cassette, args.tokenizer)
            if policy.truncated:
                print(
                    f"tito fake-engine: warning: {args.cassette} ends in a truncated record; "
                    "serving every complete exchange",
                    file=sys.stderr,
                )
            what = f"cassette {args.cassette}"
        elif args.demo:
            policy, what = demo_policy(tokenizer), "demo scenario"
        elif args.policy == "random":
            policy = RandomPolicy(tokenizer, seed=args.seed, context_length=args.context_length)
            what = f"random policy (seed {args.seed})"
        else:
            assert scenario is not None  # the source group is required: --script when not --demo or --cassette
            policy, what = ScriptedPolicy(scenario, tokenizer), f"scenario {scenario.name!r}"
    except (OSError, ValueError, CassetteError) as e:
        print(f"tito fake-engine: {e}", file=sys.stderr)
        return 2
    options = EngineOptions(
        model_name=args.model_name,
        model_path=args.model_path or args.model_name,
        context_length=args.context_length,
        version_profile=args.version_profile,
        incremental_streaming=args.incremental_streaming,
        router=args.router,
        max_running_requests=args.max_running_requests,
        tokenizer=tokenizer,
        vocab_size=max(len(tokenizer), 151936),
        faults=faults,
        host=args.host,
        port=args.port,
        openai_dialect=getattr(args, "openai_dialect", None),
        vllm_version=args.vllm_version,
        vllm_scale_out=not args.no_scale_out,
        vllm_auto_tool_choice=not args.no_auto_tool_choice,
        vllm_reasoning_parser=not args.no_reasoning_parser,
        weight_version=args.weight_version,
        return_routed_experts=args.enable_return_routed_experts,
    )
    if moe is not None:
        options.moe = moe
    print(
        f"tito fake-engine: {what} on http://{args.host}:{args.port} (SGLang {args.version_profile} "
        f"profile{', router mode' if args.router else ''})",
        flush=True,
    )
    app = create_app(policy, options)
    prepare_to_serve(app)
    web.run_app(app, host=args.host, port=args.port, print=None, loop=new_event_loop())
    return 0
