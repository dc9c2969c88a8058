"""Gateways run in a Python of their own: the process they run in, the cached environments tito makes for them,
and the verifiers driver."""
