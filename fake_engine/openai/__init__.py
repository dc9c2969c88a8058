"""The OpenAI-compatible engine dialects (`sglang-openai`, `vllm-openai`, `vllm-generate`) beside SGLang's `/generate`:
same policy, queue, aborts and faults, each answered in its engine's own shapes (docs/fake-engine.md#dialects)."""
