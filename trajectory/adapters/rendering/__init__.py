"""From canonical messages to prompt token ids: the chat template, incremental encoding, and splicing the
model's own output ids back in."""
