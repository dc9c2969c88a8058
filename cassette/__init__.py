"""Cassettes: the format (`format/`), the writer (and its process), the reader and its index, redaction, and
which recorded engine call answers a request (`matching`). Imported by the recorder, the replayer and the fake
engine alike."""
