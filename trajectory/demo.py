"""`tito demo`: replay a small built-in synthetic session through the manager and show what it decided.

The session has what real agent traffic has: a tool loop, a sub-agent with its own system prompt, a
client echo that drops reasoning (token drift), and a new user message. It prints the message tree,
every decision with its reason, the statistics and the golden rendering of each sample.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tito_rl.trajectory.golden import render_samples
from tito_rl.trajectory.manager import TrajectoryManager
from tito_rl.trajectory.synthetic import SyntheticSession, assistant, system, tool, user


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--reward", type=float, default=1.0, help="reward given at session finish")
    parser.add_argument("--reward-policy", choices=("full", "split"), default="full")
    parser.add_argument("--fork-threshold", type=int, default=1024, help="fork_threshold_tokens")
    parser.add_argument("--json", action="store_true", help="print samples as JSON (Sample.to_dict)")


def build_session(manager: TrajectoryManager) -> SyntheticSession:
    s = SyntheticSession(manager, "demo")
    sys_main, task = system("agent"), user("fix tests")
    look = assistant("", ("Bash", {"command": "pytest"}), reasoning="run them")
    s.turn([sys_main, task], look)
    h = [sys_main, task, look, tool("1 failed")]
    delegate = assistant("", ("Agent", {"task": "find"}))
    # the client echoes the previous reply without its reasoning: drift inside the last response
    echoed = s.vocab.decode(
        s.template.render([sys_main, task, assistant("", ("Bash", {"command": "pytest"})), tool("1 failed")])
    )
    s.turn(h, delegate, prompt=echoed)
    s.turn([system("subagent"), user("find")], assistant("found it"))  # the sub-agent's own chain
    h = h + [delegate, tool("found it")]
    s.turn(h, assistant("", ("Edit", {"file": "a.py"})))
    h = h + [assistant("", ("Edit", {"file": "a.py"})), tool("ok")]
    s.turn(h, assistant("fixed"))
    s.turn(h + [assistant("fixed"), user("thanks")], assistant("bye"))
    return s


def print_tree(tree: dict[str, Any], names: dict[int, str]) -> None:
    children: dict[int | None, list[dict[str, Any]]] = {}
    for node in tree["nodes"]:
        children.setdefault(node["parent"], []).append(node)

    def walk(parent: int, depth: int) -> None:
        for node in children.get(parent, []):
            tag = f"generated turn {node['turn']}" if node["generated"] else "routing"
            extra = f"  -> samples {node['samples']}" if node["samples"] else ""
            print(f"{'  ' * depth}{node['role']:<9} #{node['id']:<3} {tag}: {names[node['id']]}{extra}")
            walk(node["id"], depth + 1)

    walk(0, 0)


def run(args: argparse.Namespace) -> int:
    manager = TrajectoryManager(fork_threshold_tokens=args.fork_threshold, reward_policy=args.reward_policy)
    s = build_session(manager)
    tree = manager.export_tree("demo")
    names = {
        n["id"]: json.dumps(n["message"].get("content") or n["message"].get("tool_calls"))[:48] for n in tree["nodes"]
    }
    print("== message tree")
    print_tree(tree, names)
    print("\n== decisions")
    for event in manager.events("demo"):
        print("  " + event.describe())
    print("\n== stats")
    print("  " + json.dumps(manager.stats("demo").to_dict()))
    samples = manager.finish("demo", args.reward)
    print(f"\n== samples ({len(samples)}): trained tokens in [brackets], '|' starts the response")
    if args.json:
        print(json.dumps([x.to_dict() for x in samples], indent=1))
    else:
        print(render_samples(samples, s.vocab.name))
    return 0
