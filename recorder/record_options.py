"""`tito record`'s options, apart from the command: a scenario file's `client.record_args` are checked against
them (`scenario_file`), and a scripted run compares them with its own (`scripted.runs`), without importing the
recorder's command.
"""

from __future__ import annotations

import argparse

from tito_rl.recorder.targets.base import ROUTING_HEADER
from tito_rl.recorder.targets.registry import TITO
from tito_rl.trajectory.adapters import serve
from tito_rl.trajectory.dialects.view import DIALECTS

# The agent options, with their defaults: each applies to some ways of running agents only, and one that does
# not apply to this run is refused rather than ignored (`agent_option_problem`).
AGENT_DEFAULTS = {
    "sessions": 1,
    "concurrency": 1,
    "sandbox": "local",
    "agent_model": "tito-policy",
    "agent_timeout": 600.0,
    "reward": 0.0,
}
# which of them each way uses: a launched CLI with --task, a scenario's CLI script, the scripted client, none
USED_BY = {
    "cli": set(AGENT_DEFAULTS),
    "cli-script": {"sandbox", "agent_model", "reward"},
    "scripted": {"agent_timeout"},
    "none": set(),
}
WHY = {
    "cli-script": "the scenario's client: section lists its sessions and runs",
    "scripted": "the scenario's client: section says its sessions, concurrency, model and rewards",
    "none": "no agent is launched (--agent): tito records whatever connects to --listen, and finishes the "
    "sessions left open with reward 0",
}


