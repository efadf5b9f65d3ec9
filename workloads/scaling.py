"""Shrink a real trace to what a small testbed can serve, keeping its sharing exact
(and take a window of it: :func:`window`).

A trace's prefix sharing lives in its block ids: equal ids at equal positions are
equal tokens. Scaling keeps every id and shrinks the block instead (``block_tokens``
x ``length_scale``, which must come out whole), so two requests share exactly the
blocks they shared before and every hit ratio is unchanged; only the context cap
(``max_context_tokens``, applied after scaling by dropping trailing blocks) can cut
one. Output lengths scale by ``output_scale``, arrival times and think times by
``time_scale``. What was done is recorded in the trace's metadata (``length_scale``
tells the capacity planner the trace's full size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from workloads.trace import Request, Trace


@dataclass(frozen=True)
class Scaling:
    length_scale: float = 1.0
    output_scale: float | None = None  # default: length_scale
    time_scale: float = 1.0
    max_context_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("length_scale", "time_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value}")
        if self.output_scale is not None and not (
            math.isfinite(self.output_scale) and self.output_scale > 0
        ):
            raise ValueError(f"output_scale must be a positive number, got {self.output_scale}")
        if self.max_context_tokens is not None and self.max_context_tokens < 1:
            raise ValueError(f"max_context_tokens must be >= 1, got {self.max_context_tokens}")

    @property
    def identity(self) -> bool:
        return self == Scaling() or self == Scaling(output_scale=1.0)


def scale_trace(trace: Trace, s: Scaling) -> Trace:
    if s.identity:
        return trace
    block = trace.block_tokens * s.length_scale
    if abs(block - round(block)) > 1e-9 or round(block) < 1:
        raise ValueError(
            f"length_scale {s.length_scale} makes blocks of {block:g} tokens from "
            f"{trace.block_tokens}; pick one that gives whole tokens, so shared blocks stay "
            f"shared (e.g. {_whole_scales(trace.block_tokens)})"
        )
    block = round(block)
    out_scale = s.length_scale if s.output_scale is None else s.output_scale
    cap_blocks = None if s.max_context_tokens is None else s.max_context_tokens // block
    if cap_blocks is not None and cap_blocks < 1:
        raise ValueError(f"max_context_tokens {s.max_context_tokens} is under one block ({block})")
    requests, capped = [], 0
    for r in trace.requests:
        n_in = _scaled_length(r, trace.block_tokens, block)
        hash_ids, output_ids = r.hash_ids, r.output_hash_ids
        if cap_blocks is not None and n_in > cap_blocks * block:
            hash_ids, n_in, capped = hash_ids[:cap_blocks], cap_blocks * block, capped + 1
        requests.append(
            replace(
                r,
                hash_ids=hash_ids,
                input_length=n_in,
                output_length=max(1, round(r.output_length * out_scale)),
                output_hash_ids=output_ids,
                arrival_s=None if r.arrival_s is None else r.arrival_s * s.time_scale,
                think_time_s=None if r.think_time_s is None else r.think_time_s * s.time_scale,
            )
        )
    metadata = {
        **trace.metadata,
        "length_scale": trace.metadata.get("length_scale", 1.0) * s.length_scale,
        "output_scale": out_scale,
        "time_scale": trace.metadata.get("time_scale", 1.0) * s.time_scale,
        "max_context_tokens": s.max_context_tokens,
        "capped_requests": capped,
        "block_tokens_before": trace.block_tokens,
    }
    return Trace(trace.name, block, requests, metadata)


def window(trace: Trace, first: int) -> Trace:
    """The trace from its ``first`` request on (in the file's order), as a trace of its
    own: arrivals counted from the window's first, and a session begun before ``first``
    left out whole (its later turns' prompts hold the earlier turns' exchange). Its
    prefix sharing is what the window's requests share among themselves: a hit on a
    block only an earlier request brought is gone. (Mooncake's synthetic trace owes its
    42% mean hit to reuse across thousands of requests: any 120 of its first 3,000 share
    1-10% among themselves, its last few hundred 36-60%.)"""
    if first < 0:
        raise ValueError(f"first_request must be >= 0, got {first}")
    if first == 0:
        return trace
    if first >= len(trace.requests):
        raise ValueError(f"first_request {first}: the trace has {len(trace.requests)} requests")
    before = {r.session_id for r in trace.requests[:first]}
    kept = [r for r in trace.requests[first:] if r.session_id not in before]
    if not kept:
        raise ValueError(f"first_request {first}: every later request's session began before")
    start = min((r.arrival_s for r in kept if r.arrival_s is not None), default=None)
    if start is not None:
        kept = [
            r if r.arrival_s is None else replace(r, arrival_s=r.arrival_s - start) for r in kept
        ]
    left_out = len(trace.requests) - first - len(kept)
    metadata = {**trace.metadata, "first_request": first, "window_left_out": left_out}
    return Trace(trace.name, trace.block_tokens, kept, metadata)


def _scaled_length(r: Request, old_block: int, new_block: int) -> int:
    """The same share of the last block (full blocks stay full)."""
    full = len(r.hash_ids) - 1
    last = r.input_length - full * old_block  # tokens in the last block, 1..old_block
    if not r.hash_ids or not 0 < last <= old_block:
        return max(1, round(r.input_length * new_block / old_block))
    return full * new_block + max(1, round(last * new_block / old_block))


def _whole_scales(block_tokens: int) -> str:
    scales = [f"1/{d}" for d in (2, 4, 8, 16, 32, 64) if block_tokens % d == 0]
    return ", ".join(scales[:4]) or "1"
