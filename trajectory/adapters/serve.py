"""`tito serve`: the adapter app standalone, in front of an SGLang or vLLM engine (or router, or fake engine)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from tito_rl.trajectory.adapters.app import AdapterSettings
from tito_rl.trajectory.adapters.engine.generate import ADAPTER_DIALECTS
from tito_rl.trajectory.adapters.side_requests import DEFAULT_SIDE_PATTERNS
from tito_rl.trajectory.dialects.view import SGLANG

ENGINE_DIALECT_HELP = (
    "the engine API tito's adapter calls: sglang (SGLang's /generate), vllm-generate (vLLM's "
    "/inference/v1/generate, started with --enable-scale-out) or vllm-openai (vLLM's "
    "/v1/completions with a token-id prompt and return_token_ids); default sglang "
    "(docs/engine-dialects.md)"
)


def add_arguments(parser: argparse.ArgumentParser, engine_dialect: bool = True) -> None:
    """`engine_dialect`: also `--engine-dialect` (tito record adds its own, which also names a foreign target's)."""
    d = AdapterSettings()
    parser.add_argument("--engine", required=True, help="engine base URL, e.g. http://127.0.0.1:30000")
    if engine_dialect:
        parser.add_argument("--engine-dialect", choices=ADAPTER_DIALECTS, metavar="DIALECT", help=ENGINE_DIALECT_HELP)
    parser.add_argument(
        "--engine-model",
        metavar="NAME",
        help="the served model a vLLM engine is called with (default: the first one its /v1/models lists)",
    )
    parser.add_argument(
        "--engine-seed",
        type=int,
        metavar="N",
        help="a sampling seed sent with every generation (vLLM's seed, SGLang's sampling_seed): the "
        "same session gives the same engine answers",
    )
    parser.add_argument(
        "--routes-layout",
        metavar="LAYERS,TOP_K",
        help="how SGLang's flat expert-route rows split (e.g. 48,8); default: learned from the config.json of the "
        "model the engine serves (its /get_server_info model_path), else of the tokenizer folder, else kept flat",
    )
    parser.add_argument("--listen", default="127.0.0.1:8400", help="HOST:PORT to serve on (default %(default)s)")
    parser.add_argument("--tokenizer", default=None, help="Hugging Face tokenizer folder (default: embedded Qwen3)")
    parser.add_argument("--tool-parser", default=d.tool_parser, help="sglang tool-call parser (default %(default)s)")
    parser.add_argument(
        "--reasoning-parser", default=d.reasoning_parser, help="sglang reasoning parser (default %(default)s)"
    )
    parser.add_argument("--context-length", type=int, default=d.context_length)
    parser.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    parser.add_argument("--model-name", default=d.model_name, help="name listed by GET /v1/models")
    parser.add_argument(
        "--no-preserve-reasoning",
        action="store_true",
        help="render history as the template does (drops earlier <think> blocks)",
    )
    parser.add_argument(
        "--no-splice",
        action="store_true",
        help="render the model's own history from text (re-tokenised) instead of splicing in its output ids",
    )
    parser.add_argument("--no-fold-system", action="store_true", help="keep mid-list system messages as they are")
    parser.add_argument(
        "--side-pattern",
        action="append",
        default=[],
        metavar="REGEX",
        help="also treat requests whose system prompt or first user message matches as side "
        "requests (answered, not trained; repeatable)",
    )
    parser.add_argument(
        "--no-default-side-patterns",
        action="store_true",
        help="drop the built-in title/summary patterns (structured-output requests stay side)",
    )
    parser.add_argument(
        "--fork-threshold",
        type=int,
        default=1024,
        metavar="TOKENS",
        help="manager: realign (not fork) when a diverging reply is shorter than this; 0 disables "
        "realign and rewrite merge (default %(default)s)",
    )
    parser.add_argument(
        "--reward-policy",
        choices=("full", "split"),
        default="full",
        help="manager: every sample gets the session's reward, or an even share (default %(default)s)",
    )


def options_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the adapter's option values that argparse does not check, in one line, or None."""
    from tito_rl.trajectory.adapters.engine.routes_layout import parse_routes_layout

    if getattr(args, "routes_layout", None) is not None:
        try:
            parse_routes_layout(args.routes_layout)
        except ValueError as exc:
            return str(exc)
    return None


def settings_from(args: argparse.Namespace) -> AdapterSettings:
    """The adapter's settings from checked options (`options_problem`)."""
    from tito_rl.trajectory.adapters.engine.routes_layout import parse_routes_layout

    layout = getattr(args, "routes_layout", None)
    return AdapterSettings(
        engine_url=args.engine,
        tokenizer_dir=args.tokenizer,
        tool_parser=args.tool_parser or None,
        reasoning_parser=args.reasoning_parser or None,
        context_length=args.context_length,
        default_max_tokens=args.default_max_tokens,
        model_name=args.model_name,
        preserve_reasoning=not args.no_preserve_reasoning,
        splice=not args.no_splice,
        fold_system=not args.no_fold_system,
        engine_dialect=args.engine_dialect or SGLANG,
        engine_model=args.engine_model,
        engine_seed=args.engine_seed,
        engine_routes_layout=parse_routes_layout(layout) if layout is not None else None,
        side_patterns=(() if args.no_default_side_patterns else DEFAULT_SIDE_PATTERNS) + tuple(args.side_pattern),
    )


def manager_from(args: argparse.Namespace) -> Any:
    from tito_rl.trajectory.manager import TrajectoryManager

    return TrajectoryManager(fork_threshold_tokens=args.fork_threshold, reward_policy=args.reward_policy)


async def learn_served_model(settings: AdapterSettings) -> str | None:
    """For a vLLM dialect without `--engine-model`: the served model asked of the engine into `settings` (and the
    context length capped at the engine's). Returns what went wrong, in one line, or None."""
    if settings.engine_dialect == SGLANG or settings.engine_model:
        return None
    from tito_rl.trajectory.adapters.engine.served_model import ServedModelError, fetch_served_model

    try:
        served = await fetch_served_model(settings.engine_url)
    except ServedModelError as exc:
        return f"cannot learn the engine's served model: {exc}"
    settings.engine_model = served.name
    if served.max_model_len is not None and served.max_model_len < settings.context_length:
        settings.context_length = served.max_model_len
    return None


async def learn_routes_layout(settings: AdapterSettings) -> str | None:
    """For SGLang without `--routes-layout`: how its route rows split, learned into `settings` (so a recording's
    header keeps it and a replay splits the same way without the model folder). Returns a line saying what was
    learned and from where, or None where the engine serves no routes, is not up (the adapter then learns it
    before its first generation, `EngineClient.serves_routes`), or nothing says."""
    if settings.engine_dialect != SGLANG or settings.engine_routes_layout is not None:
        return None
    from tito_rl.trajectory.adapters.engine.routes_layout import fetch_server_info, learned_layout

    layout = learned_layout(await fetch_server_info(settings.engine_url), settings.tokenizer_dir)
    if layout is None or layout.layers is None:
        return None
    settings.engine_routes_layout = (layout.layers, layout.top_k)
    return f"expert routes split as {layout.layers} layers x top {layout.top_k} ({layout.source}/config.json)"


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"--listen must be HOST:PORT, got {value!r}")
    return host or "127.0.0.1", int(port)


