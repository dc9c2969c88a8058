"""Each tito server prints only tito's own lines, from its start to its clean stop (SIGTERM).

CI logs of a replay should show what tito did. Third-party libraries print at import and at exit unless kept
from it: transformers' "PyTorch was not found" advice, aiohttp's "Running on" banner, and, when sglang's
runtime was loaded, triton's nanobind leak report (dozens of lines at every exit).
"""

from __future__ import annotations

from tests.process_helpers import capture_dir, free_port, stop, tito
from tests.test_record_cli import agent_headers, post

SCRIPT = "fake_engine/examples/claude_tool_loop.yaml"  # a tool call in its first turn: both parsers run


def foreign_lines(command: str, output: str) -> list[str]:
    return [line for line in output.splitlines() if not line.startswith(f"tito {command}: ")]


def test_serve_record_and_fake_engine_print_only_their_own_lines(tmp_path) -> None:
    engine_port, serve_port, record_port = free_port(), free_port(), free_port()
    engine = f"http://127.0.0.1:{engine_port}"
    request = (capture_dir("claude_baseline") / "bodies" / "baseline_001.json").read_bytes()
    results: dict[str, tuple[int, str]] = {}
    with tito("fake-engine", "--script", SCRIPT, "--port", str(engine_port), ready=engine + "/health") as fake:
        with (
            tito(
                "serve",
                "--engine",
                engine,
                "--listen",
                f"127.0.0.1:{serve_port}",
                ready=f"http://127.0.0.1:{serve_port}/health",
            ) as serve,
            tito(
                "record",
                "--engine",
                engine,
                "--listen",
                f"127.0.0.1:{record_port}",
                "--out",
                str(tmp_path / "run.tito"),
                ready=f"http://127.0.0.1:{record_port}/health",
            ) as record,
        ):
            for port in (serve_port, record_port):
                status, body = post(f"http://127.0.0.1:{port}/v1/messages?beta=true", request, agent_headers())
                assert status == 200, body[:500]
                assert b'"tool_use"' in body  # the reply went through both parsers
            results["serve"], results["record"] = stop(serve), stop(record)
        results["fake-engine"] = stop(fake)
    for command, (returncode, output) in results.items():
        assert returncode == 0, output
        assert output.strip(), f"tito {command} printed nothing: the check below would pass vacuously"
        assert foreign_lines(command, output) == [], output
