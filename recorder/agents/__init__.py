"""Agent CLIs driven for a recording: pinned versions, installs, launchers, sandboxes and CLI scripts."""
