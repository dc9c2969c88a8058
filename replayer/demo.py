"""`tito demo [CASSETTE]`: tito's main job on a committed recording of the real Claude Code CLI.

The cassette (default `cassettes/claude_tool_loop.tito`) is replayed through the real adapter app and the
trajectory manager with no engine and no GPU: each of the agent's requests goes back through the adapter,
the engine's answers come from the cassette. The demo prints what was recorded, the verification result
(every engine request, every reply to the agent and the samples against the recording, then the golden), the
message tree and the manager's decisions, the samples, and the path of the `tito inspect --html` page it
wrote (under the system's temp folder unless `--html-dir` says otherwise). `--synthetic` runs the older demo:
a built-in synthetic session through the manager alone (`trajectory/demo.py`). Exit 0 when the replay
matches; 1 when it does not; 2 when the cassette cannot be replayed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import textwrap
from pathlib import Path

from tito_rl.replayer.replay.results import CassetteResult, SessionResult

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CASSETTE = ROOT / "cassettes" / "claude_tool_loop.tito"
EXIT_OK, EXIT_DIFFERENCE, EXIT_UNUSABLE = 0, 1, 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tito_rl.trajectory import demo as synthetic

    parser.add_argument(
        "cassette",
        nargs="?",
        default=str(DEFAULT_CASSETTE),
        help="the cassette to replay (default: the committed Claude Code tool loop)",
    )
    parser.add_argument(
        "--html-dir",
        metavar="DIR",
        help="where to write the HTML page (default: a tito-demo folder in the system's temp folder)",
    )
    parser.add_argument(
        "--synthetic", action="store_true", help="instead: a built-in synthetic session through the manager alone"
    )
    group = parser.add_argument_group("--synthetic options")
    synthetic.add_arguments(group)


def run(args: argparse.Namespace) -> int:
    if args.synthetic:
        from tito_rl.trajectory import demo as synthetic

        return synthetic.run(args)
    from tito_rl.replayer.goldens import files as goldens
    from tito_rl.replayer.inspection.gather import inspection_of
    from tito_rl.replayer.inspection.html_page import render_html
    from tito_rl.replayer.replay.cassette_replay import replay_loaded, run_sync
    from tito_rl.replayer.replay.loading import ReplayInputError, load_cassette
    from tito_rl.replayer.replay.options import ReplayOptions
    from tito_rl.trajectory.golden import TokenizerNames
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    path = Path(args.cassette)
    try:
        cassette, folder = load_cassette(path)
        result = run_sync(replay_loaded(cassette, str(path), folder, None, ReplayOptions(strict=False)))
    except ReplayInputError as exc:
        print(f"tito demo: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    goldens.check(result, result.all_sessions, TokenizerNames(load_tokenizer(folder)))
    html_dir = Path(args.html_dir) if args.html_dir else Path(tempfile.gettempdir()) / "tito-demo"
    page = html_dir / f"{path.stem}.html"
    try:
        html_dir.mkdir(parents=True, exist_ok=True)
        page.write_text(render_html(inspection_of(cassette, result, folder)), encoding="utf-8")
    except OSError as exc:
        print(f"tito demo: cannot write {page}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    print(report(result, page))
    return EXIT_OK if all(ok(s) for s in result.sessions) else EXIT_DIFFERENCE


def shown_path(path: str) -> str:
    """Relative to the working folder when it is under it (what `make demo` prints), else as given."""
    full = Path(path).resolve()
    return str(full.relative_to(Path.cwd())) if full.is_relative_to(Path.cwd()) else path


def ok(session: SessionResult) -> bool:
    return not session.differences and not session.accepted and session.golden == "ok"


def report(result: CassetteResult, page: Path) -> str:
    header = result.header
    agent = header.agent or {}
    client = " ".join(str(agent[k]) for k in ("client", "version") if agent.get(k)) or "an unnamed client"
    parsers = ", ".join(f"{k} {v}" for k, v in sorted(header.parsers.items())) or "none"
    exchanges = sum(s.exchanges for s in result.sessions)
    lines = [
        f"tito demo: {Path(result.path).name}, a real {client} session recorded once, replayed with no engine",
        "",
        f"cassette   {shown_path(result.path)}",
        f"recorded   {header.created} by tito {header.tito_version}; parsers: {parsers}",
        f"sessions   {len(result.sessions)}, {exchanges} agent exchange(s)",
        "",
        "1. Replay: each request the agent sent went back through the adapter app (its wire format rendered",
        "   to token ids with the chat template); each engine answer came from the cassette, not a GPU.",
        "",
        "2. Verification: every engine request (token ids, sampling params), every reply to the agent and",
        "   the samples at each finish, compared with the recording; then the golden file:",
    ]
    for s in result.sessions:
        found = s.differences + s.accepted
        verdict = "match the recording" if not found else f"DIFFER: {found[0].summary}"
        golden = {"ok": "matches", "missing": "is MISSING", "changed": "CHANGED"}.get(s.golden or "", "not checked")
        lines.append(f"   {s.session}: all {s.exchanges} exchange(s) {verdict}; the golden {golden}")
    lines += ["", "3. What the trajectory manager made of it:"]
    for s in result.sessions:
        lines += session_story(s)
    lines += [
        "",
        f"4. See it: {page}",
        "   (one self-contained page: the tree, each sample's tokens coloured prompt / context / masked /",
        "   trained, and each decision on the token it landed on)",
        "",
        "More: tito demo cassettes/claude_continue_dropped.tito (a false fork: earlier reasoning dropped),",
        "      tito demo --synthetic (the manager alone), tito replay cassettes/ (the whole corpus).",
    ]
    return "\n".join(lines)


def session_story(session: SessionResult) -> list[str]:
    from tito_rl.replayer.inspection.gather import sample_line
    from tito_rl.trajectory.golden import render_tree

    lines = []
    for n, finish in enumerate(session.finishes, 1):
        lin = finish.linearization
        stats = lin.stats
        lines.append(
            f"   {session.session}, finish {n} (reward {finish.reward:g}): {stats.turns} turn(s) on "
            f"{stats.leaves} chain(s) -> {stats.samples} sample(s)"
        )
        lines.append("   message tree ([turn N] = the model's own output; the rest is context):")
        lines += [f"     {line}" for line in render_tree(finish.tree.get("nodes", []))]
        lines.append("   decisions:")
        if lin.events:
            lines += [f"     {event.describe()}" for event in lin.events]
        else:
            lines += textwrap.wrap(
                "none needed: every turn's prompt extended the one before it, so there was "
                "no fork, no realignment and no re-tokenised reply",
                100,
                initial_indent="     ",
                subsequent_indent="     ",
            )
        lines.append("   samples (trained = the model's tokens with their logprobs; masked = carried, untrained):")
        lines += [
            f"     {sample_line(i, sample, lin.spans[i] if i < len(lin.spans) else [])}"
            for i, sample in enumerate(lin.samples)
        ]
    if not session.finishes:
        lines.append(f"   {session.session}: no finish, so no samples")
    return lines
