"""The pytest plugin (entry point `tito`): every cassette session a test, fixtures for your own tests, its
settings, and vcrpy support for an adapter embedded in your process."""
