"""Shared fixtures: the real tokenizer is loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

    return load_tokenizer()
