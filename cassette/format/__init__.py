"""The cassette format, the one place that knows how a cassette is laid out on disk (spec for people writing
other readers: `cassettes/FORMAT.md`; keep the two in step).

A cassette is the 8-byte magic followed by frames (`frames`), each one msgpack record (`records`). Token
arrays are packed (`packing`), prompts stored as deltas against the session's context (`deltas`, `codec`), and
what any of it may decode to is bounded while it is read (`budget`, `checks`). A cleanly closed cassette ends
in an index (`index`)."""
