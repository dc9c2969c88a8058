"""tito, installed: the `tito` program lives here (`main`, with its table of subcommands in `commands`; `python -m
tito_rl` is `tito`), and the repository's other folders are installed inside this package: `tito_rl.trajectory`,
`tito_rl.cassette`, `tito_rl.fake_engine`, `tito_rl.recorder`, `tito_rl.replayer` (docs/architecture.md)."""
