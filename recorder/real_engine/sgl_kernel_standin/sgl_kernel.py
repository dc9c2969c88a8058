"""A stand-in for SGLang's compiled `sgl_kernel` CPU ops, so that PyPI's SGLang serves on a CPU without them.

A test tool for `make real-sglang` (docs/real-engine.md), never tito's runtime: the folder holding this file goes on
the SGLang server's PYTHONPATH and nothing of tito imports it. With `SGLANG_USE_CPU_ENGINE=1`, SGLang 0.5.23 imports
a few CPU ops at module import, with no fallback, and no PyPI wheel has them (sgl-kernel and sglang-kernel are CUDA
builds). On a CPU without AMX the layers take their pure-torch paths, so only three ops are ever called while
serving a dense or MoE model without speculative decoding; each is written here in plain torch from the semantics of
SGLang's own triton kernel at its call site. The speculative-decoding ops are named so that their modules import, and
raise if called. Last, `torch.cuda.cudart()` answers where CUDA is absent: the routed-experts host buffer pins its
memory through `cudaHostRegister` even with `--device cpu`, and pinning means nothing on a CPU.

torch is imported by name (`importlib`): tito's own environment has no torch, and the type checker and tito's tests
read this file there (the hash's arithmetic is plain Python too). The server's Python (`make real-sglang`) runs it.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

try:
    torch: Any = importlib.import_module("torch")
except ModuleNotFoundError:  # tito's own environment, whose tests read the torch-free parts
    torch = None

U32 = 0xFFFFFFFF


# ---- the ops SGLang calls on the CPU -------------------------------------------------------------------------------


def assign_req_to_token_pool_cpu(
    req_pool_indices: Any, req_to_token: Any, start_offset: Any, end_offset: Any, out_cache_loc: Any, pool_len: int
) -> None:
    """Write each request's new cache slots into its row of the request-to-token table.

    Request i owns row `req_pool_indices[i]` and gets positions `start_offset[i]:end_offset[i]`; the slots come from
    `out_cache_loc` packed request after request (mem_cache/allocation.py: `assign_req_to_token_pool`).
    """
    del pool_len  # the row width; torch indexing knows it
    taken = 0
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    for row, start, end in zip(rows, starts, ends, strict=True):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[taken : taken + length].to(req_to_token.dtype)
        taken += length


def copy_all_layer_kv_cache_cpu(data_ptrs: Any, strides: Any, tgt_loc: Any, src_loc: Any) -> None:
    """Move KV rows `src_loc` to `tgt_loc` in every layer buffer (kvcache/cache_move.py: `copy_all_layer_kv_cache`).

    Buffer b starts at address `data_ptrs[b]` and holds one row every `strides[b]` bytes. All source rows are read
    before any is written, so overlapping moves are safe, as the triton kernel's are.
    """
    targets = tgt_loc.tolist()
    sources = src_loc.tolist()
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        rows = [ctypes.string_at(base + src * stride, stride) for src in sources]
        for tgt, row in zip(targets, rows, strict=True):
            ctypes.memmove(base + tgt * stride, row, stride)


# ---- murmur_hash32_cpu: a torch op (sampling/murmur_hash.py calls torch.ops.sgl_kernel.murmur_hash32_cpu) --------
# The same arithmetic serves Python ints and int64 tensors: every intermediate stays below 2**49, so nothing wraps.


def _mul32(value: Any, constant: int) -> Any:
    """(value * constant) mod 2**32, in two halves of the constant."""
    low = value * (constant & 0xFFFF)
    high = ((value * (constant >> 16)) & 0xFFFF) << 16
    return (low + high) & U32


def _rotl32(value: Any, bits: int) -> Any:
    return ((value << bits) | (value >> (32 - bits))) & U32


def _mix(state: Any, block: Any) -> Any:
    """One 4-byte block of MurmurHash3 (x86, 32-bit) folded into the state."""
    block = _mul32(block, 0xCC9E2D51)
    block = _rotl32(block, 15)
    block = _mul32(block, 0x1B873593)
    state = _rotl32(state ^ block, 13)
    return (_mul32(state, 5) + 0xE6546B64) & U32


def _finish(state: Any, length: int) -> Any:
    state = state ^ length
    state = state ^ (state >> 16)
    state = _mul32(state, 0x85EBCA6B)
    state = state ^ (state >> 13)
    state = _mul32(state, 0xC2B2AE35)
    return state ^ (state >> 16)


def murmur3_32(words: list[Any], seed: int = 0) -> Any:
    """MurmurHash3_x86_32 of a message of whole little-endian 4-byte words (ints, or int64 tensors of them)."""
    state: Any = seed
    for word in words:
        state = _mix(state, word)
    return _finish(state, 4 * len(words))


def murmur_hash32_value(seed: Any, position: Any, column: Any) -> Any:
    """What SGLang's kernel hashes for one (row, column) of its sampling noise: MurmurHash3_x86_32, seed 0, of the
    16 bytes seed (low word, high word), position, column. A negative seed counts as its two's-complement bits, as
    the kernel's cast to uint64 reads it (`>>` keeps the sign, so each word is masked after the shift)."""
    return murmur3_32([seed & U32, (seed >> 32) & U32, position & U32, column & U32])


