"""Looking inside a cassette's sessions: `tito inspect` (text and a self-contained HTML page) and `tito diff`
(the training data of two recordings, or of one under a candidate change)."""
