"""Build the tiny random-weights Qwen3 the real engine serves; run by the engine venv's Python, not tito's.

`python tiny_qwen3.py OUT_DIR TOKENIZER_DIR SEED [dense|moe]`. Standalone on purpose: the engine's venv has torch
and transformers but not tito, and tito's has no torch. The weights come from a fixed seed, so the same seed
gives byte-identical files; the tokenizer files are the embedded Qwen3 ones (the chat template renders as
Qwen3's). The dimensions are the smallest the CPU attention kernels accept (head_dim 32). `moe` builds a
Qwen3-MoE of the same size (8 experts, 2 per token, bf16) for the real SGLang's expert routes.
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


def moe_config_values(vocab_size: int) -> dict[str, Any]:
    """A Qwen3-MoE as small as the dense one: every layer sparse, 8 experts of width 32, top 2."""
    return config_values(vocab_size) | {
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        # SGLang's Qwen3-MoE has no tied head (real Qwen3-MoE models tie none): tied, its lm_head stays unloaded
        # and answers garbage with null logprobs.
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def build(out: Path, tokenizer_dir: Path, seed: int, kind: str = "dense") -> None:
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    if kind == "moe":
        config = transformers.Qwen3MoeConfig(**moe_config_values(len(tokenizer)))
        torch.manual_seed(seed)
        model = transformers.Qwen3MoeForCausalLM(config).to(torch.bfloat16)
    else:
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
    if len(argv) not in (3, 4) or argv[3:] not in ([], ["dense"], ["moe"]):
        print("usage: tiny_qwen3.py OUT_DIR TOKENIZER_DIR SEED [dense|moe]", file=sys.stderr)
        return 2
    build(Path(argv[0]), Path(argv[1]), int(argv[2]), *argv[3:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
