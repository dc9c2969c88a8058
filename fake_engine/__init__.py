"""An SGLang-compatible fake engine that plays a scripted (or recorded) policy, with fault injection."""
