"""Targets: the system under test between the agent leg and the engine leg (protocol in `base`)."""
