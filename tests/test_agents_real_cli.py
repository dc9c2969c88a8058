"""Real agent CLIs, installed with the helper, run through LocalSandbox against loopback API stubs.

Turn 1 is answered with a shell tool call that the CLI really executes; turn 2 must carry its output back.
Skipped only where npm is missing; the first run installs the pinned CLIs into .tools/npm (~30 s each).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.agent_stubs import (
    StubState,
    anthropic_app,
    chat_app,
    chat_json_app,
    gemini_app,
    responses_app,
    start_stub,
)
from tito_rl.recorder.agents.install import ensure_installed, install_dir, is_installed
from tito_rl.recorder.agents.launchers import (
    AgentTask,
    ClaudeCodeLauncher,
    CodexLauncher,
    GeminiCliLauncher,
    MiniSweAgentLauncher,
    OpencodeLauncher,
    QwenCodeLauncher,
)
from tito_rl.recorder.agents.pins import CLAUDE_CODE, CODEX, GEMINI_CLI, MINI_SWE_AGENT, OPENCODE, QWEN_CODE
from tito_rl.recorder.agents.sandbox import LocalSandbox

needs_npm = pytest.mark.skipif(
    shutil.which("npm") is None,
    reason="npm is not installed on this machine, so the real agent CLIs can not be installed (apt-get install npm)",
)

SESSION = "tito-e2e-session-1"


async def run_agent(launcher, app, state: StubState, tmp_path: Path):
    binary = await asyncio.to_thread(ensure_installed, launcher.pin)
    server = await start_stub(app)
    try:
        task = AgentTask(str(server.make_url("/")), SESSION, "run echo hi in the shell", "stub-model", timeout_s=180)
        with LocalSandbox(parent=tmp_path, keep=True) as sandbox:
            run = await asyncio.to_thread(launcher.launch, sandbox, task, str(binary))
    finally:
        await server.close()
    return run, sandbox


@pytest.mark.slow
@needs_npm
async def test_real_claude_code_runs_a_tool_loop_against_the_stub(tmp_path: Path) -> None:
    state = StubState()
    run, sandbox = await run_agent(ClaudeCodeLauncher(), anthropic_app(state, "echo hi"), state, tmp_path)
    assert run.ok, f"claude exited {run.exit_code}: {run.stderr_tail}"
    assert (run.agent, run.version, run.session_id) == ("claude-code", CLAUDE_CODE.version, SESSION)
    assert [(r.method, r.path, r.query) for r in state.requests] == [("POST", "/v1/messages", "beta=true")] * 2
    assert all(r.headers["Authorization"] == f"Bearer {SESSION}" for r in state.requests)
    assert all(r.headers["User-Agent"].startswith(f"claude-cli/{CLAUDE_CODE.version}") for r in state.requests)
    assert all(r.body["stream"] is True and r.body["model"] == "stub-model" for r in state.requests)
    first, second = (r.body["messages"] for r in state.requests)
    assert second[-2]["role"] == "assistant"
    assert second[-2]["content"][-1] == {
        "type": "tool_use",
        "id": "toolu_stub_0001",
        "name": "Bash",
        "input": {"command": "echo hi"},
    }
    results = [b for b in second[-1]["content"] if b.get("type") == "tool_result"]
    assert len(results) == 1 and results[0]["tool_use_id"] == "toolu_stub_0001"
    assert "hi" in str(results[0]["content"]) and results[0].get("is_error") is not True
    assert '"result":"done"' in run.stdout_tail
    assert (Path(sandbox.home) / ".claude.json").exists()  # state went to the fresh HOME


@needs_npm
async def test_real_codex_runs_a_tool_loop_over_http_responses(tmp_path: Path) -> None:
    state = StubState()
    run, sandbox = await run_agent(CodexLauncher(), responses_app(state, "echo hi"), state, tmp_path)
    assert run.ok, f"codex exited {run.exit_code}: {run.stderr_tail}"
    assert run.version == CODEX.version
    assert [(r.method, r.path) for r in state.requests] == [("POST", "/v1/responses")] * 2
    assert all(r.headers["Authorization"] == f"Bearer {SESSION}" for r in state.requests)
    first, second = (r.body for r in state.requests)
    assert first["input"][0]["role"] == "developer" and first["stream"] is True and first["store"] is False
    calls = [i for i in second["input"] if i.get("type") == "function_call"]
    outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls] == [
        ("call_stub_0001", "exec_command", '{"cmd": "echo hi"}')
    ]
    assert len(outputs) == 1 and outputs[0]["call_id"] == "call_stub_0001" and "hi\n" in outputs[0]["output"]
    assert '"text":"done"' in run.stdout_tail
    assert (Path(sandbox.home) / "installation_id").exists()  # CODEX_HOME is the fresh HOME


def tool_exchange(body: dict) -> tuple[list[dict], list[dict]]:
    """The echoed assistant tool calls and the tool messages of a chat-completions request."""
    calls = [c for m in body["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    return calls, [m for m in body["messages"] if m["role"] == "tool"]


def tool_text(message: dict) -> str:
    content = message["content"]
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


@pytest.mark.slow
@needs_npm
async def test_real_qwen_code_runs_a_tool_loop_over_chat_completions(tmp_path: Path) -> None:
    state = StubState()
    run, sandbox = await run_agent(QwenCodeLauncher(), chat_app(state, "run_shell_command"), state, tmp_path)
    assert run.ok, f"qwen exited {run.exit_code}: {run.stderr_tail}"
    assert run.version == QWEN_CODE.version
    assert [(r.method, r.path) for r in state.requests] == [("POST", "/v1/chat/completions")] * 2
    assert all(r.headers["Authorization"] == f"Bearer {SESSION}" for r in state.requests)
    assert all(r.body["model"] == "stub-model" and r.body["stream"] is True for r in state.requests)
    calls, results = tool_exchange(state.requests[1].body)
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("call_stub_0001", "run_shell_command", '{"command":"echo hi"}')
    ]  # re-serialised compactly
    assert [m["tool_call_id"] for m in results] == ["call_stub_0001"]
    assert "Command: echo hi" in tool_text(results[0])
    assert (Path(sandbox.home) / ".qwen" / "settings.json").exists()


@pytest.mark.slow
@needs_npm
async def test_real_opencode_runs_a_tool_loop_after_its_title_request(tmp_path: Path) -> None:
    state = StubState()
    run, _ = await run_agent(OpencodeLauncher(), chat_app(state, "bash"), state, tmp_path)
    assert run.ok, f"opencode exited {run.exit_code}: {run.stderr_tail}"
    assert run.version == OPENCODE.version
    assert all(r.headers["Authorization"] == f"Bearer {SESSION}" for r in state.requests)
    side = [r for r in state.requests if not r.body.get("tools")]
    turns = [r for r in state.requests if r.body.get("tools")]
    assert len(side) == 1 and "title" in json.dumps(side[0].body["messages"]).lower()
    assert len(turns) == 2
    calls, results = tool_exchange(turns[1].body)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("bash", '{"command":"echo hi"}')]
    assert [m["tool_call_id"] for m in results] == [calls[0]["id"]]
    assert tool_text(results[0]).strip() == "hi"
    assert all(r.body["model"] == "stub-model" for r in turns)


@pytest.mark.slow
@needs_npm
async def test_real_gemini_cli_runs_a_tool_loop_over_the_gemini_api(tmp_path: Path) -> None:
    state = StubState()
    run, sandbox = await run_agent(GeminiCliLauncher(), gemini_app(state, "echo hi"), state, tmp_path)
    assert run.ok, f"gemini exited {run.exit_code}: {run.stderr_tail}"
    assert run.version == GEMINI_CLI.version
    assert [(r.method, r.path, r.query) for r in state.requests] == [
        ("POST", "/v1beta/models/stub-model:streamGenerateContent", "alt=sse")
    ] * 2
    assert all(r.headers["x-goog-api-key"] == SESSION and "Authorization" not in r.headers for r in state.requests)
    first, second = (r.body for r in state.requests)
    assert first["systemInstruction"]["parts"][0]["text"] and first["tools"][0]["functionDeclarations"]
    assert [c["role"] for c in second["contents"]] == ["user", "model", "user"]
    echoed = second["contents"][1]["parts"]
    assert echoed[0] == {"text": "I'll run a command."}
    # The echo gains an id and a thought signature the stub never sent.
    call = echoed[1]["functionCall"]
    assert (call["name"], call["args"]) == ("run_shell_command", {"command": "echo hi"}) and call["id"]
    assert echoed[1]["thoughtSignature"]
    (result,) = second["contents"][2]["parts"]
    assert result["functionResponse"]["id"] == call["id"]
    output = result["functionResponse"]["response"]["output"]
    assert output.startswith("<untrusted_context>") and "Output: hi" in output
    assert '"content":"done"' in run.stdout_tail.replace(" ", "")
    assert (Path(sandbox.home) / ".gemini" / "settings.json").exists()


@pytest.mark.skipif(
    not is_installed(MINI_SWE_AGENT),
    reason=f"{MINI_SWE_AGENT.spec} is not installed in {install_dir(MINI_SWE_AGENT)} (about 750 MB, never installed by "
    "the tests): `tito simulate --scenario cassettes/targets/scenarios/agentlightning_mini_tool_loop.yaml ...` "
    "or `make corpus` installs it",
)
async def test_real_mini_swe_agent_runs_unstreamed_headless_and_exits_when_it_submits(tmp_path: Path) -> None:
    """Against a server that refuses streaming: no setup prompt, no download (nothing but loopback answers), two
    unstreamed turns, the first command really run, and exit 0 once a command prints the submit word."""
    state = StubState()
    app = chat_json_app(state, ["echo hi > said.txt && cat said.txt", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"])
    run, sandbox = await run_agent(MiniSweAgentLauncher(), app, state, tmp_path)
    assert run.ok, f"mini exited {run.exit_code}: {run.stderr_tail[-1500:]} {run.stdout_tail[-1500:]}"
    assert run.version == MINI_SWE_AGENT.version
    assert [(r.method, r.path) for r in state.requests] == [("POST", "/v1/chat/completions")] * 2
    assert all(r.headers["Authorization"] == f"Bearer {SESSION}" for r in state.requests)
    assert all(
        set(r.body) == {"model", "messages", "tools"} and r.body["model"] == "stub-model" for r in state.requests
    )
    calls, results = tool_exchange(state.requests[1].body)
    assert [(c["id"], c["function"]["name"]) for c in calls] == [("call_stub_0001", "bash")]
    assert [m["tool_call_id"] for m in results] == ["call_stub_0001"]
    assert json.loads(tool_text(results[0])) == {"returncode": 0, "output": "hi\n"}
    assert (Path(sandbox.workdir) / "said.txt").read_text() == "hi\n"
