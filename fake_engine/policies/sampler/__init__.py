"""`tito fake-engine --policy random`: a policy that samples like a model (seeded tokens over the real vocabulary,
honouring what an engine's sampler honours). `model.py` is the pseudo-model, `params.py` reads both engines'
sampling parameters, `policy.py` samples."""
