"""Settings for a long-running server process (`tito serve`, `tito record`, `tito fake-engine`).

Everything loaded at startup (the tokenizer, the chat template, sglang's parsers and the modules they
import: about 460k Python objects) lives as long as the process, yet each full garbage collection walks
all of it: a pause of about 300 ms that lands on whichever agent request is in flight. Freezing the
startup objects leaves the collector only what the traffic creates.
"""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Call once everything long-lived is loaded, just before serving."""
    gc.collect()
    gc.freeze()
