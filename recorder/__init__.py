"""Recording: taps on both legs of a target (`taps/`), the targets themselves (`targets/`), the agent CLIs
(`agents/`) and the scripted client (`scripted/`), `tito record`, `tito simulate` and the scenario corpus."""
