"""Shared fixtures: the real tokenizer is loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    return load_tokenizer()


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` (`make test`): the groups read from the node ids (tests/xdist_groups.py: xdist's own
    loses them under pytest 9)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_groups import GroupScheduling

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The tests marked `slow` first (a stable sort): under xdist the longest work starts at once, rather than
    one of them starting last and running alone. Then the real engine's tests, skipped unless asked for."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    skip_real_engine(items)


# ---- the real vLLM and SGLang (tests marked real_engine; docs/real-engine.md) -------------------------------
def skip_real_engine(items):
    """Tests marked real_engine need a real engine and minutes per server: only `make test-real-engine` (or
    `make test-real-sglang` for SGLang's) runs them."""
    import os

    from tests.real_engine_support import REAL_ENGINE_ENV

    if os.environ.get(REAL_ENGINE_ENV) == "1":
        return
    vllm = pytest.mark.skip(reason="needs the real vLLM: `make test-real-engine` runs it")
    sglang = pytest.mark.skip(reason="needs the real SGLang: `make test-real-sglang` runs it")
    for item in items:
        if "real_engine" in item.keywords:
            item.add_marker(sglang if "sglang" in item.path.name else vllm)


@pytest.fixture(scope="session")
def real_engines():
    """`real_engines.get(StartFlags(...))`: a running real vLLM with those start flags; `real_engines.sglang(
    SglangStart(...))`: a running real SGLang (one server at a time)."""
    from tests.real_engine_support import RealEngines

    engines = RealEngines()
    yield engines
    engines.close()
