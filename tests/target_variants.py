"""Drivers the target tests name as `module:attribute`: tito's own adapter behind the generic taps, and the
same adapter with a one-token edit in its translation (what a gateway team's bug looks like to a replay)."""

from __future__ import annotations

from typing import Any

from tito_rl.recorder.targets.base import TargetOptions
from tito_rl.recorder.targets.tito import TitoDriver


class EditedTito(TitoDriver):
    """Translates the system prompt with one more token at its end (`"... be brief."` -> `"... be brief.!"`)."""

    async def start(self, engine_url: str) -> str:
        url = await super().start(engine_url)
        adapter = self._adapter
        original = adapter.renderer_messages

        def edited(state: Any, request: Any) -> list[dict[str, Any]]:
            messages = original(state, request)
            if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
                messages = [{**messages[0], "content": messages[0]["content"] + "!"}, *messages[1:]]
            return messages

        adapter.renderer_messages = edited
        return url


def edited(options: TargetOptions) -> EditedTito:
    return EditedTito(options)


def not_a_driver(options: TargetOptions) -> object:
    return object()
