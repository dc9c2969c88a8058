"""Adapters: agent wire formats (Anthropic Messages, OpenAI Chat, OpenAI Responses) to SGLang /generate."""
