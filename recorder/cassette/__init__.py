"""Cassettes on disk: the format (one place), the writer and its process, redaction, and the vcrpy persister."""
