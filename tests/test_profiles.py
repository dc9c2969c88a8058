"""Gateway profiles (`recorder/targets/profiles/format.py`, `driver.py`): the file format and its
one-line errors, its JSON Schema, `tito profile check|schema`, the pieces a profile's driver is made of, and a gateway
tito has never seen (tests/gateway_double.py run as a process) recorded, replayed green twice and audited with one
profile file and no Python of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tito_rl.recorder.targets.base import TargetOptions
from tito_rl.recorder.targets.profiles.driver import BUILTIN_DIR, fill, select
from tito_rl.recorder.targets.profiles.format import ProfileError, load_profile, parse_profile, profile_schema
from tito_rl.recorder.targets.registry import create_driver

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "cassettes" / "targets" / "scenarios" / "rllm_mixed.yaml"


def double_profile(tmp_path: Path) -> Path:
    """A profile for the gateway double started as a process: its session API gives ready samples."""
    profile = {
        "profile": 1,
        "name": "double",
        "description": "tests/gateway_double.py as a process",
        "python": {"default": sys.executable},
        "version": "test",
        "start": {
            "command": ["{python}", "-m", "tests.gateway_double", "--engine", "{engine}", "--listen", "{host}:{port}"],
            "cwd": str(ROOT),
            "ready": {"path": "/health"},
        },
        "sessions": {
            "from": "bearer",
            "routing_header": "X-SMG-Routing-Key",
            "drop": [{"method": "DELETE", "path": "/tito/sessions/{session}"}],
        },
        "samples": {
            "request": {"method": "POST", "path": "/tito/sessions/{session}/finish", "json": {"reward": "{reward}"}},
            "rows": {
                "items": "samples[*]",
                "tokens": "tokens",
                "response_length": "response_length",
                "loss_mask": "loss_mask",
                "logprobs": "rollout_log_probs",
            },
        },
        "volatile": ["id", "created", "choices[*].message.tool_calls[*].id", "choices[*].delta.tool_calls[*].id"],
    }
    path = tmp_path / "double.yaml"
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return path


def run_tito(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tito_rl", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


# ---- the format ----


def test_the_shipped_profiles_are_valid_and_versioned() -> None:
    shipped = sorted(BUILTIN_DIR.glob("*.yaml"))
    assert [p.stem for p in shipped] == ["agentlightning", "nemogym"]
    assert all(load_profile(p).profile == 1 and load_profile(p).name == p.stem for p in shipped)
    profile = load_profile(shipped[0])
    assert profile.profile == 1 and profile.name == "agentlightning"
    assert profile.sessions.session_from == "path:/proxy/rollout/{sid}"
    assert profile.samples is not None and profile.samples.calls is not None and profile.samples.merge == "prefix"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"profile": 2}, "profile: format version 2 is not known (this tito reads 1)"),
        ({"colour": 1}, "unknown key 'colour'"),
        ({"start": {"command": [], "ready": {"path": "/h"}}}, "start.command"),
        ({"sessions": {"from": "path:/x"}}, "names the session's segment once, as {sid}"),
        ({"sessions": {"from": "query:x"}}, "expected bearer, header:NAME, cookie:NAME, session-cookie:NAME or path:"),
        ({"setup": [{"path": "api/models"}]}, "setup[0]: path must start with '/'"),
        ({"samples": {"calls": {"items": "[*]", "prompt_ids": "p", "output_ids": "o"}}}, "give request"),
        ({"samples": {"function": "nocolon"}}, "function must be module:function"),
        ({"samples": {"request": {"path": "/s"}}}, "give exactly one of calls, rows, function"),
    ],
)
def test_a_wrong_profile_is_one_line_naming_where(change: dict[str, Any], message: str) -> None:
    data = yaml.safe_load((BUILTIN_DIR / "agentlightning.yaml").read_text()) | change
    with pytest.raises(ProfileError) as caught:
        parse_profile(data, where="p.yaml: ")
    text = str(caught.value)
    assert text.startswith("p.yaml: ") and message in text and "\n" not in text


def test_the_schema_is_made_from_the_format_and_names_every_section() -> None:
    schema = profile_schema()
    assert schema["title"] == "tito gateway profile"
    assert set(schema["required"]) == {"profile", "name", "start"}
    assert {"Start", "Sessions", "SamplesSpec", "CallsMap", "RowsMap", "Call"} <= set(schema["$defs"])
    assert "from" in schema["$defs"]["Sessions"]["properties"]


def test_tito_profile_check_and_schema(tmp_path: Path) -> None:
    good = run_tito("profile", "check", str(BUILTIN_DIR / "agentlightning.yaml"))
    assert good.returncode == 0 and "agentlightning.yaml: ok (profile 1, agentlightning" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("profile: 1\nname: x\n")
    run = run_tito("profile", "check", str(bad))
    assert run.returncode == 2 and f"{bad}: " in run.stderr and "start" in run.stderr
    schema = run_tito("profile", "schema")
    assert schema.returncode == 0 and json.loads(schema.stdout)["title"] == "tito gateway profile"


# ---- the driver's pieces ----


def test_placeholders_fill_strings_and_keep_a_whole_placeholders_type() -> None:
    values = {"session": "s1", "reward": 0.5, "engine": "http://e"}
    assert fill(
        {"value": "{reward}", "url": "{engine}/v1", "x": ["{session}", "{unknown}", "{{session}}"]}, values
    ) == {"value": 0.5, "url": "http://e/v1", "x": ["s1", "{unknown}", "{session}"]}


def test_select_walks_dotted_paths_and_lists() -> None:
    body = [{"event_type": "model_request", "data": {"prompt_token_ids": [1, 2]}}, {"event_type": "reward"}]
    assert select(body, "[*].event_type") == ["model_request", "reward"]
    assert select(body, "[*].data.prompt_token_ids") == [[1, 2]]
    assert select({"samples": [1, 2]}, "samples[*]") == [1, 2]


def test_a_target_file_is_a_profile_and_its_copy_in_the_header_serves_a_trusted_replay_elsewhere(
    tmp_path: Path,
) -> None:
    path = double_profile(tmp_path)
    target = create_driver(str(path), TargetOptions())
    assert target.info.name == "double" and target.info.version == "test"
    kept = target.info.settings["profile"]
    path.unlink()
    again = create_driver(str(path), TargetOptions(extra={"profile": kept}))
    assert again.info.settings["profile"] == kept


# ---- a gateway tito has never seen, with one file ----


@pytest.mark.slow
def test_a_new_gateway_is_recorded_replayed_twice_and_audited_with_one_profile(tmp_path: Path) -> None:
    profile = double_profile(tmp_path)
    scenario = tmp_path / "scenario.yaml"
    data = yaml.safe_load(SCENARIO.read_text())
    data["client"]["record_args"] = ["--target", str(profile), "--engine-dialect", "sglang"]
    for session in data["client"]["sessions"]:
        session.pop("path_prefix", None)
    scenario.write_text(yaml.safe_dump(data, sort_keys=False))
    cassette = tmp_path / "double.tito"
    run = run_tito("simulate", "--scenario", str(scenario), "--out", str(cassette))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    outs = []
    for n in (1, 2):
        out = tmp_path / f"samples{n}.jsonl"
        run = run_tito("replay", str(cassette), "--target", str(profile), "--export-samples", str(out))
        assert run.returncode == 0 and "4 session(s): 4 ok" in run.stdout, run.stdout[-2000:] + run.stderr[-1000:]
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and len(outs[0].splitlines()) >= 3
    audit = run_tito("audit", str(cassette))
    assert audit.returncode in (0, 1), audit.stderr
    assert "double" in audit.stdout
