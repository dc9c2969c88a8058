"""How SGLang's flat route rows split into layers x top_k: told by the user, else learned from the engine's model.

SGLang answers `meta_info.routed_experts` flat (rows of `layers * top_k` int32), and no answer of it states the split:
its capturer sizes a row from the served model's config (`num_hidden_layers` x `num_experts_per_tok`, after
`--json-model-override-args`), and its `/get_server_info` names that model's folder (`model_path`) and the overrides.
So tito reads, in order: the layout the user gave (`--routes-layout LAYERS,TOP_K`, `AdapterSettings.
engine_routes_layout`); the config.json of the folder the engine serves from, where this machine can read it (an
adapter beside its engine usually can: a local folder, or a Hub id in the local Hugging Face cache); the tokenizer
folder's config.json; else the rows stay flat and each sample's metadata says so (`sample_channels`). What is learned
at start goes in the recording's header (as a setting), so a replay splits the same way without the folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Names model configs give the experts each token is routed to (Qwen3-MoE, Mixtral, DeepSeek: num_experts_per_tok).
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "moe_router_topk", "num_experts_per_token")
LAYOUT_FORM = "expected LAYERS,TOP_K (two positive integers, e.g. 48,8)"


@dataclass(frozen=True)
class RoutesLayout:
    """`layers` None: the config names top_k only, and a row's width gives the layers."""

    top_k: int
    layers: int | None = None
    source: str = ""  # where it was read, for messages


def parse_routes_layout(text: str) -> tuple[int, int]:
    """`LAYERS,TOP_K`, e.g. `48,8`; a ValueError saying the expected form otherwise (one line)."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        layers, top_k = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--routes-layout {text!r}: {LAYOUT_FORM}") from None
    if layers < 1 or top_k < 1:
        raise ValueError(f"--routes-layout {text!r}: {LAYOUT_FORM}")
    return layers, top_k


def given_layout(value: Any) -> RoutesLayout | None:
    """The setting's value (`(layers, top_k)`, a list once read back from a header) as a layout; a ValueError naming
    the setting for anything else (a header can come from a pull request)."""
    if value is None:
        return None
    if isinstance(value, list | tuple) and len(value) == 2 and all(type(v) is int and v > 0 for v in value):
        return RoutesLayout(value[1], value[0], "the settings")
    raise ValueError(f"engine_routes_layout {value!r}: {LAYOUT_FORM}")


def config_layout(folder: str | None, overrides: dict[str, Any] | None = None) -> RoutesLayout | None:
    """The layout the config.json in `folder` states (its `text_config` for a multimodal model), with SGLang's
    `--json-model-override-args` applied over it; None where there is no readable config or it names no top_k."""
    if not folder or not Path(folder, "config.json").is_file():
        return None
    try:
        config = json.loads(Path(folder, "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    config = {**config, **(overrides or {})}
    text = config.get("text_config")
    for section in (text, config) if isinstance(text, dict) else (config,):
        top_k = next((v for k in TOP_K_KEYS if type(v := section.get(k)) is int and v > 0), None)
        if top_k is not None:
            layers = section.get("num_hidden_layers")
            return RoutesLayout(top_k, layers if type(layers) is int and layers > 0 else None, str(folder))
    return None


def engine_layout(info: Any) -> RoutesLayout | None:
    """The layout of the model an SGLang engine's `/get_server_info` answer names (`model_path`, with its
    `json_model_override_args`), where this machine can read that model's config.json; None otherwise."""
    if not isinstance(info, dict) or not isinstance(info.get("model_path"), str) or not info["model_path"]:
        return None
    try:
        overrides = json.loads(info.get("json_model_override_args") or "{}")
    except (TypeError, ValueError):
        overrides = {}
    folder = local_model_folder(info["model_path"])
    return config_layout(folder, overrides if isinstance(overrides, dict) else {})


def local_model_folder(model_path: str) -> str | None:
    """`model_path` itself where it is a folder here, else a Hub id's snapshot in the local Hugging Face cache
    (never downloaded: the engine's host may have it, this one need not)."""
    if Path(model_path).is_dir():
        return model_path
    if model_path.startswith(("/", ".", "~")) or model_path.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(model_path, "config.json")
    except Exception:  # noqa: BLE001 - a name the Hub would refuse is simply not in the cache
        return None
    return str(Path(found).parent) if isinstance(found, str) else None


def routes_top_k(model_dir: str | None) -> int | None:
    """The experts per token the config.json in `model_dir` states; None where it does not say."""
    layout = config_layout(model_dir)
    return layout.top_k if layout is not None else None


SERVER_INFO_PATHS = ("/server_info", "/get_server_info")  # 0.5.6+, and the older name every release answers


async def fetch_server_info(engine_url: str, timeout_s: float = 5.0) -> dict[str, Any] | None:
    """SGLang's start arguments (`/server_info`, else `/get_server_info`); None where neither answers a map."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for path in SERVER_INFO_PATHS:
            try:
                async with http.get(engine_url.rstrip("/") + path) as resp:
                    if resp.status != 200:
                        continue
                    info = await resp.json(content_type=None)
            except ValueError:
                continue
            except (aiohttp.ClientError, TimeoutError):
                return None
            if isinstance(info, dict):
                return info
    return None


def learned_layout(info: dict[str, Any] | None, tokenizer_dir: str | None) -> RoutesLayout | None:
    """For an engine whose start arguments say it serves routes: its model's layout, else the tokenizer folder's.
    None for an engine that does not serve routes (nothing to split, nothing kept)."""
    if not info or info.get("enable_return_routed_experts") is not True:
        return None
    return engine_layout(info) or config_layout(tokenizer_dir)
