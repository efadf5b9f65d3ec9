"""A stand-in for the ``sgl_kernel`` CPU functions SGLang calls with SGLANG_USE_CPU_ENGINE=1.

SGLang's CPU kernels are built from source only, with AVX-512/AMX flags; PyPI has no
CPU build. Two of its functions are called on the path of a dense Llama; they are
implemented here in plain torch with the semantics of SGLang's triton versions:

* ``assign_req_to_token_pool_cpu`` —
  ``sglang.srt.mem_cache.allocation.assign_req_to_token_pool``
* ``copy_all_layer_kv_cache_cpu`` —
  ``sglang.kernels.ops.kvcache.cache_move.copy_all_layer_kv_cache_tiled``

Every other name is importable, so SGLang's module-level imports succeed, but raises
``NotImplementedError`` naming the kernel when called. No ``torch.ops.sgl_kernel`` op
is registered, so SGLang's ``cpu_has_amx_support()`` stays false and layers take
their ``forward_native`` paths.
"""

from __future__ import annotations

import ctypes
import types

import torch

STANDIN_MARKER = "__pdd_testbed_standin__"


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of ``req_to_token``.

    Request ``i`` takes the next ``end_offset[i] - start_offset[i]`` entries of
    ``out_cache_loc`` (packed request after request) into columns
    ``[start_offset[i], end_offset[i])`` of row ``req_pool_indices[i]``.
    """
    table = req_to_token.view(-1, pool_len)
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    taken = 0
    for row, start, end in zip(req_pool_indices.tolist(), starts, ends, strict=True):
        count = end - start
        if count > 0:
            table[row, start:end] = out_cache_loc[taken : taken + count].to(table.dtype)
            taken += count


def _bytes_at(address: int, size: int) -> torch.Tensor:
    """A uint8 tensor over ``size`` bytes of existing memory (no copy)."""
    return torch.frombuffer((ctypes.c_uint8 * size).from_address(address), dtype=torch.uint8)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """In every buffer, copy the row (``stride`` bytes) at each ``src_loc`` to ``tgt_loc``.

    ``data_ptrs[b]`` is the address of buffer ``b`` and ``strides[b]`` its row size in
    bytes. All source rows are read before any target is written, so overlapping
    moves are safe, as in the triton kernel.
    """
    if src_loc.numel() == 0:
        return
    src = src_loc.to(torch.int64)
    tgt = tgt_loc.to(torch.int64)
    rows = int(torch.maximum(src.max(), tgt.max()).item()) + 1
    for address, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        buffer = _bytes_at(address, rows * stride).view(rows, stride)
        buffer[tgt] = buffer.index_select(0, src)


IMPLEMENTED = {
    "assign_req_to_token_pool_cpu": assign_req_to_token_pool_cpu,
    "copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache_cpu,
}


def _missing_kernel(qualified_name: str):
    def missing(*args, **kwargs):
        raise NotImplementedError(
            f"{qualified_name} is a CUDA/AVX-512 kernel with no CPU stand-in in "
            "pdd-testbed (engine_patches.cpu.sgl_kernel_standin); this SGLang code "
            "path is not supported on this host"
        )

    missing.__name__ = qualified_name.rsplit(".", 1)[-1]
    missing.__qualname__ = missing.__name__
    return missing


def make_module() -> types.ModuleType:
    """The stand-in ``sgl_kernel`` module: the kernels above, every other name a stub."""
    module = types.ModuleType("sgl_kernel", __doc__)
    setattr(module, STANDIN_MARKER, True)
    module.__dict__.update(IMPLEMENTED)
    module.__version__ = "0.0.0+pdd-testbed-cpu-standin"

    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _missing_kernel(f"sgl_kernel.{attr}")

    module.__getattr__ = __getattr__
    return module
