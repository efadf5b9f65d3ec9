"""The sgl_kernel stand-in against SGLang's reference semantics, on random inputs.

The references below transcribe SGLang's triton kernels element by element
(``allocation.assign_req_to_token_pool`` and ``cache_move.copy_all_layer_kv_cache_tiled``),
which cannot run on a CPU; the stand-ins are vectorised torch.
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from engine_patches.cpu import import_hooks, sgl_kernel_standin
from engine_patches.cpu.sgl_kernel_standin import (
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
)


def reference_assign(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc):
    # Program pid reads out_cache_loc at sum(end - start) of the programs before it.
    for pid in range(len(req_pool_indices)):
        out_offset = int(sum(end_offset[:pid] - start_offset[:pid]))
        row = int(req_pool_indices[pid])
        for j, col in enumerate(range(int(start_offset[pid]), int(end_offset[pid]))):
            req_to_token[row, col] = out_cache_loc[out_offset + j]


@pytest.mark.parametrize("seed", range(5))
def test_assign_req_to_token_pool_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    pool_rows, pool_len, batch = 16, 300, int(torch.randint(1, 9, (1,), generator=g))
    req_pool_indices = torch.randperm(pool_rows, generator=g)[:batch]
    start = torch.randint(0, 150, (batch,), generator=g)
    end = start + torch.randint(0, 100, (batch,), generator=g)
    out_cache_loc = torch.randint(0, 10_000, (int((end - start).sum()),), generator=g)
    expected = torch.randint(0, 10_000, (pool_rows, pool_len), generator=g, dtype=torch.int32)
    actual = expected.clone()

    reference_assign(req_pool_indices, expected, start, end, out_cache_loc)
    assign_req_to_token_pool_cpu(req_pool_indices, actual, start, end, out_cache_loc, pool_len)

    assert torch.equal(actual, expected)


def reference_copy(buffers, strides, tgt_loc, src_loc):
    # Per buffer, every source row is loaded before any target row is stored.
    for buf, stride in zip(buffers, strides, strict=True):
        rows = buf.view(torch.uint8).view(-1, stride)
        loaded = [rows[s].clone() for s in src_loc.tolist()]
        for t, value in zip(tgt_loc.tolist(), loaded, strict=True):
            rows[t] = value


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("overlapping", [False, True])
def test_copy_all_layer_kv_cache_matches_reference(seed, overlapping):
    g = torch.Generator().manual_seed(seed)
    layers, tokens = 3, 64
    shapes = [(tokens, 2, 8), (tokens, 4, 4)]  # two buffer kinds with different row sizes
    buffers = [torch.randn(shapes[i % 2], generator=g) for i in range(2 * layers)]
    n = int(torch.randint(1, 20, (1,), generator=g))
    perm = torch.randperm(tokens, generator=g)
    src = perm[:n]
    tgt = perm[n // 2 : n // 2 + n] if overlapping else perm[n : 2 * n]
    strides = [b[0].numel() * b.element_size() for b in buffers]

    expected = [b.clone() for b in buffers]
    reference_copy(expected, strides, tgt, src)
    copy_all_layer_kv_cache_cpu(
        torch.tensor([b.data_ptr() for b in buffers], dtype=torch.int64),
        torch.tensor(strides, dtype=torch.int64),
        tgt,
        src,
    )

    for got, want in zip(buffers, expected, strict=True):
        assert torch.equal(got, want)


def test_other_names_import_but_raise_naming_the_kernel():
    module = sgl_kernel_standin.make_module()
    from_import = module.fused_add_rmsnorm  # what `from sgl_kernel import X` does
    with pytest.raises(NotImplementedError, match="sgl_kernel.fused_add_rmsnorm"):
        from_import(torch.zeros(1))
    with pytest.raises(AttributeError):
        module.__wrapped__  # noqa: B018 - dunders must not look like kernels


def test_finder_serves_standin_only_without_a_real_sgl_kernel():
    import_hooks.install()
    assert not import_hooks.real_sgl_kernel_installed(), "this host has a real sgl_kernel"
    sys.modules.pop("sgl_kernel", None)
    module = importlib.import_module("sgl_kernel")
    assert getattr(module, sgl_kernel_standin.STANDIN_MARKER)
    assert module.assign_req_to_token_pool_cpu is assign_req_to_token_pool_cpu
    # Submodules stay unimportable so SGLang's `except ImportError` fallbacks work.
    with pytest.raises(ImportError):
        importlib.import_module("sgl_kernel.scalar_type")
