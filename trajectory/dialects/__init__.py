"""Engine dialects: the engine APIs gateways call, each read into one normalized view (`view.EngineView`)."""
