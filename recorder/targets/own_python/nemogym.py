"""`--target nemogym`: NeMo Gym's vLLM model server (`nemo-gym` 0.7.0), its samples as its trainer reads them.

The profile `recorder/targets/profiles/nemogym.yaml` says what a profile can: the start (the model server run
directly, its config in `NEMO_GYM_CONFIG_DICT`), where sessions live (`/ng-rollout/<rollout_id>/...`), what its
replies fill at random. This driver adds what a profile cannot:

- a capture folder per start (`token_id_capture: {enabled: true, dir}`): NeMo Gym writes each call of a rollout to
  `<dir>/<rollout_id>.tokens.jsonl` before its reply goes out;
- the samples: NeMo Gym's own consumer, `nemo_gym.token_id_capture.consumer.trajectories_for_rollout(rollout_id,
  [dir])`, run in NeMo Gym's Python at each finish. It rebuilds the rollout's main chain as a Responses object whose
  output items are prefix-contiguous (each item's `prompt_token_ids` extends every token before it): one sample,
  each item's new prompt tokens masked and its `generation_token_ids` trained with `generation_log_probs`. A build
  it marks `mask_sample` is excluded from the loss by its consumers (`nemo_gym/token_id_capture/delivery.py`): the
  sample is kept with its loss mask all zero, so what was never trained shows; a build with no response (no
  record, an unusable capture) gives no sample. Its figures (`delivered_fraction`, `parent_link_failures`, ...) go
  to the finish's stats and to the sample's metadata, so the cassette keeps them;
- drop: the rollout's capture deleted with NeMo Gym's own store (`TokenCaptureStore.delete`), as its rollout
  collection clears a rollout id before reusing it;
- `TITO_NEMOGYM_CONFIG`: a YAML file whose mapping is added to the top of NeMo Gym's config, for record and replay
  alike (`observability_enabled: true` with `model_call_capture_dir`: its evaluation capture); the keys the profile
  sets are refused, and the header's `settings.config` records it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
import yaml

from tito_rl.recorder.targets.base import TargetError, TargetFailure, TargetFinish, TargetOptions
from tito_rl.recorder.targets.own_python.process import free_port
from tito_rl.recorder.targets.profiles.driver import BUILTIN_DIR, ProfileTarget
from tito_rl.recorder.targets.profiles.format import ProfileError, load_profile
from tito_rl.recorder.targets.rllm_samples import build_samples

# Run with NeMo Gym's Python: argv = [rollout_id, capture_dir, model]; prints the build as JSON.
CONSUME = """
import json, sys
from pathlib import Path
from nemo_gym.token_id_capture.consumer import trajectories_for_rollout
built = trajectories_for_rollout(sys.argv[1], [Path(sys.argv[2])], model=sys.argv[3])
print(json.dumps(built))
"""
# argv = [rollout_id, capture_dir]
DELETE = """
import sys
from pathlib import Path
from nemo_gym.token_id_capture.store import TokenCaptureStore
TokenCaptureStore(Path(sys.argv[2])).delete(sys.argv[1])
"""
CONSUMER_TIMEOUT_S = 120.0
CONFIG_ENV = "TITO_NEMOGYM_CONFIG"
CONFIG_KEYS_SET = ("head_server", "dry_run", "token_id_capture", "policy_model")  # the profile's own
# The consumer's build figures kept in the finish's stats (the rest name random call ids or snapshot versions).
METRICS = (
    "n_calls",
    "chains",
    "roots",
    "quarantined_calls",
    "delivered_fraction",
    "generated_tokens_captured",
    "generated_tokens_delivered",
    "parent_link_failures",
    "unresolved_parent_calls",
    "empty_generation_calls",
    "capture_incomplete",
)


def samples_from_build(built: dict[str, Any] | None, reward: float) -> TargetFinish:
    """tito's samples and stats from what `trajectories_for_rollout` returned (plain data: no NeMo Gym needed)."""
    built = built or {}
    response = built.get("rebuilt_response") or {}
    items = [i for i in response.get("output") or [] if isinstance(i, dict) and i.get("generation_token_ids")]
    traces = [
        {
            "prompt_token_ids": i.get("prompt_token_ids"),
            "completion_token_ids": i.get("generation_token_ids"),
            "logprobs": i.get("generation_log_probs"),
        }
        for i in items
    ]
    made = build_samples(traces, reward)
    metrics = built.get("metrics") or {}
    masked = bool(built.get("mask_sample", True))
    calls = int(metrics.get("n_calls") or 0)
    gym = {k: metrics[k] for k in METRICS if k in metrics}
    gym["mask_sample"] = masked
    if built.get("error"):
        gym["error"] = str(built["error"])
    samples = made.samples
    for sample in samples:
        sample["metadata"] = {**sample.get("metadata", {}), "mask_sample": masked, "nemogym": gym}
        if masked:  # excluded from the loss: nothing of it is trained
            sample["loss_mask"] = [0] * len(sample["loss_mask"])
    delivered = 0 if masked else made.stats["turns"]
    stats = {
        **made.stats,
        "turns": max(calls, made.stats["turns"]),
        "untrained_turns": max(calls, made.stats["turns"]) - delivered,
        "trained_tokens": sum(sum(s["loss_mask"]) for s in samples),
        "masked_tokens": sum(len(s["loss_mask"]) - sum(s["loss_mask"]) for s in samples),
        "nemogym": gym,
    }
    return TargetFinish(samples, stats)


