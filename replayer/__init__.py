"""Replay: cassette reader, replay through the adapters, diffs."""
