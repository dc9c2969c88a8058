"""How each engine spells an integer array on the wire.

SGLang: base64 (standard alphabet, padded) of the raw little-endian int32 bytes, flat; the reader knows the shape
(`meta_info.routed_experts`: `[rows, layers, top_k]`; the top-p kept sets: flat ids and offsets). vLLM: base64 of
`.npy` bytes (what `numpy.save` writes: the header carries shape and dtype), uint8 while the expert ids fit in a
byte, else uint16 (`choices[i].routed_experts`; read with `np.load(io.BytesIO(base64.b64decode(s)))`).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import numpy as np


def b64_int32(values: np.ndarray | Sequence[int]) -> str:
    """SGLang's encoding: flat little-endian int32, base64."""
    return base64.b64encode(np.asarray(values, dtype="<i4").tobytes()).decode("ascii")


def npy_b64(rows: np.ndarray, experts: int) -> str:
    """vLLM's encoding: the array as `numpy.save` writes it, in the smallest unsigned type that holds the ids."""
    dtype = np.uint8 if experts <= 256 else np.uint16
    buf = io.BytesIO()
    np.save(buf, np.asarray(rows).astype(dtype), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")
