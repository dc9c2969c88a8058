"""Build the tiny random-weights Qwen3 the real engine serves; run by the engine venv's Python, not tito's.

`python tiny_qwen3.py OUT_DIR TOKENIZER_DIR SEED`. Standalone on purpose: the engine's venv has torch and
transformers but not tito, and tito's has no torch. The weights come from a fixed seed, so the same seed
gives byte-identical files; the tokenizer files are the embedded Qwen3 ones (the chat template renders as
Qwen3's). The dimensions are the smallest the CPU attention kernels accept (head_dim 32).
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
BOS_ID = 151643  # <|endoftext|>
EOS_ID = 151645  # <|im_end|>


def config_values(vocab_size: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,  # the tokenizer's length (real Qwen3 pads to 151,936)
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,  # vLLM's CPU attention accepts 32, 64, 80, ...; 16 starts, then fails the first request
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "torch_dtype": "float32",
    }


def build(out: Path, tokenizer_dir: Path, seed: int) -> None:
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    config = transformers.Qwen3Config(**config_values(len(tokenizer)))
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(config).to(torch.float32)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    # vLLM applies generation_config.json's sampling values as request defaults: only the special ids here.
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}, indent=2) + "\n", encoding="utf-8"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: tiny_qwen3.py OUT_DIR TOKENIZER_DIR SEED", file=sys.stderr)
        return 2
    build(Path(argv[0]), Path(argv[1]), int(argv[2]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
