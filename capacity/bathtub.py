"""The bathtub: throughput and benefit per unit of cost against the prefix-hit ratio,
from the same roofline and profiles as the capacity planner (capacity/plan.py)."""

from __future__ import annotations

import numpy as np

from capacity.plan import Inputs, decode_batch, holds_weights
from capacity.roofline import Batch, step_time

HITS = np.round(np.arange(0.0, 0.995, 0.01), 2)  # the hit ratios a bathtub is drawn at
HIT_PRICE = 0.1  # cached input billed at this share of a miss (PDD.md: 10-25%)


def bathtub(
    x: Inputs, input_tokens: int, output_tokens: int, hits: np.ndarray, hit_price: float = HIT_PRICE
) -> list[dict]:
    """Throughput and benefit per unit of cost against the prefix-hit ratio.

    One request shape (``input_tokens`` in, ``output_tokens`` out) at each hit ratio, on
    site A's chips with prefill and decode capacity in proportion (cost per request =
    chip-seconds of its prefill passes and of its share of a full decode batch). The
    uncached tail is prefilled in chunks: full chunks batched across requests at full
    efficiency, the last partial ("tail") chunk alone, since it cannot be batched with
    other requests' chunks, at the cost of a pass that reads the weights for few
    tokens. Just past each multiple of the chunk, throughput drops.

    Benefit = revenue / cost, cached input billed at ``hit_price`` of a miss. The
    valley: raising the hit ratio cuts revenue at once (hits are billed cheaply) but
    cuts cost less, because every uncached token attends over a longer cached context;
    only near full hit does the cost fall fast enough to climb out.
    """
    a = x.devices["A"]
    chips = min(c for c in x.spec.chips_per_instance if holds_weights(a, x.model, c))
    chunk = x.spec.chunk_tokens
    b, t = decode_batch(
        a, x.model, chips, input_tokens + output_tokens / 2, x.itl_s, x.spec.kv_headroom
    )
    decode_s = output_tokens * t / max(b, 1)  # instance-seconds per request
    out = []
    for h in hits:
        cached = int(h * input_tokens)
        uncached = max(input_tokens - cached, 1)
        full, tail = divmod(uncached, chunk)
        prefill_s = sum(
            step_time(Batch((chunk,), (cached + i * chunk,)), a.chip, x.model, chips).seconds
            for i in range(full)
        )
        if tail:
            start = cached + full * chunk
            prefill_s += step_time(Batch((tail,), (start,)), a.chip, x.model, chips).seconds
        cost = (prefill_s + decode_s) * chips * a.price / 3600  # per request
        revenue = uncached + hit_price * cached + output_tokens  # in miss-token prices
        out.append(
            {
                "hit": float(h),
                "tail_tokens": tail,
                "prefill_s": prefill_s,
                "throughput_per_cost": 1 / cost,
                "benefit_per_cost": revenue / cost,
            }
        )
    return out
