"""Driving a target driver over real HTTP in tests: a fake engine that logs its /generate traffic, a short
scripted session per wire, and the checks every driver's samples must pass."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tito_rl.fake_engine.app import EngineOptions, create_app
from tito_rl.fake_engine.policies.scripted import ScriptedPolicy, parse_scenario
from tito_rl.recorder.scripted.script import ClientScript, parse_client_script
from tito_rl.recorder.targets import slime_env
from tito_rl.recorder.targets.base import ROUTING_HEADER, TargetError, TargetFinish
from tito_rl.replayer.pytest_plugin.fixtures import ThreadedServer
from tito_rl.trajectory.records import Sample
from tito_rl.trajectory.tokens.tokenizer import load_tokenizer

TURNS: list[dict[str, Any]] = [
    {
        "reasoning": "List the files first.",
        "text": "Let me look at the project.",
        "tool_calls": [{"name": "shell", "arguments": {"command": "ls", "description": "List files"}}],
    },
    {
        "reasoning": "There is a README; read it.",
        "tool_calls": [{"name": "read", "arguments": {"file_path": "/work/README.md"}}],
    },
    {"reasoning": "It says what the project is.", "text": "This is a small calculator library."},
]
TOOLS = {"anthropic": ["Bash", "Read"], "chat": ["run_shell_command", "read_file"]}
RESULTS = {
    "anthropic": {"Bash": "README.md\nsrc", "Read": "# calc\nA small calculator library."},
    "chat": {"run_shell_command": "README.md\nsrc", "read_file": "# calc\nA small calculator library."},
}


def session_id(wire: str, stream: bool) -> str:
    return f"drv-{wire}-{'sse' if stream else 'json'}"


def system_prompt(sid: str) -> str:
    return f"You are agent {sid}, a coding agent working in /work. Be brief."


def scenario(sids: list[str], turns: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's side: each session (told apart by its system prompt) plays `turns`."""
    return {
        "name": "target-drivers",
        "after_last": "error",
        "sessions": [{"match": {"prompt_contains": f"agent {sid},"}, "turns": turns} for sid in sids],
    }


def client_script(sessions: list[tuple[str, bool]], max_turns: int = 12, prefix: str = "drv") -> ClientScript:
    """The client's side: per (wire, stream) one session asking one question, its tool loop, no finish."""
    return parse_client_script(
        {
            "sessions": [
                {
                    "id": session_id(wire, stream).replace("drv", prefix, 1),
                    "wire": wire,
                    "stream": stream,
                    "system": system_prompt(session_id(wire, stream).replace("drv", prefix, 1)),
                    "tools": TOOLS[wire],
                    "results": RESULTS[wire],
                    "steps": [{"prompt": "What is this project?", "max_turns": max_turns}],
                }
                for wire, stream in sessions
            ]
        }
    )


@dataclass
class Generation:
    routing_key: str | None
    prompt: list[int]
    output: list[int]
    logprobs: list[float]


@dataclass
class LoggedEngine:
    """The fake engine on a thread of its own, noting every /generate it answers."""

    server: ThreadedServer
    generations: list[Generation] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def of(self, system_marker: str) -> list[Generation]:
        tokenizer = load_tokenizer()
        return [g for g in self.generations if system_marker in tokenizer.decode(g.prompt[:80])]


def start_logged_engine(sids: list[str], turns: list[dict[str, Any]] | None = None) -> LoggedEngine:
    tokenizer = load_tokenizer()
    policy = ScriptedPolicy(parse_scenario(scenario(sids, TURNS if turns is None else turns)), tokenizer)
    holder: list[LoggedEngine] = []

    @web.middleware
    async def log(request: web.Request, handler: Any) -> web.StreamResponse:
        body = await request.read()
        response = await handler(request)
        if request.path == "/generate" and response.status == 200 and isinstance(response, web.Response):
            assert isinstance(response.body, bytes | bytearray)  # a json_response's
            meta = json.loads(response.body)["meta_info"]
            pairs = meta["output_token_logprobs"]
            holder[0].generations.append(
                Generation(
                    request.headers.get(ROUTING_HEADER),
                    json.loads(body)["input_ids"],
                    [p[1] for p in pairs],
                    [p[0] for p in pairs],
                )
            )
        return response

    def make() -> web.Application:
        app = create_app(policy, EngineOptions(tokenizer=tokenizer))
        app.middlewares.append(log)
        return app

    engine = LoggedEngine(ThreadedServer(make))
    holder.append(engine)
    engine.server.start()
    return engine


