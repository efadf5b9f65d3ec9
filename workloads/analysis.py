"""Hit-ratio and length analysis of a trace: what a prefix cache could save.

Per request, in arrival order, the hit is the run of leading blocks already seen
(cumulative prefix blocks, as in Mooncake's hashes) — under an infinite cache, or an
LRU cache of a given number of blocks. Hit ratio = hit tokens / input tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from workloads.trace import Request, Trace

# PDD's seven bins of the per-request hit ratio (percent); the last is exactly 100%.
HIT_BINS = ("0-90", "90-95", "95-97", "97-98", "98-99", "99-100", "100")
_EDGES = (0.90, 0.95, 0.97, 0.98, 0.99, 1.0)


def arrival_order(trace: Trace) -> list[Request]:
    """Open-loop arrival where known; otherwise session turn order, sessions interleaved."""
    if all(r.arrival_s is not None for r in trace.requests):
        return sorted(trace.requests, key=lambda r: r.arrival_s)
    return sorted(trace.requests, key=lambda r: (r.turn, r.session_id))


def hit_ratios(
    trace: Trace,
    capacity_blocks: int | None = None,
    unit: str = "tokens",
    include_outputs: bool = True,
) -> np.ndarray:
    """Per request (in arrival order): hit tokens / input tokens.

    ``unit="blocks"`` gives hit blocks / prompt blocks instead (how Mooncake's own
    trace statistics are computed; it differs only through the partial last block).
    ``include_outputs``: after a request, the cache also holds the blocks standing for
    its output (as a server's prefix cache holds the whole exchange).
    """
    if unit not in ("tokens", "blocks"):
        raise ValueError(f"unit must be tokens or blocks, got {unit!r}")
    cache: OrderedDict[int, None] = OrderedDict()
    out = []
    for r in arrival_order(trace):
        hit_blocks = 0
        for b in r.hash_ids:
            if b not in cache:
                break
            hit_blocks += 1
        for b in r.hash_ids + (r.output_hash_ids if include_outputs else ()):
            cache[b] = None
            cache.move_to_end(b)
        if capacity_blocks is not None:
            while len(cache) > capacity_blocks:
                cache.popitem(last=False)
        if unit == "blocks":
            out.append(hit_blocks / len(r.hash_ids) if r.hash_ids else 0.0)
        else:
            out.append(min(hit_blocks * trace.block_tokens, r.input_length) / r.input_length)
    return np.array(out)


def hit_bin(ratio: float) -> str:
    if ratio >= 1.0:
        return HIT_BINS[-1]
    for name, edge in zip(HIT_BINS, _EDGES, strict=False):
        if ratio < edge:
            return name
    return HIT_BINS[-2]


@dataclass
class TraceStats:
    requests: int
    sessions: int
    hit_mean: float
    hit_token_weighted: float
    share_above_95: float
    share_no_hit: float
    anomalous_share: float
    bins: dict[str, float]
    input_percentiles: dict[str, float]
    output_percentiles: dict[str, float]
    capacity_blocks: int | None

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def stats(trace: Trace, capacity_blocks: int | None = None) -> TraceStats:
    ordered = arrival_order(trace)
    ratios = hit_ratios(trace, capacity_blocks)
    inputs = np.array([r.input_length for r in ordered], dtype=float)
    outputs = np.array([r.output_length for r in ordered], dtype=float)
    bins = {name: 0 for name in HIT_BINS}
    for x in ratios:
        bins[hit_bin(float(x))] += 1
    n = max(len(ratios), 1)
    pct = (50, 90, 99)
    return TraceStats(
        requests=len(ordered),
        sessions=len({r.session_id for r in ordered}),
        hit_mean=float(ratios.mean()) if len(ratios) else 0.0,
        hit_token_weighted=float((ratios * inputs).sum() / inputs.sum()) if len(ratios) else 0.0,
        share_above_95=float((ratios > 0.95).mean()) if len(ratios) else 0.0,
        share_no_hit=float((ratios == 0).mean()) if len(ratios) else 0.0,
        anomalous_share=sum(r.anomalous for r in ordered) / n,
        bins={k: v / n for k, v in bins.items()},
        input_percentiles={f"p{p}": float(np.percentile(inputs, p)) for p in pct}
        | {"mean": float(inputs.mean())},
        output_percentiles={f"p{p}": float(np.percentile(outputs, p)) for p in pct}
        | {"mean": float(outputs.mean())},
        capacity_blocks=capacity_blocks,
    )
