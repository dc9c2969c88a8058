"""The tokenizer loaded without transformers gives transformers' text and ids: on every prompt of every committed
cassette (rendered with transformers' `apply_chat_template` and encoded by its tokenizer, against tito's render,
Jinja render and incremental, line-cached encode), on the special tokens and vocabulary, and only for folders
whose pipeline is the one transformers builds."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, normalizers

from tito_rl.cassette.reader import read_header
from tito_rl.replayer.replay.cassette_replay import replay_cassette
from tito_rl.replayer.replay.options import ReplayOptions
from tito_rl.trajectory.adapters.app import Adapter
from tito_rl.trajectory.tokens.light_tokenizer import (
    PINNED_PARTS,
    LightTokenizer,
    UnsupportedTokenizer,
    check_pipeline,
    from_parts,
)
from tito_rl.trajectory.tokens.tokenizer import (
    default_tokenizer_dir,
    fingerprint,
    load_tokenizer,
    load_transformers_tokenizer,
)

ROOT = Path(__file__).resolve().parent.parent
CASSETTES = sorted((ROOT / "cassettes").glob("*.tito"))


@pytest.fixture(scope="module")
def reference() -> Any:
    return load_transformers_tokenizer()


def test_the_default_tokenizer_loads_without_transformers_and_keeps_its_fingerprint() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import sys\n"
                "from tito_rl.trajectory.tokens.tokenizer import load_tokenizer, fingerprint\n"
                "from tito_rl.trajectory.adapters.parsing.sglang_loader import parsers\n"
                "from tito_rl.trajectory.adapters.rendering.render import ChatRenderer\n"
                "tok = load_tokenizer(); parsers()\n"
                "r = ChatRenderer(tok, True)\n"
                "print(type(tok).__name__, len(r.encode(r.render([{'role': 'user', 'content': 'hi'}], None))))\n"
                "print(fingerprint(), 'transformers' in sys.modules)\n"
            ),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    name, count = done.stdout.splitlines()[0].split()
    assert name == "LightTokenizer" and int(count) > 3
    # the fingerprint every committed cassette pins, unchanged; transformers never imported
    pinned = {read_header(path).tokenizer_fingerprint for path in CASSETTES}
    assert done.stdout.splitlines()[1] == f"{fingerprint()} False" and pinned == {fingerprint()}


def test_a_prefetched_fingerprint_is_hashed_once_and_a_missing_folder_is_left_to_the_caller(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from tito_rl.trajectory.tokens import tokenizer

    expected = fingerprint()
    hashed: list[str] = []
    slow = tokenizer._fingerprint.__wrapped__

    @functools.lru_cache(maxsize=8)
    def counted(folder: str, stamp: tuple[Any, ...]) -> str:
        hashed.append(folder)
        time.sleep(0.2)  # the caller below asks while the thread still hashes
        return slow(folder, stamp)

    monkeypatch.setattr(tokenizer, "_fingerprint", counted)
    thread = tokenizer.prefetch_fingerprint()
    assert fingerprint() == expected and len(hashed) == 1  # it waited for the thread's answer
    thread.join()
    tokenizer.prefetch_fingerprint(tmp_path / "none").join()  # no folder: nothing raised or printed
    assert capsys.readouterr() == ("", "")
    with pytest.raises(FileNotFoundError):
        fingerprint(tmp_path / "none")


def test_a_child_forked_while_the_fingerprint_is_hashed_can_still_hash() -> None:
    """`tito replay -j` forks its workers; the prefetch thread may hold the hashing lock at that moment."""
    from tito_rl.trajectory.tokens import tokenizer

    with tokenizer._HASHING:  # as the prefetch thread does mid-hash
        pid = os.fork()
        if pid == 0:
            signal.alarm(30)  # a child stuck on the lock dies, and the test fails instead of hanging
            code = 0 if fingerprint() else 1
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.slow
def test_every_committed_prompt_renders_and_encodes_as_with_transformers(
    reference: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[Any, list[dict[str, Any]], Any, list[int], bool]] = []
    prompt = Adapter.prompt

    def capture(self: Adapter, state: Any, request: Any) -> Any:
        made = prompt(self, state, request)
        # a spliced prompt's ids are the turn it continues plus the new text's: not an encode of the render
        seen.append((self.renderer, made.messages, request.tools, list(made.ids), made.splice.ids is not None))
        return made

    monkeypatch.setattr(Adapter, "prompt", capture)
    for path in CASSETTES:
        before = len(seen)
        result = replay_cassette(path, options=ReplayOptions())
        assert result.ok and len(seen) > before, path  # the recorded prompts' ids, reproduced
    assert len(seen) > 100 and sum(not spliced for *_, spliced in seen) > 40
    for renderer, messages, tools, ids, spliced in seen:
        expected = reference.apply_chat_template(
            messages,
            tools=tools or None,
            chat_template=renderer.template,
            tokenize=False,
            add_generation_prompt=True,
            **renderer.template_kwargs,
        )
        assert renderer.render(messages, tools) == expected
        assert renderer.render_jinja(messages, tools) == expected  # the Jinja path, not only the native one
        if spliced:  # the same text, in the tokens the model sampled where it continues a turn
            assert reference.decode(ids) == expected
        else:
            assert ids == reference.encode(expected, add_special_tokens=False)


def test_tokens_vocabulary_and_decoding_agree_with_transformers(reference: Any) -> None:
    light = load_tokenizer()
    assert isinstance(light, LightTokenizer)
    for name in (
        "special_tokens_map",
        "all_special_tokens",
        "all_special_ids",
        "eos_token_id",
        "pad_token_id",
        "bos_token_id",
        "unk_token_id",
        "eos_token",
        "pad_token",
        "chat_template",
    ):
        assert getattr(light, name) == getattr(reference, name), name
    assert light.get_vocab() == reference.get_vocab() and len(light) == len(reference)
    for token in ("<|im_start|>", "<think>", "Hello", "no-such-token-at-all"):
        assert light.convert_tokens_to_ids(token) == reference.convert_tokens_to_ids(token)
    text = "Ünïcode ✓ e\u0301 <|im_start|>user\n\n  x\t<think>y</think> 42\r\n<|im_end|>"
    ids = light.encode(text)
    assert ids == reference.encode(text, add_special_tokens=False)
    for skip in (False, True):
        assert light.decode(ids, skip_special_tokens=skip) == reference.decode(ids, skip_special_tokens=skip)
    assert light.convert_ids_to_tokens(ids) == reference.convert_ids_to_tokens(ids)
    messages = [{"role": "user", "content": "hi"}]
    assert light.apply_chat_template(
        messages, tokenize=True, return_dict=False, add_generation_prompt=True
    ) == reference.apply_chat_template(messages, tokenize=True, return_dict=False, add_generation_prompt=True)


def test_the_pinned_tokenizer_built_from_its_parts_is_its_tokenizer_json_serialized_byte_for_byte(
    tmp_path: Path,
) -> None:
    """The embedded tokenizer loads from vocab.json, merges.txt and its config (0.1 s sooner): only a folder whose
    fingerprint is pinned does, and what it builds serializes exactly as its tokenizer.json loads."""
    folder = default_tokenizer_dir()
    assert {fingerprint()} == PINNED_PARTS
    config = json.loads((folder / "tokenizer_config.json").read_text())
    built = from_parts(folder, config)
    assert built.to_str() == Tokenizer.from_file(str(folder / "tokenizer.json")).to_str()
    assert load_tokenizer()._tokenizer.to_str() == built.to_str()
    copy = tmp_path / "tok"
    shutil.copytree(folder, copy)
    with open(copy / "merges.txt", "a") as merges:  # files no longer the pinned ones: tokenizer.json is read
        merges.write("\n")
    assert fingerprint(copy) not in PINNED_PARTS
    assert load_tokenizer(copy)._tokenizer.to_str() == built.to_str()
    moved = {**config, "added_tokens_decoder": {"151700": config["added_tokens_decoder"]["151643"]}}
    with pytest.raises(UnsupportedTokenizer, match="added token 151700"):
        from_parts(folder, moved)


def test_a_pipeline_transformers_builds_otherwise_is_left_to_transformers(tmp_path: Path) -> None:
    folder = default_tokenizer_dir()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    check_pipeline(backend, config)
    changed_configs = [
        {**config, "tokenizer_class": "LlamaTokenizerFast"},
        {**config, "split_special_tokens": True},
        {**config, "clean_up_tokenization_spaces": True},
        {**config, "add_prefix_space": True},
        {
            **config,
            "added_tokens_decoder": {
                **config["added_tokens_decoder"],
                "151644": {**config["added_tokens_decoder"]["151644"], "lstrip": True},
            },
        },
    ]
    for changed in changed_configs:
        with pytest.raises(UnsupportedTokenizer):
            check_pipeline(backend, changed)
    backend.normalizer = normalizers.NFKC()
    with pytest.raises(UnsupportedTokenizer, match="normalizer"):
        check_pipeline(backend, config)
    copy = tmp_path / "tok"
    shutil.copytree(folder, copy)
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, "clean_up_tokenization_spaces": True}))
    assert not isinstance(load_tokenizer(copy), LightTokenizer)  # transformers' own, which cleans up spaces
    assert fingerprint(copy) != fingerprint()
