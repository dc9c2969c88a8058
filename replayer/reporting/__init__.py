"""A replay's results written out: lines on a terminal, JUnit XML for CI, samples as JSON Lines."""
