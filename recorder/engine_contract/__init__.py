"""The engine contract: the same requests sent to a real engine and to the fake engine, answers compared by shape.

`requests` lists what tito's dialects send (per engine), `exchange` sends one and reads the answer (JSON or SSE),
`shape` compares two answers' structure, `fake` runs the fake engine answering with the real engine's tokens,
`answers` reads and writes the committed real answers, `check` is `tito check-engine`, `cli` the make targets.
docs/engine-dialects.md names every difference deliberately left.
"""