def run(args: argparse.Namespace) -> int:
    from tito_rl.trajectory.adapters.parsing import parser_process
    from tito_rl.trajectory.runtime.server_process import start_up_without_gc

    start_up_without_gc()
    host, port = parse_listen(args.listen)

    from aiohttp import web

    from tito_rl.trajectory.adapters.app import create_app
    from tito_rl.trajectory.runtime.server_process import new_event_loop, prepare_to_serve

    problem = options_problem(args)
    if problem:
        print(f"tito serve: {problem}", file=sys.stderr)
        return 2
    settings = settings_from(args)
    problem = asyncio.run(learn_served_model(settings))
    if problem:
        print(f"tito serve: warning: {problem}; it is asked again before the first generation", file=sys.stderr)
    learned = asyncio.run(learn_routes_layout(settings))
    if learned:
        print(f"tito serve: {learned}", file=sys.stderr)
    try:
        app = create_app(settings, manager_from(args))
    except ValueError as exc:  # an unknown parser, a chat template that does not parse or escapes its sandbox
        print(f"tito serve: {exc}", file=sys.stderr)
        return 2
    prepare_to_serve(app)
    background: set[Any] = set()

    async def take_over_parsers(_app: web.Application) -> None:
        import asyncio

        task = asyncio.ensure_future(parser_process.take_over())  # in process once loaded, while serving
        background.add(task)
        task.add_done_callback(background.discard)

    async def end_helper(_app: web.Application) -> None:
        parser_process.stop()

    app.on_startup.append(take_over_parsers)
    app.on_cleanup.append(end_helper)

    def listening(_aiohttp_banner: str) -> None:
        # Called by run_app once the socket listens: tito's own line in place of aiohttp's banner.
        model = f", model {settings.engine_model}" if settings.engine_model else ""
        print(
            f"tito serve: adapter on http://{host}:{port} -> {settings.engine_url} ({settings.engine_dialect}{model})",
            file=sys.stderr,
            flush=True,
        )

    web.run_app(app, host=host, port=port, loop=new_event_loop(), print=listening)
    return 0
