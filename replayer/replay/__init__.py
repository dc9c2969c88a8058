"""The replay itself: a session's plan, the agent leg re-sent to the target, the engine leg answered from the
cassette, the results; one cassette (`cassette_replay`) or many (`batch`), and `tito replay` (`cli`)."""
