"""Per-token channels the fake engine sends beside each token: expert routes, top-p kept sets, weight versions."""
