"""The CPU extend-attention replacement against SGLang's own torch_native extend, on
random tensors: same output for prefix / no prefix, GQA, several requests per batch."""

from __future__ import annotations

import pytest
import torch

from engine_patches.cpu import extend_attention


@pytest.mark.parametrize(
    "prefixes, extends", [([0], [7]), ([40, 0, 5], [1, 9, 30]), ([90, 60], [3, 60])]
)
@pytest.mark.parametrize("gqa", [False, True])
def test_extend_attention_matches_sglangs_torch_native(prefixes, extends, gqa):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    original = TorchNativeAttnBackend._run_sdpa_forward_extend
    torch.manual_seed(0)
    heads, kv_heads, dim, pool = 8, (2 if gqa else 8), 16, 512
    k_cache, v_cache = torch.randn(pool, kv_heads, dim), torch.randn(pool, kv_heads, dim)
    seq_lens = [p + e for p, e in zip(prefixes, extends, strict=True)]
    req_to_token = torch.zeros(len(seq_lens), 128, dtype=torch.long)
    slots = torch.randperm(pool)  # each request's tokens live in scattered pool slots
    used = 0
    for i, n in enumerate(seq_lens):
        req_to_token[i, :n] = slots[used : used + n]
        used += n
    query = torch.randn(sum(extends), heads, dim)
    args = dict(
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=req_to_token,
        req_pool_indices=torch.arange(len(seq_lens)),
        seq_lens=torch.tensor(seq_lens),
        extend_prefix_lens=torch.tensor(prefixes),
        extend_seq_lens=torch.tensor(extends),
        scaling=dim**-0.5,
        enable_gqa=gqa,
        causal=True,
    )
    want = original(None, query, torch.zeros_like(query), **args)
    got = extend_attention.extend_forward(None, query, torch.zeros_like(query), **args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_hook_targets_the_method_it_replaces():
    from sglang.srt.layers.attention import torch_native_backend

    module, _, attr = extend_attention.TARGET.rpartition(".")
    cls_name = module.rsplit(".", 1)[1]
    assert cls_name == "TorchNativeAttnBackend" and hasattr(
        getattr(torch_native_backend, cls_name), attr
    )
