"""Extend attention on SGLang's CPU backend without the quadratic detour.

SGLang's ``torch_native`` backend (the one CPU serving uses) computes an extend of
``q`` new tokens over a cached prefix of ``p`` tokens by padding the query to all
``p + q`` positions and running causal attention over the full square, then keeping
the last ``q`` rows: O((p + q)^2) per layer instead of O(q (p + q)). A one-token
extend on a 2,000-token context then costs about as much as prefilling it, so prefix
hits save no attention compute, and PDD's extend forward after a handoff (meant to
be nearly free) stalls main decode for hundreds of milliseconds.

This REPLACE hook computes only the ``q`` query rows when they are few against the
context, with the causal mask shifted by the prefix (row i may see keys 0..p+i).
When new tokens are at least half the context (a fresh prefill: all of it) the
square with PyTorch's fused causal kernel is faster than any masked call, so that
case keeps the original's shape. Same result up to float rounding; the cases it
does not cover (cross-attention, encoder offsets, sliding windows) go to the
original.
"""

from __future__ import annotations

from engine_patches.cpu.decode_attention import context_kv, replace, same_dtype, special

TARGET = (
    "sglang.srt.layers.attention.torch_native_backend."
    "TorchNativeAttnBackend._run_sdpa_forward_extend"
)
_original = None


# SGLang's signature, kept whole on purpose (format opt-out).
def extend_forward(
    self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
    extend_prefix_lens, extend_seq_lens, encoder_lens=None, scaling=None, enable_gqa=False,
    causal=False, is_cross_attn=False, sliding_window_size=None,
):  # fmt: skip
    import torch
    from torch.nn.functional import scaled_dot_product_attention

    if special(encoder_lens, is_cross_attn, sliding_window_size):
        return _original(
            self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
            extend_prefix_lens, extend_seq_lens, encoder_lens, scaling, enable_gqa, causal,
            is_cross_attn, sliding_window_size,
        )  # fmt: skip
    query = query.movedim(0, query.dim() - 2)  # [heads, tokens, dim]
    start_q = 0
    for i in range(seq_lens.shape[0]):
        q_len, prefix, kv_len = (
            int(extend_seq_lens[i]),
            int(extend_prefix_lens[i]),
            int(seq_lens[i]),
        )
        q = query[:, start_q : start_q + q_len, :]
        tokens = req_to_token[req_pool_indices[i], :kv_len]
        k, v = same_dtype(q, *context_kv(k_cache, v_cache, tokens))
        if 2 * q_len >= kv_len or not causal:
            # Mostly new tokens (a fresh prefill: all of them): the square with the fused
            # causal kernel costs at most twice the rows needed and beats a masked one.
            padded = q.new_zeros((q.shape[0], kv_len, q.shape[2]))
            padded[:, prefix:, :] = q
            out = scaled_dot_product_attention(
                padded.unsqueeze(0),
                k.unsqueeze(0),
                v.unsqueeze(0),
                enable_gqa=enable_gqa,
                scale=scaling,
                is_causal=causal,
            )[:, :, prefix:, :]
        else:  # a few rows over a long prefix: row i sees keys 0 .. prefix + i
            rows = torch.arange(prefix, prefix + q_len, device=q.device)[:, None]
            mask = torch.arange(kv_len, device=q.device)[None, :] <= rows
            out = scaled_dot_product_attention(
                q.unsqueeze(0),
                k.unsqueeze(0),
                v.unsqueeze(0),
                attn_mask=mask,
                enable_gqa=enable_gqa,
                scale=scaling,
            )
        output[start_q : start_q + q_len] = out.squeeze(0).movedim(query.dim() - 2, 0)
        start_q += q_len
    return output


def register() -> None:
    global _original
    _original = replace(TARGET, extend_forward)
