"""The folder the real SGLang's server gets on its PYTHONPATH, so that `import sgl_kernel` finds tito's stand-in
(`sgl_kernel.py` here) for the compiled CPU ops no PyPI wheel has. A test tool: nothing of tito imports it but its
tests, which read it as `tito_rl.recorder.real_engine.sgl_kernel_standin.sgl_kernel` (no torch there)."""
