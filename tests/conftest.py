"""Shared fixtures: the real tokenizer is loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    return load_tokenizer()


# ---- the real vLLM (tests marked real_engine; docs/real-engine.md) -----------------------------------------
def pytest_collection_modifyitems(config, items):
    """Tests marked real_engine need the real vLLM and minutes per server: only `make test-real-engine` runs them."""
    import os

    from tests.real_engine_support import REAL_ENGINE_ENV

    if os.environ.get(REAL_ENGINE_ENV) == "1":
        return
    skip = pytest.mark.skip(reason="needs the real vLLM: `make test-real-engine` runs it")
    for item in items:
        if "real_engine" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_engines():
    """`real_engines.get(StartFlags(...))`: a running real vLLM with those start flags (one at a time)."""
    from tests.real_engine_support import RealEngines

    engines = RealEngines()
    yield engines
    engines.close()
