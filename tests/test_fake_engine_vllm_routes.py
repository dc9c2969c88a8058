"""The fake engine's vLLM routes held to vLLM's own code (issue 46): vLLM's CPU build cannot route (its Model Runner V2
needs Triton), so no real vLLM answer with routes can be recorded here; what can be checked is the encoding. vLLM
0.32 writes `choices[i].routed_experts` with `vllm.utils.serial_utils.numpy2base64` over the capturer's snapshot,
narrowed to uint8 up to 256 experts, else uint16 (`routed_experts_capturer.py`). Run in the real vLLM's own Python
(`make real-engine`), that function must write, byte for byte, the string the fake engine sends for the same rows,
and numpy there must read the fake's string back to the rows. Skipped, saying why, where the vLLM venv is absent."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from tito_rl.fake_engine.channels.moe import MoeShape, answer_rows
from tito_rl.fake_engine.channels.wire import npy_b64
from tito_rl.recorder.real_engine.paths import read_ready

# In vLLM's Python: its serializer over the rows and dtype the capturer would hand it, and numpy's reading of ours.
PROBE = """
import base64, importlib.util, io, json, sys, sysconfig
import numpy as np
# the module's file alone, not the vllm package (whose import starts the whole engine's machinery)
path = sysconfig.get_paths()["purelib"] + "/vllm/utils/serial_utils.py"
spec = importlib.util.spec_from_file_location("vllm_serial_utils", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
numpy2base64 = module.numpy2base64
cases = json.loads(sys.stdin.read())
out = []
for case in cases:
    dtype = "uint8" if case["experts"] <= 256 else "uint16"
    rows = np.asarray(case["rows"], dtype=np.int32).astype(dtype)
    theirs = numpy2base64(rows)
    read = np.load(io.BytesIO(base64.b64decode(case["fake"])), allow_pickle=False)
    out.append({"theirs": theirs, "read": read.tolist(), "dtype": str(read.dtype), "shape": list(read.shape)})
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def vllm_python() -> str:
    ready = read_ready()
    if ready is None:
        pytest.skip("no real vLLM built here (make real-engine): vLLM's own serializer cannot be run")
    return ready.python


def test_the_fake_engines_vllm_routes_are_what_vllms_serializer_writes(vllm_python: str) -> None:
    ids = list(range(151_600, 151_640))
    cases = []
    for shape in (MoeShape(2, 2, 8), MoeShape(48, 8, 128), MoeShape(4, 8, 300)):  # uint8, a real shape, uint16
        rows = answer_rows(ids, shape)
        cases.append({"experts": shape.experts, "rows": rows.tolist(), "fake": npy_b64(rows, shape.experts)})
    run = subprocess.run(
        [vllm_python, "-c", PROBE], input=json.dumps(cases), capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    answers = json.loads(run.stdout)
    for case, answer in zip(cases, answers, strict=True):
        assert answer["theirs"] == case["fake"]  # the same bytes as vLLM's numpy2base64
        assert answer["read"] == case["rows"]
        assert answer["dtype"] == ("uint8" if case["experts"] <= 256 else "uint16")
        assert answer["shape"] == [len(ids) - 1, *np.asarray(case["rows"]).shape[1:]]
