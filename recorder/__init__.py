"""Recording: cassette writer, recording proxy, agent launchers."""
