"""`tito cassette`: look at and reshape cassettes without replaying them (info, export, cut, merge)."""
