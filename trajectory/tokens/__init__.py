"""Tokens: the shared tokenizer (by default the real Qwen3 one), its fast loader, and chat templates rendered
as transformers renders them."""
