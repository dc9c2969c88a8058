"""tito's adapter app: agent wires (`wires/`) to prompt ids (`rendering/`), SGLang `/generate` (`engine/`),
engine text back to reasoning and tool calls (`parsing/`), and one TurnRecord per turn for the manager."""
