"""`tito record`: the adapter app as a recording proxy in front of a live engine, writing cassettes.

    tito record --engine http://sglang:30000 --listen 127.0.0.1:8400 --out run.tito
    tito record --engine http://127.0.0.1:30000 --out runs/ --per-session
    tito record --engine ... --out run.tito --agent claude-code --task "fix the test" --sessions 4
    tito record --engine ... --out tool_loop.tito --agent scripted --scenario cassettes/scenarios/tool_loop.yaml
    tito record --engine ... --out cc.tito --scenario cassettes/scenarios/claude_tool_loop.yaml   # its CLI script
    tito record --target slime --engine ... --listen 127.0.0.1:8400 --out slime.tito     # around slime's adapters
    tito record --target http://127.0.0.1:9000 --engine-listen 127.0.0.1:9001 --engine ... --out gw.tito

`--target` names the system under test between the two legs (recorder/targets): tito's own adapter app by
default; otherwise tito's taps go around it, the agent tap on --listen and the engine tap on --engine-listen.

With `--agent`, tito starts the pinned real CLI once per session in a sandbox pointed at the proxy,
finishes each session when its agent exits, and stops; `--scenario FILE` takes the CLI, tasks, flags and
environment from the scenario's `client:` section (recorder/agents/cli_script.py). `--agent scripted` plays a
scenario's scripted `client:` in-process instead (recorder/scripted/client.py), which finishes or drops its
sessions itself. `tito simulate` also starts the fake engine on the scenario and writes the golden.
Otherwise it serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tito_rl.recorder.record_options import add_arguments as add_arguments  # the options of `tito record`
from tito_rl.recorder.record_options import agent_option_problem
from tito_rl.recorder.targets.base import TargetError
from tito_rl.recorder.targets.registry import TITO, TargetSpec, parse_target
from tito_rl.trajectory.adapters import serve
from tito_rl.trajectory.adapters.engine.generate import ADAPTER_DIALECTS


def check(args: argparse.Namespace) -> str | None:
    out = Path(args.out)
    problem = check_run_options(args) or serve.options_problem(args)
    if problem:
        return problem
    if args.per_session or args.rotate_sessions or args.rotate_bytes:
        if out.exists() and not out.is_dir():
            return f"--out {out} exists and is not a folder"
    elif out.exists():
        return f"--out {out} exists: tito never overwrites a cassette"
    elif not out.parent.exists():
        return f"--out {out}: folder {out.parent} does not exist"
    named = args.agent  # a CLI named here runs every session, even of a mixed scenario
    if args.scenario:
        from tito_rl.recorder.scenario_file import ScenarioError, check_scenario

        try:  # the whole file first: the same errors as tito fake-engine --script and tito simulate
            checked = check_scenario(args.scenario)
        except ScenarioError as exc:
            return str(exc)
        if not args.agent:
            args.agent = checked.client.agent if checked.client is not None else None
            if args.agent is None:
                return f"--scenario {args.scenario} has no client: section: name the CLI with --agent"
    if args.agent == "scripted":
        if not args.scenario:
            return "--agent scripted needs --scenario FILE"
        from tito_rl.recorder.scripted.script import load_client_script

        try:
            load_client_script(args.scenario)
        except ValueError as exc:
            return str(exc)
    elif args.agent and args.scenario:
        from tito_rl.recorder.agents.cli_script import load_cli_script

        try:
            args.cli_script = load_cli_script(args.scenario, named, args.task)
        except ValueError as exc:
            return str(exc)
    elif args.agent and not args.task:
        return "--agent needs --task (or --scenario)"
    try:
        spec = parse_target(args.target)
    except TargetError as exc:
        return str(exc)
    if spec.kind == "http" and not args.engine_listen:
        return f"--target {spec.text} needs --engine-listen HOST:PORT: the engine URL that gateway was started with"
    if spec.kind == TITO and (args.volatile or args.session_from or args.routing_header):
        return "--volatile, --routing-header and --session-from are for a target other than tito's own adapter"
    if spec.kind == TITO and args.engine_dialect not in (None, *ADAPTER_DIALECTS):
        return (
            f"--engine-dialect {args.engine_dialect}: tito's adapter calls the engine in {', '.join(ADAPTER_DIALECTS)}"
        )
    if spec.kind != "http" and (args.volatile or args.routing_header):
        return (
            f"--volatile and --routing-header are for an http:// target: the driver of {spec.text} says its "
            "own (TargetInfo)"
        )
    if args.session_from:
        from tito_rl.trajectory.adapters.session_from import SessionFromError, parse_session_from

        try:
            parse_session_from(args.session_from)
        except SessionFromError as exc:
            return str(exc)
    way = (
        "scripted"
        if args.agent == "scripted"
        else "cli-script"
        if getattr(args, "cli_script", None) is not None
        else "cli"
        if args.agent
        else "none"
    )
    problem = agent_option_problem(args, way)
    if problem is not None:
        return problem
    if args.sessions < 1 or args.concurrency < 1:
        return "--sessions and --concurrency must be >= 1"
    return None


def check_run_options(args: argparse.Namespace) -> str | None:
    """--sample-rate, rotation and the cap: their values, read into `args.layout` (`writer_process.Layout`)."""
    from tito_rl.cassette.rotation import Rotation
    from tito_rl.cassette.writer_process import Layout
    from tito_rl.recorder.record_options import parse_size

    if not 0.0 < args.sample_rate <= 1.0:
        return f"--sample-rate {args.sample_rate}: expected a fraction of the sessions, above 0 and at most 1"
    sizes: dict[str, int | None] = {}
    for flag in ("rotate_bytes", "max_bytes"):
        text = getattr(args, flag)
        try:
            sizes[flag] = None if text is None else parse_size(text)
        except ValueError:
            return f"--{flag.replace('_', '-')} {text}: expected a size such as 4096, 512M or 2G"
    if args.rotate_sessions is not None and args.rotate_sessions < 1:
        return "--rotate-sessions must be >= 1"
    rotating = args.rotate_sessions is not None or sizes["rotate_bytes"] is not None
    if rotating and args.per_session:
        return "--per-session and --rotate-sessions/--rotate-bytes each choose the cassettes: give one"
    rotation = Rotation(args.rotate_sessions, sizes["rotate_bytes"]) if rotating else None
    if args.metrics:
        try:
            serve.parse_listen(args.metrics)
        except SystemExit:  # its message names --listen
            return f"--metrics {args.metrics}: expected HOST:PORT"
    observer = getattr(args, "live_audit", None) if args.metrics else None
    staleness = getattr(args, "max_staleness", None)
    if staleness is not None and (staleness < 0 or not args.metrics):
        return "--max-staleness N: N >= 0, with --metrics (it counts the live stale-tokens)"
    options = (("max_staleness", str(staleness)),) if staleness is not None and observer is not None else ()
    args.layout = Layout(args.per_session, rotation, sizes["max_bytes"], observer, options)
    return None


async def serve_until_signal(args: argparse.Namespace) -> int:

    from tito_rl.cassette.writer_process import Layout, RecorderError
    from tito_rl.recorder.taps.proxy import build_header, fetch_engine_info, fetch_server_args, open_tap

    settings = serve.settings_from(args)
    manager = serve.manager_from(args)
    spec = parse_target(args.target)
    if spec.kind == TITO:  # the served model goes in the header: a replay sends the same name without asking
        problem = await serve.learn_served_model(settings)
        if problem:
            print(f"tito record: {problem} (is the engine up? --engine-model NAME names it)", file=sys.stderr)
            return 2
        learned = await serve.learn_routes_layout(settings)  # in the header's settings: a replay splits the same
        if learned and not args.quiet:
            print(f"tito record: {learned}", file=sys.stderr)
    engine = await fetch_engine_info(settings.engine_url)
    if engine is None and spec.kind == TITO and settings.engine_model:  # vLLM: no /model_info, its model listing
        engine = {"served_model_name": settings.engine_model}
    if engine is None:
        print(
            f"tito record: warning: no /model_info from {settings.engine_url}; recording without engine info",
            file=sys.stderr,
        )
    agent_info = None
    if args.agent == "scripted":
        from tito_rl.recorder.scripted.runs import scripted_header

        agent_info = scripted_header(args.scenario)
    elif args.agent:
        from tito_rl.recorder.agents.runs import agent_header

        agent_info = agent_header(args.agent, getattr(args, "cli_script", None))
    target = None
    if spec.kind != TITO:
        try:
            target = build_target(spec, args)
        except TargetError as exc:
            print(f"tito record: {exc}", file=sys.stderr)
            return 2
    header = build_header(settings, engine, agent_info, manager=manager)
    server_args = await fetch_server_args(settings.engine_url)
    if server_args:  # the engine serves routes: the audit reads it (routes-never-asked)
        header.extra["engine_server_info"] = server_args
    if target is not None:
        header = foreign_header(header, spec, target)
        # a gateway that takes its session from the URL: the launchers add it to each CLI's base URL
        args.session_path = getattr(target.info, "session_path", None)
    metrics = None
    if getattr(args, "metrics", None):
        from tito_rl.recorder.metrics import RecordMetrics

        metrics = RecordMetrics(str((header.target or {}).get("name") or TITO))
        host, port = serve.parse_listen(args.metrics)
        try:
            port = metrics.serve(host, port)
        except OSError as exc:
            print(f"tito record: --metrics {args.metrics}: {exc}", file=sys.stderr)
            return 2
        print(f"tito record: metrics on http://{host}:{port}/metrics", file=sys.stderr, flush=True)
        args.metrics_recorder = metrics
    try:
        tap = open_tap(
            Path(args.out),
            header,
            getattr(args, "layout", None) or Layout(args.per_session),
            on_event=metrics.writer_event if metrics is not None else None,
        )
    except RecorderError as exc:
        if metrics is not None:
            metrics.stop()
        print(f"tito record: {exc}", file=sys.stderr)
        return 2
    progress = None if args.quiet else sys.stderr
    try:
        if target is None:
            stopper, url = await _start_tito(args, settings, manager, tap, progress)
        else:
            stopper, url = await _start_around(args, settings, target, tap, progress)
    except (OSError, TargetError) as exc:
        tap.close()
        print(f"tito record: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    rc = 0
    try:
        if args.agent == "scripted":
            from tito_rl.recorder.scripted.runs import run_scripted_sessions

            rc = await run_scripted_sessions(args, url, stop)
        elif args.agent:
            from tito_rl.recorder.agents.runs import run_agent_sessions

            rc = await run_agent_sessions(args, url, stop)
        else:
            await stop.wait()
    finally:
        await stopper()  # finalizes open sessions and closes the cassette
        if metrics is not None:
            metrics.stop()
        lead = "\n" if not args.quiet and sys.stderr.isatty() else ""  # ends the live line ("\r") on a terminal
        print(f"{lead}tito record: stopped; cassette at {args.out}", file=sys.stderr, flush=True)
    return rc


async def _start_tito(
    args: argparse.Namespace, settings: Any, manager: Any, tap: Any, progress: Any
) -> tuple[Callable[[], Awaitable[None]], str]:
    """tito's own adapter app with the cassette's tap inside it (exact attribution of every engine call), and the
    trainer's engine URL beside it (--engine-listen, else a free loopback port): a trainer that updates weights,
    pauses or aborts through it is recorded as around a target (`recorder/taps/trainer_tap.py`)."""
    from aiohttp import web

    from tito_rl.recorder.taps.around import serve as serve_tap
    from tito_rl.recorder.taps.proxy import create_recording_app
    from tito_rl.recorder.taps.trainer_tap import TRAINER_TAP_KEY
    from tito_rl.trajectory.runtime.server_process import prepare_to_serve

    host, port = serve.parse_listen(args.listen)
    app = create_recording_app(
        settings, tap, progress=progress, manager=manager, sample_rate=args.sample_rate, wrap=_metrics_wrap(args, tap)
    )
    prepare_to_serve(app)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        trainer, trainer_url = await serve_tap(
            app[TRAINER_TAP_KEY].app(), *serve.parse_listen(args.engine_listen or "127.0.0.1:0")
        )
    except BaseException:
        await runner.cleanup()
        raise
    model = f", model {settings.engine_model}" if settings.engine_model else ""
    print(
        f"tito record: proxy on http://{host}:{port} -> {settings.engine_url} ({settings.engine_dialect}{model}), "
        f"writing {args.out}; a trainer's engine URL: {trainer_url} (its weight updates, pauses and aborts "
        "are recorded)",
        file=sys.stderr,
        flush=True,
    )

    async def stop() -> None:
        try:
            await trainer.cleanup()
        finally:
            await runner.cleanup()  # finalizes the open sessions and closes the cassette

    return stop, f"http://{host}:{port}"


async def _start_around(
    args: argparse.Namespace, settings: Any, target: Any, tap: Any, progress: Any
) -> tuple[Callable[[], Awaitable[None]], str]:
    """The taps around a foreign target: agents -> agent tap -> target -> engine tap -> engine."""
    from tito_rl.recorder.metrics import MetricsTap
    from tito_rl.recorder.taps.around import TapsAround, tokenizer_decoder
    from tito_rl.recorder.taps.progress import ProgressTap
    from tito_rl.recorder.taps.proxy import recorded_tap

    counted = recorded_tap(tap, progress, args.sample_rate, _metrics_wrap(args, tap))
    around = TapsAround(
        counted,
        target,
        settings.engine_url,
        getattr(args, "engine_dialect", None),
        tokenizer_decoder(settings.tokenizer_dir),
    )
    listen = serve.parse_listen(args.listen)
    engine_listen = serve.parse_listen(args.engine_listen) if args.engine_listen else ("127.0.0.1", 0)
    from tito_rl.trajectory.runtime.server_process import prepare_to_serve

    try:
        ends = await around.start(listen, engine_listen, prepare=prepare_to_serve)
    except BaseException:
        await around.stop()
        raise

    async def stop() -> None:
        try:
            await around.stop()
        finally:
            tap.close()
            line = counted.inner if isinstance(counted, MetricsTap) else counted
            if isinstance(line, ProgressTap):
                line.flush()  # the last counts: a log's lines are 10 s apart
            summary = around.recording.sessionless_summary()
            if summary is not None:
                lead = "\n" if progress is not None and progress.isatty() else ""
                print(f"{lead}tito record: {summary}", file=sys.stderr, flush=True)

    print(
        f"tito record: agents -> {ends.agent_url} -> target {args.target} -> {ends.engine_url} -> "
        f"{settings.engine_url}, writing {args.out}",
        file=sys.stderr,
        flush=True,
    )
    return stop, ends.agent_url


def _metrics_wrap(args: argparse.Namespace, tap: Any) -> Callable[[Any], Any] | None:
    """With --metrics: the tap counting what the proxy sees around the rest of the chain (`recorder/metrics.py`)."""
    metrics = getattr(args, "metrics_recorder", None)
    if metrics is None:
        return None
    from tito_rl.recorder.metrics import MetricsTap

    return lambda inner: MetricsTap(inner, metrics, args.sample_rate, lambda: bool(getattr(tap, "capped", False)))


def build_target(spec: TargetSpec, args: argparse.Namespace) -> Any:
    """The driver (or running gateway) `--target` names, not started yet."""
    if spec.kind == "http":
        from tito_rl.recorder.targets.base import ROUTING_HEADER
        from tito_rl.recorder.targets.http import HttpTarget

        named = args.routing_header or ROUTING_HEADER
        header = None if named.lower() == "none" else named
        target: Any = HttpTarget(
            spec.url, tuple(args.volatile), header, session_from=session_from_spec(args.session_from or "bearer")
        )
    else:
        from tito_rl.recorder.targets.base import TargetOptions
        from tito_rl.recorder.targets.registry import create_driver

        options = TargetOptions(
            args.tokenizer, args.reasoning_parser or None, args.tool_parser or None, args.fork_threshold
        )
        target = create_driver(spec.text, options)
        if args.session_from:  # the driver's gateway keeps its sessions where the user says
            target.info.session_from = session_from_spec(args.session_from)
    from tito_rl.trajectory.adapters.session_from import SessionFromError, parse_session_from

    try:
        where = parse_session_from(getattr(target.info, "session_from", "bearer") or "bearer")
    except SessionFromError as exc:
        raise TargetError(f"{spec.text}: its TargetInfo.session_from: {exc}") from None
    if getattr(target.info, "session_path", None) is None and where.session_path is not None:
        target.info.session_path = where.session_path  # launched CLIs get base URLs with the session in them
    return target


def session_from_spec(text: str) -> str:
    """`--session-from`'s text in its normal form (`header:X-Session-Id` -> `header:x-session-id`)."""
    from tito_rl.trajectory.adapters.session_from import parse_session_from

    return parse_session_from(text).spec


def foreign_header(header: Any, spec: TargetSpec, target: Any) -> Any:
    """The header of a recording around a foreign target: tito's adapter settings give way to the target's."""
    info = target.info
    header.adapter = {"tokenizer_dir": header.adapter.get("tokenizer_dir")}
    header.target = {"kind": spec.kind, "ref": spec.text, **info.to_dict()}
    return header


def run(args: argparse.Namespace) -> int:
    problem = check(args)
    if problem:
        print(f"tito record: {problem}", file=sys.stderr)
        return 2
    from tito_rl.trajectory.runtime.server_process import new_event_loop, start_up_without_gc

    start_up_without_gc()
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(serve_until_signal(args))
