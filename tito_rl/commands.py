"""What each `tito` subcommand is: the module that owns it, one line for `tito --help`, what it does and its exit
codes for `tito NAME --help`. One table, so that every command says the same things the same way.

A subcommand module exposes `add_arguments(parser)` and `run(args) -> int`. One with actions (`tito cassette
cut`) exposes `ACTIONS` instead of `add_arguments`: per action its summary, description, exit codes and a
function that adds its options; the command line builds their parsers (`main.build_parser`), so an action's
help reads as a subcommand's does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

USAGE_ERROR = "2: a usage error (unknown option, missing argument)"


@dataclass(frozen=True)
class Subcommand:
    module: str
    summary: str  # one line in `tito --help`
    description: str  # what it does, in `tito NAME --help`
    exits: tuple[str, ...]  # "CODE: meaning", in `tito NAME --help`
    # It parses engine output through tito's adapter: sglang's parsers start loading in a helper process before
    # anything else loads (trajectory/adapters/parsing/parser_process.py).
    parses: bool = False
    # Parts of a higher layer a command's module may use without importing them, by name (`args.<key>`): the
    # table sits above every layer (docs/architecture.md), so it may name them.
    injects: tuple[tuple[str, str], ...] = ()


SUBCOMMANDS: dict[str, Subcommand] = {
    "demo": Subcommand(
        "tito_rl.replayer.demo",
        "replay a committed real Claude Code cassette with no engine: verified, its decisions, an HTML page "
        "(--synthetic: the manager alone)",
        "Replays a committed recording of the real Claude Code CLI (or CASSETTE) through the adapter app and the "
        "trajectory manager with no engine and no GPU, and prints what was recorded, the verification (engine "
        "requests, replies, samples, then the golden), the message tree, every decision, the samples and the "
        "path of its inspect --html page. --synthetic replays a built-in synthetic session through the manager "
        "alone.",
        ("0: the replay matches its recording", "1: a difference", "2: the cassette cannot be replayed"),
        parses=True,
    ),
    "serve": Subcommand(
        "tito_rl.trajectory.adapters.serve",
        "run the adapter app in front of an SGLang or vLLM engine",
        "Serves the adapter app (Anthropic Messages, OpenAI Chat and Responses, Gemini API, rendered to "
        "token ids for SGLang's /generate, or vLLM's /inference/v1/generate or /v1/completions with "
        "--engine-dialect) in front of an engine, a router or tito's fake engine, with the trajectory manager "
        "building each session's samples; agents use the session id as their API key.",
        (
            "0: stopped by SIGINT or SIGTERM",
            "1: --listen is not HOST:PORT",
            "2: the settings cannot be used (an unknown parser name, a chat template that does not parse)",
        ),
        parses=True,
    ),
    "fake-engine": Subcommand(
        "tito_rl.fake_engine.cli",
        "run the fake engine: SGLang's and vLLM's APIs (every engine dialect) with no GPU",
        "Starts an engine that needs no GPU, answering SGLang's /generate and OpenAI-style API and vLLM's (chat "
        "and completions with token ids, /inference/v1/generate) at once: it plays a scenario's script (--script), the "
        "engine leg of a cassette (--cassette) or a built-in demo, with optional faults, and serves until "
        "stopped.",
        (
            "0: stopped by SIGINT or SIGTERM",
            "1: --listen is not HOST:PORT",
            "2: the scenario, cassette or options cannot be used",
        ),
    ),
    "check-engine": Subcommand(
        "tito_rl.recorder.engine_contract.check",
        "which engine dialects a running engine answers, and whether each is token-faithful",
        "Sends one small request per engine dialect (SGLang's /generate, vLLM's and SGLang's chat and completions "
        "with token ids, vLLM's /inference/v1/generate) to the engine at URL and says which answer, whether each "
        "returns what tito needs (prompt and output ids, a logprob per output id, a finish reason), and the "
        "start flag or request field that is missing where one is (--enable-scale-out, "
        "--enable-auto-tool-choice, return_token_ids support).",
        ("0: at least one dialect is token-faithful", "1: none is", "2: the engine cannot be reached"),
    ),
    "record": Subcommand(
        "tito_rl.recorder.cli",
        "record agent and engine traffic into a cassette",
        "The adapter app as a recording proxy in front of a live engine: both legs of every session (agent "
        "requests and replies, engine calls in their dialect) are written into a cassette, secrets redacted. With "
        "--agent it starts the agents itself and stops when they are done; otherwise it serves until stopped. "
        "Progress goes to stderr: a live line on a terminal, a line at most every 10 s otherwise. Beside a "
        "training run: --sample-rate, --rotate-sessions/--rotate-bytes (a folder of cassettes), --max-bytes, and "
        "--metrics HOST:PORT (Prometheus: sessions, turns, tokens, each audit rule's findings as sessions finish).",
        (
            "0: stopped, or every started session succeeded",
            "1: a started agent session failed, or --listen is not HOST:PORT",
            "2: the options or the output cannot be used",
            "130: interrupted while agents ran",
        ),
        # --metrics: `tito audit`'s rules run on each record the writer process writes (replayer/audit/live.py)
        injects=(("live_audit", "tito_rl.replayer.audit.live:observer"),),
    ),
    "simulate": Subcommand(
        "tito_rl.recorder.simulate",
        "a scenario: fake engine, recording proxy, the real CLI; cassette and golden",
        "Records one scenario end to end with no GPU: the fake engine plays its script, tito record runs the "
        "pinned real CLI (installed with npm on first use) or the scripted client against it, and the "
        "cassette's golden is written.",
        ("0: the cassette (and its golden) was written", "1: the recording or the golden failed"),
    ),
    "scenario": Subcommand(
        "tito_rl.recorder.scenario_cli",
        "check scenario files against their model (check), print its JSON Schema",
        "Checks scenario files without running them (every section against its typed model, one line per file "
        "saying ok or what is wrong and where), or prints a scenario file's JSON Schema for editors.",
        ("0: every file is valid, or the schema was printed", "2: a file is invalid or cannot be read"),
    ),
    "profile": Subcommand(
        "tito_rl.recorder.profile_cli",
        "check gateway profiles against their format (check), print its JSON Schema",
        "Checks gateway profiles (a gateway adopted with a file: --target FILE, docs/targets.md) without starting "
        "the gateway (one line per file saying ok or what is wrong and where), or prints a profile's JSON Schema "
        "for editors.",
        ("0: every file is valid, or the schema was printed", "2: a file is invalid or cannot be read"),
    ),
    "replay": Subcommand(
        "tito_rl.replayer.replay.cli",
        "replay cassettes through their target (tito's adapter and manager, or a gateway), verify, check goldens",
        "Replays cassettes offline through the current adapter and manager: each engine request, reply and "
        "sample is compared with the recording, and each session's result with its golden. A folder stands "
        "for the cassettes in it; a golden in it without its cassette, or a golden section for a session the "
        "cassette no longer has, is unused and fails. The what-if options replay under a candidate change.",
        (
            "0: every session matches its recording and its golden",
            "1: a difference, or an unused golden",
            "2: the input cannot be replayed (no such file, corrupt cassette, another tokenizer, unknown session)",
        ),
        parses=True,
    ),
    "diff": Subcommand(
        "tito_rl.replayer.inspection.diff",
        "compare the training data of two cassettes, or of one under a candidate change",
        "Replays both sides and compares each pair of sessions: samples, forks by reason, trained tokens, and "
        "the first divergent token with the decoded text around it. Sessions pair by name, by --pair, or, for "
        "two cassettes of one session each, with each other.",
        ("0: nothing differs", "1: something differs (as diff(1))", "2: an input cannot be replayed"),
        parses=True,
    ),
    "cassette": Subcommand(
        "tito_rl.replayer.cassette_tools.cli",
        "a cassette's summary (info), records as JSON (export), cut and merge",
        "Looks at and reshapes cassettes without replaying them: info (header and per-session counts), export "
        "(the records as JSON), cut (some sessions into a cassette of their own), merge (several into one). "
        "No action overwrites an existing file.",
        ("0: done", "2: unusable input (no such file, corrupt cassette, unknown session, an existing output)"),
    ),
    "audit": Subcommand(
        "tito_rl.replayer.audit.cli",
        "check recordings' training data without replaying: coverage, prefix breaks, leaks, lost calls",
        "Reads cassettes once each, no replay and no target installed, and runs rules over both recorded legs and "
        "the finish samples: emitted-token coverage (trained twice, never trained, trained but not emitted, "
        "logprobs), prompts that break their chain, stop tokens in replies, lost tool calls and text, sampling "
        "overrides, changed statuses and regenerated retries. A folder stands for the cassettes in it; a rule "
        "expected for a cassette is allowed with a reason in X.audit.toml beside X.tito (docs/audit.md).",
        (
            "0: no rule of --fail-on fired (or it is allowed beside its cassette)",
            "1: a rule of --fail-on fired",
            "2: unusable input (no such file, corrupt cassette, a bad allowlist, an unknown rule)",
        ),
    ),
    "inspect": Subcommand(
        "tito_rl.replayer.inspection.cli",
        "show a cassette's sessions: exchanges, tree, decisions; --html for a page",
        "Replays a cassette (differences noted, not failed) and shows each session's exchanges with token counts "
        "and timings, the manager's stats, the message tree and every decision with the sample token it lands "
        "on; --html writes it as one self-contained page with each sample's tokens coloured.",
        (
            "0: shown",
            "2: the input cannot be replayed (no such file, corrupt cassette, another tokenizer, unknown session)",
        ),
        parses=True,
    ),
}

# An action of a subcommand, as its module declares it in `ACTIONS`: (summary, description, exit codes, a function
# adding its options to its parser).
Action = tuple[str, str, tuple[str, ...], Callable[[Any], None]]
