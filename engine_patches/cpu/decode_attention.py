"""Decode attention on SGLang's CPU backend without its costly gather.

SGLang's ``torch_native`` decode reads each request's context keys and values out of
the KV pool with advanced indexing (``k_cache[tokens]``): a copy of the whole context,
per layer, per request, per step. On one core, for a 5,000-token context of the default
tiny model (4 KV heads of 64), that copy takes about 1.9 ms for the keys and as much
for the values, against 1.6 ms for the attention itself; py-spy on relay decode under
the default load found those two lines in 40% of its busy samples. On default's CPU
plan relay decode shares prefill's core, so every millisecond of it is prefill's too.

This REPLACE hook reads the same rows: as a view where a request's context sits in one
ascending run of pool slots (nothing copied), else with ``index_select`` (the same copy,
about 3x faster than advanced indexing). The keys come in the same order with the
same values, so the output is SGLang's bit for bit. Cross-attention, encoder offsets
and sliding windows go to the original. :func:`context_kv` serves the extend hook
(:mod:`engine_patches.cpu.extend_attention`) as well.
"""

from __future__ import annotations

TARGET = (
    "sglang.srt.layers.attention.torch_native_backend."
    "TorchNativeAttnBackend._run_sdpa_forward_decode"
)
_original = None


def context_kv(k_cache, v_cache, tokens):
    """A request's keys and values, ``[tokens, heads, dim]`` each, in ``tokens``' order:
    slices of the caches where the slots are one ascending run, else gathered."""
    n = tokens.shape[0]
    if n and int(tokens[-1]) - int(tokens[0]) == n - 1 and bool((tokens.diff() == 1).all()):
        first = int(tokens[0])
        return k_cache[first : first + n], v_cache[first : first + n]
    return k_cache.index_select(0, tokens), v_cache.index_select(0, tokens)


def special(encoder_lens, is_cross_attn, sliding_window_size) -> bool:
    """Cases the CPU hooks leave to SGLang: encoder offsets, cross-attention, windows."""
    windowed = sliding_window_size is not None and sliding_window_size > -1
    return encoder_lens is not None or is_cross_attn or windowed


def same_dtype(q, k, v):
    """``k`` and ``v`` as ``[heads, tokens, dim]`` in ``q``'s dtype (SDPA wants one)."""
    k, v = k.movedim(0, q.dim() - 2), v.movedim(0, q.dim() - 2)
    if not (q.dtype == k.dtype == v.dtype):
        k, v = k.to(q.dtype), v.to(q.dtype)
    return k, v


# SGLang's signature, kept whole on purpose (format opt-out).
def decode_forward(
    self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
    encoder_lens=None, scaling=None, enable_gqa=False, causal=False, is_cross_attn=False,
    sliding_window_size=None,
):  # fmt: skip
    from torch.nn.functional import scaled_dot_product_attention

    if special(encoder_lens, is_cross_attn, sliding_window_size):
        return _original(
            self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
            encoder_lens, scaling, enable_gqa, causal, is_cross_attn, sliding_window_size,
        )  # fmt: skip
    query = query.movedim(0, query.dim() - 2)  # [heads, tokens, dim]
    rows, lens = req_pool_indices.tolist(), seq_lens.tolist()
    for i, (row, kv_len) in enumerate(zip(rows, lens, strict=True)):
        q = query[:, i : i + 1, :]
        k, v = same_dtype(q, *context_kv(k_cache, v_cache, req_to_token[row, :kv_len]))
        out = scaled_dot_product_attention(
            q.unsqueeze(0),
            k.unsqueeze(0),
            v.unsqueeze(0),
            enable_gqa=enable_gqa,
            scale=scaling,
            is_causal=causal,
        )
        output[i : i + 1] = out.squeeze(0).movedim(query.dim() - 2, 0)
    return output


def replace(target: str, hook):
    """Register ``hook`` in place of the backend method ``target`` names; the original."""
    from sglang.srt.layers.attention import torch_native_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    original = getattr(torch_native_backend.TorchNativeAttnBackend, target.rsplit(".", 1)[1])
    HookRegistry.register(target, hook, HookType.REPLACE)
    return original


def register() -> None:
    global _original
    _original = replace(TARGET, decode_forward)
