"""The built-in `miles` target: miles' session server (`miles/rollout/session/server.py`, radixark/miles), run from
the user's miles checkout (`TITO_MILES_PATH`) in a Python that has miles' requirements (`TITO_MILES_PYTHON`, else
the cached environment `own_python/envs.py` makes over the real SGLang: `python -m
tito_rl.recorder.targets.own_python.envs miles`).

Why a process of its own, not tito's: miles' session server imports torch (`miles/utils/types.py`, and
`miles/backends/megatron_utils/__init__.py` by way of `miles/utils/logging_utils.py`), ray (`miles/utils/misc.py`,
through `miles/utils/lifecycle.py`), setproctitle, pybase64, and `sglang.srt.entrypoints.openai.encoding_dsv4`
(`miles/utils/chat_template_utils/deepseek.py`), which sglang 0.5.16 and miles' sglang-miles branch have and
0.5.23, the release tito's parsers are pinned to, does not. One interpreter cannot hold both sglangs; miles itself
runs the server as a spawned process (`miles/ray/rollout/router_manager.py` `start_session_server`). Nothing of it
needs a GPU.

The gateway is miles' code unchanged: `SessionServer(args, engine_url)` served by uvicorn, with `args` as miles'
own CPU tests build them (`tests/fast/router/test_sessions.py` `router_env`) and a named `--tito-model` resolved as
`miles/utils/arguments.py` resolves it. `SERVE` (run with `python -c`) adds two things around miles' app, both
through miles' HTTP API as miles' rollout uses it (`miles/rollout/generate_utils/openai_endpoint_utils.py`):
- sessions: miles names its sessions (`POST /sessions` answers a uuid), tito names its own. The first request under
  `/sessions/<tito id>/` creates a miles session and maps the id; the engine call then carries miles' id in
  `X-SMG-Routing-Key`, so `routing_header` is None and tito attributes engine calls by the forwarded
  `Authorization` (`recorder/taps/attribution.py`).
- finish: `OpenAIEndpointTracer.collect_samples`' steps: `POST /sessions/{id}/samples`, `DELETE /sessions/{id}`, and
  miles' own `decode_samples_and_merge_input_sample` onto a default `Sample()`; the reward is tito's (miles' v1
  wire carries none: its reward model scores the sample later). The decoded `Sample` keeps its per-token channels:
  `rollout_routed_experts` (miles asks SGLang for them with `use_rollout_routing_replay`, reads them from the
  choice's `meta_info` and reshapes them with `num_layers`, `generate_endpoint_utils.py`) and `weight_versions`
  (one per turn, from `meta_info.weight_version`, `samples/merge.py`).

`TITO_MILES_CONFIG`: a YAML file whose mapping is laid over miles' `args` (its own argument names, e.g.
`use_rollout_routing_replay: true` and the model's `num_layers` for an MoE run), for record and replay alike; the
header's `settings.config` records it. The keys the driver sets for the session server itself are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import IO, Any

import aiohttp
import numpy as np
import yaml

from tito_rl.recorder.targets.base import TargetError, TargetFinish, TargetInfo, TargetOptions, TargetUnavailable
from tito_rl.recorder.targets.own_python.envs import gateway_python
from tito_rl.recorder.targets.slime_env import git_commit
from tito_rl.trajectory.records import Sample
from tito_rl.trajectory.tokens.tokenizer import fingerprint, resolve_dir

PATH_ENV = "TITO_MILES_PATH"
PYTHON_ENV = "TITO_MILES_PYTHON"
CONFIG_ENV = "TITO_MILES_CONFIG"
# What the driver sets for the server itself: the tokenizer, the server mode, where the engine is.
CONFIG_KEYS_SET = ("hf_checkpoint", "use_session_server", "session_server_instance_id", "miles_router_timeout")
SERVER_FILE = Path("miles") / "rollout" / "session" / "server.py"
HOW = (
    f"set {PATH_ENV} to a miles checkout (git clone https://github.com/radixark/miles) and {PYTHON_ENV} to a "
    "Python with miles' requirements (torch, ray, setproctitle, pybase64, sglang 0.5.16 or miles' sglang-miles; "
    "`python -m tito_rl.recorder.targets.own_python.envs miles` makes one over the real SGLang)"
)
# miles passes the engine's reply through (re-serialised; a streamed one as a single chunk): SGLang's random ids
# and wall clock.
VOLATILE = ("id", "created", "choices[*].message.tool_calls[*].id", "choices[*].delta.tool_calls[*].id")
SESSION_PREFIX = "/sessions/{id}"  # TargetInfo.session_path: agents' base URL is `{server}/sessions/<sid>/v1`
START_TIMEOUT_S = 180.0  # the import of torch, transformers and sglang's protocol, on a cold disk
STOP_TIMEOUT_S = 10.0
POLL_S = 0.1

SERVE = r'''
"""tito's launcher of miles' session server (recorder/targets/miles.py): argv[1] is its JSON config."""
import asyncio, json, socket, sys
from types import SimpleNamespace

import httpx, uvicorn
from miles.rollout.session.samples.codec import decode_samples_and_merge_input_sample
from miles.rollout.session.server import SessionServer
from miles.utils.chat_template_utils.tito_tokenizer import resolve_fixed_chat_template
from miles.utils.types import Sample

config = json.loads(sys.argv[1])
args = SimpleNamespace(**config["args"])
if args.tito_model != "default":  # as miles/utils/arguments.py resolves a named --tito-model
    path, fixed = resolve_fixed_chat_template(args.tito_model)
    args.chat_template_path = path
    args.apply_chat_template_kwargs = {**(args.apply_chat_template_kwargs or {}), **fixed}
miles = SessionServer(args, config["backend_url"]).app
inner = httpx.AsyncClient(transport=httpx.ASGITransport(app=miles), base_url="http://miles", timeout=None)
ids, calls, lock = {}, {}, asyncio.Lock()  # tito's id -> miles' id; tito's id -> chat calls answered 200


async def miles_id(sid):
    async with lock:
        if sid not in ids:
            ids[sid] = (await inner.post("/sessions")).json()["session_id"]
        return ids[sid]


async def finish(sid):
    mid = ids.pop(sid, None)
    if mid is None:
        return {"samples": [], "calls": 0, "records": 0, "empty_reason": "unknown_session"}
    records = len((await inner.get(f"/sessions/{mid}")).json()["records"])
    try:
        reply = await inner.post(f"/sessions/{mid}/samples", json={"max_seq_len": args.max_seq_len})
    finally:
        await inner.delete(f"/sessions/{mid}")
    if reply.status_code != 200:
        return {"error": f"POST /sessions/{{id}}/samples answered {reply.status_code}: {reply.text[:500]}"}
    got = decode_samples_and_merge_input_sample(reply.content, Sample())
    samples = [{"tokens": s.tokens, "response_length": s.response_length, "loss_mask": s.loss_mask,
                "rollout_log_probs": s.rollout_log_probs, "status": s.status.value, "metadata": s.metadata,
                "weight_versions": list(s.weight_versions),
                "rollout_routed_experts": None if s.rollout_routed_experts is None
                else s.rollout_routed_experts.tolist()}
               for s in got.samples]
    return {"samples": samples, "calls": calls.pop(sid, 0), "records": records, "empty_reason": got.empty_reason,
            "mismatch": got.session_metadata.get("tito_session_mismatch")}


async def drop(sid):
    mid = ids.pop(sid, None)
    calls.pop(sid, None)
    if mid is not None:
        await inner.delete(f"/sessions/{mid}")
    return {}


async def answer(send, payload):
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def app(scope, receive, send):
    path = scope.get("path", "") if scope["type"] == "http" else ""
    if path.startswith("/tito/sessions/"):
        sid, _, op = path[len("/tito/sessions/"):].partition("/")
        return await answer(send, await (finish(sid) if op == "finish" else drop(sid)))
    parts = path.split("/", 3)
    if len(parts) == 4 and parts[1] == "sessions" and parts[2]:
        new = f"/sessions/{await miles_id(parts[2])}/{parts[3]}"
        scope = {**scope, "path": new, "raw_path": new.encode()}
        if parts[3] == "v1/chat/completions":
            sid, inner_send = parts[2], send

            async def send(message):
                if message["type"] == "http.response.start" and message["status"] == 200:
                    calls[sid] = calls.get(sid, 0) + 1
                await inner_send(message)
    await miles(scope, receive, send)


sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind((config["host"], 0))
print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False, lifespan="on")).run(sockets=[sock])
'''


def locate() -> Path:
    """The miles checkout `TITO_MILES_PATH` names; `TargetUnavailable` when unset, `TargetError` when wrong."""
    configured = os.environ.get(PATH_ENV, "").strip()
    if not configured:
        raise TargetUnavailable(f"target 'miles': {PATH_ENV} is not set: {HOW}")
    root = Path(configured).expanduser().resolve()
    if not (root / SERVER_FILE).is_file():
        raise TargetError(f"target 'miles': {PATH_ENV}={configured} has no {SERVER_FILE}: {HOW}")
    return root


def miles_args(options: TargetOptions) -> dict[str, Any]:
    """miles' `args` for the session server, as its CPU tests build them; a named `tito_model` (default `qwen3`
    for tito's embedded Qwen3 tokenizer) is resolved in the server process, as miles' argument check does."""
    extra = {**config_file(), **options.extra}
    tito_model = str(extra.get("tito_model", "qwen3" if options.tokenizer_dir is None else "default"))
    given = {k: v for k, v in extra.items() if k not in DRIVER_OPTIONS}
    return given | {
        "hf_checkpoint": str(resolve_dir(options.tokenizer_dir).resolve()),
        "tito_model": tito_model,
        "chat_template_path": extra.get("chat_template_path"),
        "apply_chat_template_kwargs": dict(extra.get("apply_chat_template_kwargs") or {}),
        "session_message_matcher": str(extra.get("session_message_matcher", "strict")),
        "max_seq_len": extra.get("max_seq_len"),
        "miles_router_timeout": float(extra.get("timeout_s", 600.0)),
        "sglang_speculative_algorithm": None,
        "save_debug_trajectory_data": None,
        "session_server_instance_id": None,
        "use_session_server": True,
        "use_rollout_routing_replay": bool(extra.get("use_rollout_routing_replay", False)),
        "num_layers": extra.get("num_layers"),
    }


# The driver's own options (`TargetOptions.extra`), the rest being miles' argument names.
DRIVER_OPTIONS = ("host", "timeout_s", "profile")


def config_file() -> dict[str, Any]:
    """`TITO_MILES_CONFIG`'s mapping of miles' arguments ({} where unset); a bad file is one line."""
    path = os.environ.get(CONFIG_ENV, "").strip()
    if not path:
        return {}
    where = f"target 'miles': {CONFIG_ENV}={path}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"{where}: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise TargetError(f"{where}: expected a mapping of miles' argument names")
    taken = sorted(k for k in data if k in CONFIG_KEYS_SET)
    if taken:
        raise TargetError(f"{where}: {', '.join(taken)} set by tito's driver")
    return data


class MilesTarget:
    """miles' session server as a tito target (see the module docstring)."""

    def __init__(self, options: TargetOptions) -> None:
        self.root = locate()
        self.python = gateway_python("miles")  # TITO_MILES_PYTHON, else the cached environment
        self.host = str(options.extra.get("host", "127.0.0.1"))
        self.args = miles_args(options)
        self.proc: asyncio.subprocess.Process | None = None
        self.log: IO[bytes] | None = None
        self.http: aiohttp.ClientSession | None = None
        self.url = ""
        settings = {k: self.args[k] for k in ("tito_model", "session_message_matcher", "max_seq_len")}
        config = config_file()
        if config:
            settings["config"] = config
        self.info = TargetInfo(
            name="miles",
            version=git_commit(self.root),
            volatile=VOLATILE,
            routing_header=None,
            settings={**settings, "server": "v1 (linear)", "tokenizer_fingerprint": fingerprint(options.tokenizer_dir)},
            session_path=SESSION_PREFIX,
        )

    async def start(self, engine_url: str) -> str:
        if self.proc is not None:
            raise RuntimeError("the miles target is already started")
        config = {"args": self.args, "backend_url": engine_url.rstrip("/"), "host": self.host}
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(self.root), os.environ.get("PYTHONPATH")])),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the server's life, closed by stop
        self.proc = await asyncio.create_subprocess_exec(
            self.python,
            "-c",
            SERVE,
            json.dumps(config),
            cwd=self.root,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.log,
        )
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.args["miles_router_timeout"]))
        try:
            assert self.proc.stdout is not None
            line = await asyncio.wait_for(self.proc.stdout.readline(), START_TIMEOUT_S)
            if not line:
                raise TargetError(f"target 'miles': the session server exited: {self._last_error()}")
            self.url = f"http://{self.host}:{json.loads(line)['port']}"
            await asyncio.wait_for(self._healthy(), START_TIMEOUT_S)
        except (TimeoutError, ValueError, KeyError) as exc:
            await self.stop()
            raise TargetError(f"target 'miles': the session server did not start: {exc!r}") from None
        except TargetError:
            await self.stop()
            raise
        return self.url

    async def finish(self, session: str, reward: float) -> TargetFinish:
        got = await self._tito("finish", session)
        if "error" in got:
            raise RuntimeError(f"miles' session server: {got['error']}")
        samples = [tito_sample(s, reward) for s in got["samples"]]
        covered = sum(turns_in(s) for s in got["samples"])
        trained = sum(sum(s["loss_mask"]) for s in samples)
        turns = got["calls"]
        stats = {
            "turns": turns,
            "samples": len(samples),
            "forks": {},
            "realigns": 0,
            "merges": max(0, covered - len(samples)),
            "untrained_turns": max(0, turns - covered),
            "discarded_turns": max(0, turns - got["records"]),  # rolled back: the echo differed (strict)
            "trained_tokens": trained,
            "masked_tokens": sum(s["response_length"] for s in samples) - trained,
            "empty_reason": got["empty_reason"],
            "template_mismatches": len(got.get("mismatch") or []),
        }
        return TargetFinish(samples, stats)

    async def drop(self, session: str) -> None:
        await self._tito("drop", session)

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if self.http is not None:
            await self.http.close()
            self.http = None
        if proc is not None and proc.returncode is None:
            proc.terminate()  # uvicorn's graceful exit; miles' shutdown hook closes its httpx pool
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self.log is not None:
            self.log.close()
            self.log = None

    async def _healthy(self) -> None:
        assert self.http is not None and self.proc is not None
        while True:
            if self.proc.returncode is not None:
                raise TargetError(f"target 'miles': the session server exited: {self._last_error()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with self.http.get(f"{self.url}/health") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(POLL_S)

    async def _tito(self, op: str, session: str) -> dict[str, Any]:
        if self.http is None:
            raise RuntimeError("the miles target is not started")
        async with self.http.post(f"{self.url}/tito/sessions/{session}/{op}") as response:
            answer = await response.json()
        if not isinstance(answer, dict):
            raise RuntimeError(f"miles' session server answered {op} with {type(answer).__name__}, not an object")
        return answer

    def _last_error(self) -> str:
        """The server's last stderr line (an import error, say), for a one-line failure."""
        if self.log is None:
            return "no output"
        self.log.seek(0)
        lines = [x for x in self.log.read().decode(errors="replace").splitlines() if x.strip()]
        return lines[-1].strip()[:300] if lines else "no output"


def turns_in(sample: dict[str, Any]) -> int:
    """How many session turns a decoded sample holds: miles gives each turn's sample one lifecycle segment (a
    dict) and `merge_samples` lists them (`miles/rollout/generate_utils/sample_utils.py`)."""
    segments = sample["metadata"].get("lifecycle")
    return len(segments) if isinstance(segments, list) else int(segments is not None)


def tito_sample(sample: dict[str, Any], reward: float) -> dict[str, Any]:
    """A decoded miles `Sample` in tito's layout, its invariants checked; its status kept, its wall-clock
    lifecycle segments (`miles/utils/lifecycle.py`) left out, as no replay can reproduce them."""
    metadata = {k: v for k, v in sample["metadata"].items() if k != "lifecycle"} | {"status": sample["status"]}
    routes = sample.get("rollout_routed_experts")
    return Sample(
        tokens=[int(t) for t in sample["tokens"]],
        response_length=int(sample["response_length"]),
        loss_mask=[int(m) for m in sample["loss_mask"]],
        rollout_log_probs=[float(x) for x in sample["rollout_log_probs"]],
        reward=float(reward),
        metadata=metadata,
        rollout_routed_experts=None if routes is None else np.asarray(routes, dtype=np.int32),
        weight_versions=[str(v) for v in sample.get("weight_versions") or []],
    ).to_dict()


def create(options: TargetOptions) -> MilesTarget:
    """The `miles` target's factory (entry point `tito.targets: miles`)."""
    return MilesTarget(options)