def agent_option_problem(args: argparse.Namespace, way: str) -> str | None:
    """A one-line refusal of agent options this way of running agents would ignore; else fills their defaults."""
    unused = [name for name in AGENT_DEFAULTS if getattr(args, name, None) is not None and name not in USED_BY[way]]
    if way in ("scripted", "none") and getattr(args, "task", None):
        unused.insert(0, "task")
    if unused:
        flags = ", ".join("--" + name.replace("_", "-") for name in unused)
        return f"{flags} {'does' if len(unused) == 1 else 'do'} not apply here: {WHY[way]}"
    for name, default in AGENT_DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, default)
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    serve.add_arguments(parser, engine_dialect=False)
    parser.add_argument("--out", required=True, help="cassette file to create (a folder with --per-session)")
    parser.add_argument("--per-session", action="store_true", help="one cassette per session, in the --out folder")
    parser.add_argument("--quiet", action="store_true", help="no live progress line")
    run = parser.add_argument_group("recording a training run (docs/recording.md#recording-a-training-run)")
    run.add_argument(
        "--sample-rate",
        type=float,
        default=1.0,
        metavar="R",
        help="record this fraction of the sessions, whole, chosen from each session id (the same "
        "ones on a rerun); the others are served and not recorded (default 1)",
    )
    run.add_argument(
        "--rotate-sessions",
        type=int,
        metavar="N",
        help="a new cassette every N sessions: --out is a folder of part-NNNNNN.tito, each closed once "
        "its sessions end",
    )
    run.add_argument(
        "--rotate-bytes",
        metavar="SIZE",
        help="a new cassette once one reaches SIZE bytes (e.g. 512M, 2G; with --rotate-sessions, "
        "whichever comes first); --out is a folder",
    )
    run.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics: sessions, turns, tokens, each "
        "tito audit rule's findings as sessions finish, coverage, the taps' time, bytes written",
    )
    run.add_argument(
        "--max-staleness",
        type=int,
        metavar="N",
        help="with --metrics: count stale-tokens live as `tito audit --max-staleness N` does (a finished "
        "sample whose tokens span weight versions more than N apart), and its tokens beyond N "
        "(tito_audit_stale_tokens_total); default: not counted",
    )
    run.add_argument(
        "--max-bytes",
        metavar="SIZE",
        help="stop recording once SIZE bytes are written in all (the proxy keeps serving and says so)",
    )
    agents = parser.add_argument_group("agents launched for you")
    agents.add_argument(
        "--agent",
        help="claude-code, codex, qwen-code, opencode, gemini-cli or mini-swe-agent (pinned versions), "
        "or scripted: the scripted client plays --scenario's client: section; default: the one "
        "--scenario's client: names",
    )
    agents.add_argument("--task", help="the task text given to every agent session (replaces a scenario's runs)")
    agents.add_argument(
        "--scenario",
        metavar="FILE",
        help="a scenario file (cassettes/scenarios/) whose client: section is a CLI script or the "
        "scripted client's; its client.record_args are not applied here: pass them too "
        "(tito simulate and make corpus do; a warning names any left out)",
    )
    agents.add_argument("--sessions", type=int, help="agent sessions to run (default 1)")
    agents.add_argument("--concurrency", type=int, help="agent sessions at once (default 1)")
    agents.add_argument("--sandbox", choices=("local", "e2b"), help="where a CLI runs (default local)")
    agents.add_argument("--agent-model", help="model name the agent asks for (default tito-policy)")
    agents.add_argument("--agent-timeout", type=float, help="seconds per agent session (default 600)")
    targets = parser.add_argument_group("the system under test (recorder/targets, docs/targets.md)")
    targets.add_argument(
        "--target",
        default=TITO,
        help="tito (default: tito's adapter app), http://HOST:PORT (a running gateway whose engine "
        "URL is --engine-listen), a driver's name (slime, rllm, miles, verifiers, "
        "agentlightning, or an entry point of tito.targets), module:attribute (a driver "
        "factory) or a gateway profile FILE.yaml (docs/targets.md)",
    )
    targets.add_argument(
        "--engine-listen",
        metavar="HOST:PORT",
        help="where the engine tap listens, the target's engine URL (required with an http:// "
        "target; a driver's gateway gets a free loopback port by default); with tito's own adapter, the "
        "trainer's engine URL, whose weight updates, pauses and aborts are recorded (default: a free loopback "
        "port, printed at start)",
    )
    targets.add_argument(
        "--volatile",
        action="append",
        default=[],
        metavar="PATH",
        help="http:// target: a reply field it fills with values no replay can pin (random ids, "
        "times), e.g. id or choices[*].message.tool_calls[*].id (repeatable)",
    )
    targets.add_argument(
        "--routing-header",
        metavar="NAME",
        help=f"http:// target: the engine-leg header carrying the session id (default "
        f"{ROUTING_HEADER}; none: it sends none)",
    )
    targets.add_argument(
        "--session-from",
        metavar="WHERE",
        help="where the target takes the session from on the agent leg: bearer (the API key, "
        "the default), header:NAME, cookie:NAME, session-cookie:NAME (the session_id in a signed session "
        "cookie: NeMo Gym's) or path:PREFIX with {sid} for the session's "
        "segment (e.g. path:/proxy/rollout/{sid}); a request naming none is no session's "
        "(docs/targets.md)",
    )
    targets.add_argument(
        "--engine-dialect",
        choices=DIALECTS,
        metavar="DIALECT",
        help="the engine API the target calls. tito's adapter: sglang (default), vllm-generate or "
        "vllm-openai (/v1/completions with token ids), as tito serve's; another target: what its "
        "calls alone do not say (also sglang-openai; default: read from each call, "
        "docs/engine-dialects.md)",
    )
    agents.add_argument(
        "--reward",
        type=float,
        help="reward given when a launched CLI's session finishes (default 0; the scripted client "
        "finishes with its script's own)",
    )


UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """`4096`, `512K`, `2G`, `1.5T` (binary units; a trailing `B` or `iB` allowed) as bytes; ValueError otherwise."""
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = raw[-1:] if raw[-1:] in UNITS else ""
    number = float(raw[: len(raw) - len(unit)])
    if not number > 0 or number != number:  # nan
        raise ValueError(text)
    return int(number * UNITS[unit])