class NemoGymTarget(ProfileTarget):
    """The profile's gateway with its capture folder, its consumer at finish and its store at drop."""

    def __init__(self, options: TargetOptions) -> None:
        try:
            profile = load_profile(BUILTIN_DIR / "nemogym.yaml")
        except ProfileError as exc:
            raise TargetError(str(exc)) from None
        super().__init__(profile, options, "nemogym")
        self.capture_dir: str | None = None
        self.config = user_config()
        if self.config:
            self.info.settings["config"] = self.config

    async def start(self, engine_url: str) -> str:
        self.capture_dir = tempfile.mkdtemp(prefix="tito-nemogym-capture-")
        self.values |= {"capture_dir": self.capture_dir, "head_port": free_port()}
        if self.config:  # appended at the top level of the YAML the profile's env holds
            extra = yaml.safe_dump(self.config, sort_keys=False)
            env = dict(self.profile.start.env)
            env["NEMO_GYM_CONFIG_DICT"] = (
                env["NEMO_GYM_CONFIG_DICT"].rstrip("\n") + "\n" + extra.replace("{", "{{").replace("}", "}}")
            )
            self.profile = msgspec.structs.replace(
                self.profile, start=msgspec.structs.replace(self.profile.start, env=env)
            )
        try:
            return await super().start(engine_url)
        except BaseException:
            self._remove_capture()
            raise

    async def _gym(self, script: str, *args: str) -> str:
        """`script` run with NeMo Gym's Python; its stdout. A failure is the finish's (`TargetFailure`)."""
        assert self.python is not None and self.capture_dir is not None
        proc = await asyncio.create_subprocess_exec(
            self.python,
            "-c",
            script,
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), CONSUMER_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise TargetFailure(f"target 'nemogym': its consumer took over {CONSUMER_TIMEOUT_S:.0f} s") from None
        if proc.returncode != 0:
            lines = [x for x in err.decode(errors="replace").splitlines() if x.strip()]
            raise TargetFailure(f"target 'nemogym': its consumer failed: {lines[-1] if lines else proc.returncode}")
        return out.decode()

    async def finish(self, session: str, reward: float) -> TargetFinish:
        assert self.capture_dir is not None
        self.opened.discard(session)
        out = await self._gym(CONSUME, session, self.capture_dir, str(self.values.get("model", "")))
        try:
            built = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
        except json.JSONDecodeError as exc:
            raise TargetFailure(f"target 'nemogym': its consumer printed no JSON: {exc}") from None
        return samples_from_build(built, reward)

    async def drop(self, session: str) -> bool:
        assert self.capture_dir is not None
        known = await super().drop(session)  # the profile has no drop call: whether the session was seen
        await self._gym(DELETE, session, self.capture_dir)
        return known

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            self._remove_capture()

    def _remove_capture(self) -> None:
        if self.capture_dir is not None:
            shutil.rmtree(self.capture_dir, ignore_errors=True)
            self.capture_dir = None


def user_config() -> dict[str, Any]:
    """`TITO_NEMOGYM_CONFIG`'s mapping ({} where unset); a bad file or a key the profile sets is one line."""
    path = os.environ.get(CONFIG_ENV, "").strip()
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TargetError(f"target 'nemogym': {CONFIG_ENV}={path}: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise TargetError(f"target 'nemogym': {CONFIG_ENV}={path}: expected a mapping of NeMo Gym config keys")
    taken = sorted(k for k in data if k in CONFIG_KEYS_SET)
    if taken:
        raise TargetError(f"target 'nemogym': {CONFIG_ENV}={path}: {', '.join(taken)} set by tito's profile")
    return data


def create(options: TargetOptions) -> NemoGymTarget:
    """The `nemogym` target (`recorder/targets/registry.py`)."""
    return NemoGymTarget(options)
