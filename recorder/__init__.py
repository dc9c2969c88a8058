"""Recording: cassettes (cassette/), taps on both legs (taps/), targets (targets/), agent CLIs (agents/) and
the scripted client (scripted/)."""
