"""A Gemini API conversation as Gemini CLI 0.61 sends it, for the adapter tests.

What the real CLI does to history (see tests/captures/gemini): thought parts are left out, adjacent
text parts are joined, each echoed functionCall gains an `id` and the first one a `thoughtSignature`, and
tool output comes back as `{"output": "<untrusted_context>\\n...\\n</untrusted_context>"}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

SHELL = {
    "name": "run_shell_command",
    "description": "Run a shell command.",
    "parametersJsonSchema": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "description": {"type": "string"}},
        "required": ["command"],
    },
}
SKIP_SIGNATURE = "skip_thought_signature_validator"  # what the CLI adds to a call that came without one


def sse_chunks(raw: str) -> list[dict[str, Any]]:
    """The `data:` events of a Gemini stream; every event must be one `data: {json}` line."""
    chunks = []
    for block in raw.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: ") and "\n" not in block, block
        chunks.append(json.loads(block[len("data: ") :]))
    return chunks


def history_parts(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reply's parts as the CLI keeps them: thoughts dropped, adjacent texts joined."""
    parts: list[dict[str, Any]] = []
    for chunk in chunks:
        for part in chunk["candidates"][0]["content"]["parts"]:
            if part.get("thought"):
                continue
            if "text" in part and parts and "text" in parts[-1]:
                parts[-1] = {"text": parts[-1]["text"] + part["text"]}
            else:
                parts.append(dict(part))
    return parts


def untrusted(output: str) -> dict[str, Any]:
    return {"output": f"<untrusted_context>\nOutput: {output}\n</untrusted_context>"}


@dataclass
class GeminiConversation:
    http: aiohttp.ClientSession
    url: str
    key: str
    model: str = "gemini-2.5-flash"
    stream: bool = True
    key_in_query: bool = False
    system: str = "You are a coding agent. Use run_shell_command to inspect the repository."
    contents: list[dict[str, Any]] = field(default_factory=list)
    calls_echoed: int = 0

    def body(self, **extra: Any) -> dict[str, Any]:
        return {
            "contents": self.contents,
            "systemInstruction": {"parts": [{"text": self.system}], "role": "user"},
            "tools": [{"functionDeclarations": [SHELL]}],
            "generationConfig": {
                "temperature": 1,
                "topP": 0.95,
                "topK": 64,
                "thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192},
            },
            **extra,
        }

    def target(self) -> tuple[str, dict[str, str], dict[str, str]]:
        action = "streamGenerateContent" if self.stream else "generateContent"
        query = {"alt": "sse"} if self.stream else {}
        headers = {"Content-Type": "application/json"}
        if self.key_in_query:
            query["key"] = self.key
        else:
            headers["x-goog-api-key"] = self.key
        return f"{self.url}/v1beta/models/{self.model}:{action}", query, headers

    async def post(self, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        url, query, headers = self.target()
        raw = json.dumps(body or self.body(), ensure_ascii=False, separators=(",", ":")).encode()
        async with self.http.post(url, params=query, data=raw, headers=headers) as resp:
            text = await resp.text()
            if resp.status != 200:
                return resp.status, json.loads(text)
            return 200, sse_chunks(text) if self.stream else [json.loads(text)]

    async def turn(self, user: str | None = None) -> list[dict[str, Any]]:
        """Send the next request; echo the reply into the history as the CLI does; returns its parts."""
        if user is not None:
            self.contents.append({"role": "user", "parts": [{"text": user}]})
        status, chunks = await self.post()
        assert status == 200, chunks
        parts = history_parts(chunks)
        echoed, signed = [], False
        for part in parts:
            if "functionCall" in part:
                call = part["functionCall"]
                part = {
                    "functionCall": {
                        "id": f"{call['name']}_{self.calls_echoed}",
                        "args": call["args"],
                        "name": call["name"],
                    }
                }
                self.calls_echoed += 1
                if not signed:
                    part["thoughtSignature"], signed = SKIP_SIGNATURE, True
            echoed.append(part)
        self.contents.append({"parts": echoed, "role": "model"})
        return parts

    def tool_results(self, output: str = "README.md\nsrc") -> bool:
        calls = [p["functionCall"] for p in self.contents[-1]["parts"] if "functionCall" in p]
        if calls:
            self.contents.append(
                {
                    "parts": [
                        {
                            "functionResponse": {
                                "name": c["name"],
                                "response": untrusted(output),
                                **({"id": c["id"]} if "id" in c else {}),
                            }
                        }
                        for c in calls
                    ],
                    "role": "user",
                }
            )
        return bool(calls)

    async def tool_loop(self, task: str = "What is in this repository?") -> int:
        await self.turn(task)
        turns = 1
        while self.tool_results():
            await self.turn()
            turns += 1
        return turns
