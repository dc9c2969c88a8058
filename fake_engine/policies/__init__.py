"""Policies: what "the model" says, one module each (a scenario's script, a cassette's engine leg, the demo),
all behind `tito_rl.fake_engine.policy.Policy`."""
