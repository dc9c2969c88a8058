"""`tito audit`: checks over a recording's two legs and its samples, no replay (docs/audit.md)."""
