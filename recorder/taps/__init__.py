"""Taps: where a recording listens to both legs of the target (the agent leg and the engine leg)."""