def _murmur_hash32_cpu(seed: Any, positions: Any, col_indices: Any) -> Any:
    """[n] seeds and positions by [m] columns: an [n, m] uint32 tensor of hashes."""
    seeds = seed.to(torch.int64).reshape(-1, 1)
    rows = positions.to(torch.int64).reshape(-1, 1)
    cols = col_indices.to(torch.int64).reshape(1, -1)
    return murmur_hash32_value(seeds, rows, cols).to(torch.uint32)


def _register_murmur_op() -> None:
    library = torch.library.Library("sgl_kernel", "FRAGMENT")
    library.define("murmur_hash32_cpu(Tensor seed, Tensor positions, Tensor col_indices) -> Tensor")
    library.impl("murmur_hash32_cpu", _murmur_hash32_cpu, "CPU")
    _LIBRARIES.append(library)  # a Library unregisters its ops when collected


_LIBRARIES: list[Any] = []


# ---- speculative decoding: imported at module load, never called without --speculative-algorithm ----------------


def _not_here(name: str) -> Any:
    def op(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"sgl_kernel.{name}: tito's CPU stand-in has no speculative decoding (start SGLang without it)"
        )

    op.__name__ = name
    return op


SPECULATIVE_OPS = (
    "build_tree_kernel_efficient_cpu",  # kernels/ops/speculative/spec_tree.py
    "verify_tree_greedy_cpu",
    "assign_draft_cache_locs_contiguous_cpu",  # kernels/ops/speculative/cache_locs.py
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",  # kernels/ops/speculative/eagle.py
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",  # kernels/ops/speculative/multi_layer_eagle.py
)

build_tree_kernel_efficient_cpu = _not_here("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _not_here("verify_tree_greedy_cpu")
assign_draft_cache_locs_contiguous_cpu = _not_here("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _not_here("assign_extend_cache_locs_cpu")
fill_accept_out_cache_loc_cpu = _not_here("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _not_here("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _not_here("rotate_input_ids_cpu")


# ---- torch.cuda.cudart() where CUDA is absent ----------------------------------------------------------------------


class HostMemoryCalls:
    """The cudart calls SGLang's host buffers make (mem_cache/pool_host/common.py), answering success: on a CPU
    the memory is already host memory, so there is nothing to pin."""

    def cudaHostRegister(self, pointer: int, size: int, flags: int) -> int:  # noqa: N802 (CUDA's name)
        return 0

    def cudaHostUnregister(self, pointer: int) -> int:  # noqa: N802
        return 0

    def cudaGetErrorString(self, code: int) -> str:  # noqa: N802
        return "cudaSuccess" if code == 0 else f"error {code}"


def _answer_cudart_without_cuda() -> None:
    if not torch.cuda.is_available():
        calls = HostMemoryCalls()
        torch.cuda.cudart = lambda: calls


if torch is not None:
    _register_murmur_op()
    _answer_cudart_without_cuda()
