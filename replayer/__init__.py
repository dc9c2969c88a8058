"""Replay: the replay itself (`replay/`), comparison, goldens, reporting, inspection, cassette tools and the
pytest plugin; `tito demo` and conformance across gateways."""
