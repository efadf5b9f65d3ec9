"""The CPU decode-attention replacement against SGLang's own torch_native decode, on
random tensors: the same output bit for bit whether a request's context sits in one
run of pool slots (read as a view), in scattered slots or in a run out of order (read
by index), for several requests per batch, with and without GQA."""

from __future__ import annotations

import pytest
import torch

from engine_patches.cpu import decode_attention
from engine_patches.cpu.decode_attention import context_kv

POOL = 512


def _layouts(kind: str, seq_lens: list[int]) -> torch.Tensor:
    """req_to_token rows for ``seq_lens``: each request's slots as ``kind`` says."""
    rows = torch.zeros(len(seq_lens), 256, dtype=torch.int32)
    scattered, start = torch.randperm(POOL).to(torch.int32), 3
    for i, n in enumerate(seq_lens):
        run = torch.arange(start, start + n, dtype=torch.int32)
        rows[i, :n] = {
            "runs": run,  # one ascending run each: read as a view
            "scattered": scattered[start : start + n],
            "reversed": run.flip(0),  # the run's slots, out of order: gathered
            "split": torch.cat([run[n // 2 :], run[: n // 2]]),  # two runs
        }[kind]
        start += n + 5  # a gap between requests
    return rows


@pytest.mark.parametrize("kind", ["runs", "scattered", "reversed", "split"])
@pytest.mark.parametrize("gqa", [False, True])
def test_decode_attention_is_sglangs_bit_for_bit(kind, gqa):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    original = TorchNativeAttnBackend._run_sdpa_forward_decode
    torch.manual_seed(0)
    heads, kv_heads, dim = 8, (2 if gqa else 8), 16
    k_cache, v_cache = torch.randn(POOL, kv_heads, dim), torch.randn(POOL, kv_heads, dim)
    seq_lens = [1, 37, 120, 64]
    query = torch.randn(len(seq_lens), heads, dim)
    args = dict(
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=_layouts(kind, seq_lens),
        req_pool_indices=torch.tensor([2, 0, 3, 1]),  # the batch's order is not the pool's
        seq_lens=torch.tensor([seq_lens[i] for i in (2, 0, 3, 1)]),
        scaling=dim**-0.5,
        enable_gqa=gqa,
        causal=False,
    )
    want = original(None, query, torch.zeros_like(query), **args)
    got = decode_attention.decode_forward(None, query, torch.zeros_like(query), **args)
    assert torch.equal(got, want)


def test_a_run_of_slots_is_read_in_place_and_any_other_layout_by_index():
    k_cache, v_cache = torch.randn(64, 2, 4), torch.randn(64, 2, 4)
    run = torch.arange(10, 30, dtype=torch.int32)
    k, v = context_kv(k_cache, v_cache, run)
    assert k.data_ptr() == k_cache[10].data_ptr() and v.data_ptr() == v_cache[10].data_ptr()
    assert torch.equal(k, k_cache[run.long()]) and torch.equal(v, v_cache[run.long()])
    # same first and last slot, one in between swapped: not a run
    odd = run.clone()
    odd[[3, 4]] = odd[[4, 3]]
    k, v = context_kv(k_cache, v_cache, odd)
    assert k.data_ptr() != k_cache[10].data_ptr()
    assert torch.equal(k, k_cache[odd.long()]) and torch.equal(v, v_cache[odd.long()])
    empty = torch.zeros(0, dtype=torch.int32)
    assert context_kv(k_cache, v_cache, empty)[0].shape == (0, 2, 4)


def test_the_hook_targets_the_method_it_replaces():
    from sglang.srt.layers.attention import torch_native_backend

    module, _, attr = decode_attention.TARGET.rpartition(".")
    cls_name = module.rsplit(".", 1)[1]
    assert cls_name == "TorchNativeAttnBackend" and hasattr(
        getattr(torch_native_backend, cls_name), attr
    )
