"""The scripted agent client: a scenario's client: section played over the real wires, no CLI needed."""
