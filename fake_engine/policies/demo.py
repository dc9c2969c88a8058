"""The built-in demo scenario: any /generate gets a short Qwen3-format reply (for smoke tests; docs/fake-engine.md)."""

from __future__ import annotations

from typing import Any

from tito_rl.fake_engine.policies.scripted import Scenario, ScriptedPolicy, parse_scenario

DEMO_SCENARIO: dict[str, Any] = {
    "name": "demo",
    "turns": [
        {
            "reasoning": "The user sent a message. A short, friendly answer is enough.",
            "text": "Hello from the tito fake engine: this reply was scripted, not sampled.",
        }
    ],
}


def demo_scenario() -> Scenario:
    return parse_scenario(DEMO_SCENARIO)


def demo_policy(tokenizer: Any) -> ScriptedPolicy:
    return ScriptedPolicy(demo_scenario(), tokenizer)