def samples_of(finished: list[dict[str, Any]] | TargetFinish | None) -> list[dict[str, Any]]:
    assert finished is not None, "the driver's gateway offered no samples"
    return finished.samples if isinstance(finished, TargetFinish) else finished


def trained_runs(sample: dict[str, Any]) -> list[tuple[list[int], list[float]]]:
    """The sample's maximal runs of trained tokens, with their logprobs."""
    start = len(sample["tokens"]) - sample["response_length"]
    runs: list[tuple[list[int], list[float]]] = []
    previous = 0
    for i, mask in enumerate(sample["loss_mask"]):
        if mask and not previous:
            runs.append(([], []))
        if mask:
            runs[-1][0].append(sample["tokens"][start + i])
            runs[-1][1].append(sample["rollout_log_probs"][i])
        previous = mask
    return runs


def check_samples(samples: list[dict[str, Any]], generations: list[Generation], *, every_output: bool) -> int:
    """The invariants every target's samples keep; returns how many engine outputs are trained.

    tokens = prompt + response (the prompt being one the engine was sent); loss mask and logprobs cover
    the response; every trained run is one engine output, token for token and logprob for logprob; no output is
    trained twice; with `every_output`, every output is trained once."""
    assert samples, "no samples"
    prompts = [g.prompt for g in generations]
    outputs = [(g.output, g.logprobs) for g in generations]
    trained: list[int] = []
    for sample in samples:
        Sample.from_dict(sample)  # lengths agree: loss_mask, logprobs = response_length <= tokens
        prompt_length = len(sample["tokens"]) - sample["response_length"]
        assert sample["tokens"][:prompt_length] in prompts, "the sample's prompt is no engine prompt"
        assert prompt_length > 0 and any(sample["loss_mask"])
        for ids, logprobs in trained_runs(sample):
            found = [i for i, (out, lps) in enumerate(outputs) if out == ids]
            assert found, f"a trained run of {len(ids)} tokens is no engine output"
            assert outputs[found[0]][1] == logprobs, "trained logprobs differ from the engine's"
            trained.append(found[0])
    assert len(trained) == len(set(trained)), f"an output is trained twice: {trained}"
    if every_output:
        assert sorted(trained) == list(range(len(outputs))), f"trained outputs {trained} of {len(outputs)}"
    return len(trained)


def mask_paths(data: Any, paths: tuple[str, ...]) -> Any:
    """(`data` with every field a volatile path names replaced by "<volatile>", the paths that named one)."""
    hits: set[str] = set()

    def walk(node: Any, parts: list[str], path: str) -> Any:
        if not parts:
            hits.add(path)
            return "<volatile>"
        head, rest = parts[0], parts[1:]
        key, star = (head[:-3], True) if head.endswith("[*]") else (head, False)
        if not isinstance(node, dict) or key not in node:
            return node
        value = node[key]
        if star:
            if isinstance(value, list):
                node = {**node, key: [walk(v, rest, path) for v in value]}
            return node
        return {**node, key: walk(value, rest, path)}

    for path in paths:
        data = walk(data, path.split("."), path)
    return data, hits


def reply_payloads(raw: bytes, content_type: str) -> list[Any]:
    """A JSON reply as one payload, an SSE reply as its events' data."""
    if "event-stream" not in content_type:
        return [json.loads(raw)]
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            out.append(json.loads(line[5:]))
    return out


def slime_missing() -> str | None:
    """Why slime's adapters cannot run here (its checkout not found), or None: the reason its tests skip with."""
    try:
        slime_env.locate()
    except TargetError as exc:
        return str(exc)
    return None
