"""Engine text -> reasoning, content and tool calls, with sglang's own parsers: loaded without sglang's serving
runtime, in this process or in a helper process while start-up goes on."""
