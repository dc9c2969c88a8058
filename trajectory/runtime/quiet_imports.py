"""Keep third-party libraries' import-time advice off tito's output.

A tito server's stdout and stderr hold only tito's own lines, so that a CI log shows what tito did. The lean
install has no torch, and transformers says so at import ("PyTorch was not found. Models won't be
available..."): true, and irrelevant to tito, which uses transformers only for tokenizers.
"""

from __future__ import annotations

import os


def quiet_transformers() -> None:
    """Call before transformers is first imported; its errors and warnings still show."""
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
