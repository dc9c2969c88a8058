"""The agent wires, one module each (Anthropic Messages, OpenAI Chat, OpenAI Responses, Gemini API): a request
to canonical messages and a `TurnRequest`, a `TurnReply` to the wire's reply (JSON or SSE)."""
