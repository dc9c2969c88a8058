"""Golden files beside cassettes (`files`), and how a golden diff reads (`diff_view`)."""
